/**
 * aiflowd's settings as an operator meets them: a bad setting, a non-loopback address without
 * tokens, --help and --version, each by running `bin/aiflowd.js` (dist/) as a process of its own, so
 * this file is in the slow tier; config.test.ts parses the same settings in process.
 */
import { readFileSync } from "node:fs";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";

const run = promisify(execFile);
const cli = (args: string[], env: Record<string, string> = {}) =>
  run(process.execPath, ["bin/aiflowd.js", ...args], { env: { PATH: process.env.PATH, NO_COLOR: "1", ...env } }).then(
    (r) => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
    (e: { code: number; stdout: string; stderr: string }) => ({ code: e.code, stdout: e.stdout, stderr: e.stderr }),
  );

describe("config", () => {
  it("aiflowd exits 2 with a one-line message naming a bad setting", async () => {
    const r = await cli(["--listen", "nowhere"]);
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
    expect(r.stderr).toContain("--listen");
    const e = await cli([], { AIFLOW_HEARTBEAT_INTERVAL: "often" });
    expect(e.code).toBe(2);
    expect(e.stderr).toContain("AIFLOW_HEARTBEAT_INTERVAL");
  });

  it("aiflowd refuses to serve a non-loopback address without tokens (exit 2)", async () => {
    const r = await cli(["--listen", "0.0.0.0:0", "--database-url", "postgres://127.0.0.1:1/none"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("--listen");
  });

  it("aiflowd --help lists every setting with its env var", async () => {
    const r = await cli(["--help"]);
    expect(r.code).toBe(0);
    for (const s of [
      "--listen",
      "AIFLOW_LISTEN",
      "--database-url",
      "DATABASE_URL",
      "--data-dir",
      "--token",
      "AIFLOW_TOKENS",
      "--table-prefix",
      "127.0.0.1:7400",
    ])
      expect(r.stdout).toContain(s);
  });

  it("aiflowd --version prints the package's version and exits 0", async () => {
    const pkg = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version: string };
    const r = await cli(["--version"]);
    expect(r).toMatchObject({ code: 0, stdout: `aiflowd ${pkg.version}\n` });
  });
});
