/**
 * The drain selector's version_below and the dry run (issue 52 item 7), by RPC and through aiflowctl
 * in a child process: a version that is not a version is refused, an agent whose version is not one
 * is never matched (and is named), and a dry run answers the agents a drain would hit, changing
 * nothing. Real daemon, real Postgres; the agents are connect clients that never heartbeat.
 */
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, it, vi } from "vitest";
import { Code } from "@connectrpc/connect";
import type { Daemon } from "../src/daemon.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { AgentSummary, OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { TOKENS } from "./support/daemon.js";
import { refusal, type Session, useTestDaemon } from "./support/kit.js";
import { opsSession, OpsTestAgent } from "./support/ops.js";

const CLI = fileURLToPath(new URL("../bin/aiflowctl.js", import.meta.url));
/** Only matters when something hangs (node and tsx start in the child: seconds on a busy machine). */
const CLI_TIMEOUT_MS = 60_000;
vi.setConfig({ testTimeout: 120_000 });

const fx = useTestDaemon({ label: "drainsel", config: { instanceId: "drain-sel", heartbeatInterval: 3_600_000 } });
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

const names = (agents: readonly AgentSummary[]) => agents.map((a) => a.name);
const statuses = async (pool: string) => {
  const res = await ops.client.listAgents({ tags: { pool } }, ops.call);
  return Object.fromEntries(res.agents.map((a) => [a.name, AgentStatus[a.status]]));
};

describe("version_below", () => {
  it("refuses a version that is not a version, draining nothing", async () => {
    // The fleet: sim-1.1.0 once read as 0.0.0-sim and drained the example-1.0.0 workers.
    await fleet("v-refuse", ["example-1.0.0", "1.0.0"]);
    for (const versionBelow of ["sim-1.1.0", "latest", "1.x"]) {
      const e = await refusal(ops.client.drainAgent({ selector: { tags: { pool: "v-refuse" }, versionBelow } }, ops.call));
      expect(e.code).toBe(Code.InvalidArgument);
      expect(e.rawMessage).toContain(`selector.version_below: '${versionBelow}' is not a version`);
      expect(e.rawMessage).toContain("agents whose own version is not one are never matched");
    }
    expect(await statuses("v-refuse")).toEqual({ "v-refuse-0": "ACTIVE", "v-refuse-1": "ACTIVE" });
  });

  it("never matches an agent whose version is not one (or is unset), and names it", async () => {
    await fleet("v-skip", ["example-1.0.0", "1.0.0", "", "1.1.0-rc.1", "1.1.0", "v1.0.5"]);
    const res = await ops.client.drainAgent({ selector: { tags: { pool: "v-skip" }, versionBelow: "1.1" } }, ops.call);
    expect(names(res.agents)).toEqual(["v-skip-1", "v-skip-3", "v-skip-5"]);
    expect(res.versionNotComparable).toEqual(["v-skip-0", "v-skip-2"]);
    expect(await statuses("v-skip")).toEqual({ "v-skip-0": "ACTIVE", "v-skip-1": "DRAINING", "v-skip-2": "ACTIVE", "v-skip-3": "DRAINING", "v-skip-4": "ACTIVE", "v-skip-5": "DRAINING" });
  });
});

describe("dry_run", () => {
  it("answers the agents a selector or a name would drain, and changes nothing", async () => {
    await fleet("dry", ["1.0.0", "2.0.0", "nightly"]);
    const res = await ops.client.drainAgent({ selector: { tags: { pool: "dry" }, versionBelow: "2.0.0" }, dryRun: true, deadline: { seconds: 60n } }, ops.call);
    expect(names(res.agents)).toEqual(["dry-0"]);
    expect(res.agents[0]).toMatchObject({ status: AgentStatus.ACTIVE, agentVersion: "1.0.0" });
    expect(res.agents[0]?.drain).toBeUndefined();
    expect(res.versionNotComparable).toEqual(["dry-2"]);
    const byName = await ops.client.drainAgent({ name: "dry-1", dryRun: true }, ops.call);
    expect(names(byName.agents)).toEqual(["dry-1"]);
    expect(await statuses("dry")).toEqual({ "dry-0": "ACTIVE", "dry-1": "ACTIVE", "dry-2": "ACTIVE" });

    // The drain's own refusals hold for a dry run too.
    expect((await refusal(ops.client.drainAgent({ name: "no-such-agent", dryRun: true }, ops.call))).code).toBe(Code.NotFound);
    expect((await refusal(ops.client.drainAgent({ selector: { versionBelow: "sim-1.1.0" }, dryRun: true }, ops.call))).code).toBe(Code.InvalidArgument);
  });
});

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
