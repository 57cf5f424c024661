/**
 * `aiflowctl drain` with the selector's version_below and --dry-run (issue 52 item 7), as an operator
 * runs it (`node bin/aiflowctl.js …` in a child process, so this file is in the slow tier): the dry
 * run lists whom a drain would hit and whom it cannot compare, changing nothing; a bad version exits
 * 2; the real drain names on stderr whom it left alone. ops-drain-selector.test.ts has the same by
 * RPC. Real daemon, real Postgres; the agents are connect clients that never heartbeat.
 */
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, it, vi } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { TOKENS } from "./support/daemon.js";
import { type Session, useTestDaemon } from "./support/kit.js";
import { opsSession, OpsTestAgent } from "./support/ops.js";

const CLI = fileURLToPath(new URL("../bin/aiflowctl.js", import.meta.url));
/** Only matters when something hangs (node and tsx start in the child: seconds on a busy machine). */
const CLI_TIMEOUT_MS = 60_000;
vi.setConfig({ testTimeout: 120_000 });

const fx = useTestDaemon({ label: "drainselcli", config: { instanceId: "drain-sel-cli", heartbeatInterval: 3_600_000 } });
let daemon: Daemon;
let ops: Session<typeof OpsService>;

beforeAll(() => {
  daemon = fx.daemon;
  ops = fx.closers.add(opsSession(daemon.address));
});

/** Runs aiflowctl to completion. */
function ctl(args: readonly string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const env: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1" };
  delete env.AIFLOW_ADDRESS;
  delete env.AIFLOW_TOKEN;
  return new Promise((resolve, reject) =>
    execFile(process.execPath, [CLI, "--address", daemon.address, "--token", TOKENS.ops, ...args], { env, timeout: CLI_TIMEOUT_MS }, (err, stdout, stderr) => {
      if (err && typeof err.code !== "number") return reject(Object.assign(err, { stdout, stderr }));
      resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
    }),
  );
}

/** Registers agents of `pool` at the given versions ("" for none), named `${pool}-${i}`. */
async function fleet(pool: string, versions: readonly string[]): Promise<string[]> {
  const agents = await Promise.all(
    versions.map((version, i) => OpsTestAgent.register(daemon.address, `${pool}-${i}`, { tenants: [pool], engineKinds: ["k"], version, tags: { pool } })),
  );
  for (const a of agents) fx.closers.add(a);
  return agents.map((a) => a.name);
}

const statuses = async (pool: string) => {
  const res = await ops.client.listAgents({ tags: { pool } }, ops.call);
  return Object.fromEntries(res.agents.map((a) => [a.name, AgentStatus[a.status]]));
};

describe("aiflowctl drain", () => {
  it("--dry-run lists the agents it would drain (a table, or --json) and the ones it cannot compare; a bad --version-below exits 2", async () => {
    await fleet("ctl-dry", ["1.0.0", "1.2.0", "example-1.0.0"]);
    const [text, json, bad, both] = await Promise.all([
      ctl(["drain", "--tag", "pool=ctl-dry", "--version-below", "1.1.0", "--dry-run"]),
      ctl(["drain", "--tag", "pool=ctl-dry", "--version-below", "1.1.0", "--dry-run", "--json"]),
      ctl(["drain", "--tag", "pool=ctl-dry", "--version-below", "sim-1.1.0"]),
      ctl(["drain", "--tag", "pool=ctl-dry", "--dry-run", "--wait"]),
    ]);
    expect(text.code).toBe(0);
    const lines = text.stdout.trimEnd().split("\n");
    expect(lines[0]).toBe("would drain 1 agent(s):");
    expect(lines[1]).toMatch(/^NAME +STATUS +LAST SEEN +IN FLIGHT +SLOTS +VERSION/);
    expect(lines[2]).toMatch(/^ctl-dry-0 +active +.* 1\.0\.0 /);
    expect(lines.slice(3)).toEqual(["not comparable with 1.1.0 (their version is not a version), left alone: ctl-dry-2"]);

    expect(json.code).toBe(0);
    const parsed = JSON.parse(json.stdout) as { agents: { name: string; status: string }[]; versionNotComparable: string[] };
    expect(parsed.agents.map((a) => [a.name, a.status])).toEqual([["ctl-dry-0", "AGENT_STATUS_ACTIVE"]]);
    expect(parsed.versionNotComparable).toEqual(["ctl-dry-2"]);

    expect(bad.code).toBe(2);
    expect(bad.stdout).toBe("");
    expect(bad.stderr).toContain("--version-below: 'sim-1.1.0' is not a version");
    expect(both.code).toBe(2);
    expect(both.stderr).toContain("--dry-run drains nothing");
    expect(await statuses("ctl-dry")).toEqual({ "ctl-dry-0": "ACTIVE", "ctl-dry-1": "ACTIVE", "ctl-dry-2": "ACTIVE" });

    // The real drain says on stderr whom it left alone.
    const real = await ctl(["drain", "--tag", "pool=ctl-dry", "--version-below", "1.1.0"]);
    expect(real.code).toBe(0);
    expect(real.stdout).toMatch(/^draining ctl-dry-0: /);
    expect(real.stderr).toBe("aiflowctl: not comparable with 1.1.0 (their version is not a version), left alone: ctl-dry-2\n");
  });
});
