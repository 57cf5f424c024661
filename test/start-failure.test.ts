/**
 * A daemon that cannot finish starting exits, saying why: what it had started before the failing
 * step (the LISTEN connection, wake-ups, heartbeat flushes, the engines' loops) is stopped again.
 * Left running, those loops kept the process alive and logging after "aiflowd failed", so a
 * supervisor never saw it die. The failing step here is a triggers file that does not check,
 * which is read once the engines are up.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { describe, expect, it } from "vitest";
import { databaseUrl } from "./support/database-url.js";
import { useTestDb } from "./support/kit.js";

describe("a daemon whose start fails part-way", () => {
  const fx = useTestDb("startfail");

  it("stops what it started and exits with the error", { timeout: 60_000 }, async () => {
    const dir = mkdtempSync(join(tmpdir(), "aiflow-startfail-"));
    const file = join(dir, "triggers.json");
    writeFileSync(
      file,
      JSON.stringify({ triggers: [{ tenant: "t", name: "x", type: "cron", action: "start", definition_id: "d", schedule: "0 2 * *", owner: "o" }] }),
    );
    const child = spawn(
      process.execPath,
      [
        "bin/aiflowd.js",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--http-listen",
        "off",
        "--schema",
        fx.db.schema,
        "--database-url",
        databaseUrl(),
        "--token",
        "ops:ops-token-startfail",
        "--triggers-file",
        file,
      ],
      { env: { PATH: process.env.PATH, NO_COLOR: "1" }, stdio: ["ignore", "pipe", "pipe"] },
    );
    const lines: string[] = [];
    createInterface({ input: child.stdout! }).on("line", (l) => lines.push(l));
    createInterface({ input: child.stderr! }).on("line", (l) => lines.push(l));
    // The test's own timeout is the bound: before the fix the process never exited.
    const code = await new Promise<number | null>((resolve) => child.once("exit", (c) => resolve(c)));
    expect(code, lines.join("\n")).not.toBe(0);
    expect(lines.join("\n")).toMatch(/schedule: '0 2 \* \*' is not five fields/);
    expect(lines.some((l) => l.includes("aiflowd serving gRPC"))).toBe(false);
  });
});
