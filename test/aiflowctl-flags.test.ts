/**
 * aiflowctl's flags where a global one and a command's share a name, and its output into a pipe
 * that closes early: `node bin/aiflowctl.js …` in a child process against a real daemon.
 * - `--version` before any command (or with no command) prints aiflowctl's version; after a command
 *   that has its own --version (agents), it is that command's flag (issue 52 item 10: `agents
 *   --version V` printed the CLI's version, so the documented filter was unreachable).
 * - `aiflowctl … | head`: a reader that stops reading ends aiflowctl quietly with status 0, as other
 *   Unix tools do, not with an EPIPE stack trace.
 */
import { execFile, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, it, vi } from "vitest";
import { TOKENS } from "./support/daemon.js";
import { useTestDaemon } from "./support/kit.js";
import { OpsTestAgent } from "./support/ops.js";

const CLI = fileURLToPath(new URL("../bin/aiflowctl.js", import.meta.url));
const CLI_TIMEOUT_MS = 60_000;
vi.setConfig({ testTimeout: 120_000 });
const fx = useTestDaemon({ label: "ctlflags", config: { instanceId: "ctl-flags", sweepInterval: 3_600_000, heartbeatInterval: 3_600_000 } });
const VERSION = (JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version: string }).version;

interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

const env = () => {
  const e: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1" };
  for (const k of ["AIFLOW_ADDRESS", "AIFLOW_TOKEN"]) delete e[k];
  return e;
};

function ctl(args: readonly string[]): Promise<Result> {
  return new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      [CLI, "--address", fx.address, "--token", TOKENS.ops, ...args],
      { env: env(), timeout: CLI_TIMEOUT_MS },
      (err, stdout, stderr) => {
        if (err && typeof err.code !== "number") return reject(Object.assign(err, { stdout, stderr }));
        resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
      },
    );
  });
}

beforeAll(async () => {
  for (const [name, version] of [
    ["flag-old", "1.0.0"],
    ["flag-new", "2.0.0"],
  ] as const)
    fx.closers.add(await OpsTestAgent.register(fx.address, name, { tenants: ["t"], engineKinds: ["k"], version }));
});

describe("--version", () => {
  it("alone, or before a command, prints aiflowctl's version and exits 0", async () => {
    for (const args of [["--version"], ["--version", "agents"], ["--json", "--version"]])
      expect(await ctl(args), args.join(" ")).toEqual({ code: 0, stdout: `aiflowctl ${VERSION}\n`, stderr: "" });
  });

  it("after agents, filters by agent version: agents --version V lists only agents at V", async () => {
    const r = await ctl(["agents", "--version", "1.0.0", "--json"]);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    expect((JSON.parse(r.stdout) as { agents: { name: string }[] }).agents.map((a) => a.name)).toEqual(["flag-old"]);
    const eq = await ctl(["agents", "--version=2.0.0", "--json"]);
    expect((JSON.parse(eq.stdout) as { agents: { name: string }[] }).agents.map((a) => a.name)).toEqual(["flag-new"]);
  });

  it("after agents without a value, is a usage error (exit 2), not the CLI's version", async () => {
    expect(await ctl(["agents", "--version"])).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: --version needs a value\n" });
  });
});

describe("a pipe that closes early", () => {
  it("ends aiflowctl quietly with status 0 (no EPIPE stack trace)", async () => {
    // The reader is gone before aiflowctl writes a byte: every write fails with EPIPE, as `| head` does after its lines.
    const child = spawn(process.execPath, [CLI, "--help"], { env: env(), stdio: ["ignore", "pipe", "pipe"] });
    child.stdout.destroy();
    let stderr = "";
    child.stderr.on("data", (b: Buffer) => (stderr += b.toString()));
    const timer = setTimeout(() => child.kill(), CLI_TIMEOUT_MS);
    const code = await new Promise<number | null>((resolve) => child.on("close", (c) => resolve(c)));
    clearTimeout(timer);
    expect({ code, stderr }).toEqual({ code: 0, stderr: "" });
  });
});
