/**
 * The aiflowd command's token and TLS settings as an operator meets them: `aiflowd token new` and a
 * daemon process that re-reads its TLS files on SIGHUP. Each runs `bin/aiflowd.js` (dist/) as a
 * process of its own, so this file is in the slow tier; tls-config.test.ts checks the same settings
 * in process.
 */
import { execFile, spawn } from "node:child_process";
import { copyFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { tokenDigest } from "../src/domain/tokens.js";
import { databaseUrl } from "./support/database-url.js";
import { until, useTestDb } from "./support/kit.js";
import { Pki } from "./support/pki.js";

describe("the aiflowd command", () => {
  const fx = useTestDb("tls_cli");

  it("prints a token and its entry with `aiflowd token new`, with --help and --version", async () => {
    const run = promisify(execFile);
    const { stdout } = await run(process.execPath, ["bin/aiflowd.js", "token", "new", "ops", "--name", "oncall", "--json"]);
    const { token, entry } = JSON.parse(stdout) as { token: string; entry: { sha256: string } };
    expect(entry).toEqual({ role: "ops", sha256: tokenDigest(token), name: "oncall" });
    expect((await run(process.execPath, ["bin/aiflowd.js", "token", "--help"])).stdout).toMatch(/aiflowd token new ROLE/);
    expect((await run(process.execPath, ["bin/aiflowd.js", "token", "--version"])).stdout).toMatch(/^aiflowd \d/);
  });

  it("re-reads its TLS files on SIGHUP, and a SIGHUP does not stop it", { timeout: 60_000 }, async () => {
    const pki = Pki.create();
    const dir = mkdtempSync(join(tmpdir(), "aiflow-sighup-"));
    const live = { cert: join(dir, "server.crt"), key: join(dir, "server.key") };
    const first = pki.server("first");
    copyFileSync(first.cert, live.cert);
    copyFileSync(first.key, live.key);
    const child = spawn(
      process.execPath,
      [
        "bin/aiflowd.js",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "off",
        "--tls-cert",
        live.cert,
        "--tls-key",
        live.key,
        "--schema",
        fx.db.schema,
        "--database-url",
        databaseUrl(),
        "--token",
        "ops:ops-token-sighup",
      ],
      {
        env: { PATH: process.env.PATH, NO_COLOR: "1" },
        stdio: ["ignore", "pipe", "pipe"],
      },
    );
    const lines: string[] = [];
    createInterface({ input: child.stdout! }).on("line", (l) => lines.push(l));
    createInterface({ input: child.stderr! }).on("line", (l) => lines.push(l));
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    try {
      await until(
        `the daemon serves (it said: ${lines.join(" | ")})`,
        () => lines.some((l) => l.includes("aiflowd serving gRPC")) || child.exitCode !== null,
        30_000,
      );
      expect(child.exitCode, lines.join("\n")).toBeNull();
      child.kill("SIGHUP");
      // Unchanged files: nothing to do, and the process is still there to take the next one.
      const second = pki.server("second");
      copyFileSync(second.cert, live.cert);
      copyFileSync(second.key, live.key);
      child.kill("SIGHUP");
      await until("it reloads", () => lines.some((l) => l.includes("TLS certificate reloaded")), 30_000);
      expect(child.exitCode).toBeNull();
      child.kill("SIGTERM");
      expect(await exited).toBe(0);
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
      pki.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
