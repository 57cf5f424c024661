/**
 * The drain selector's version_below and the dry run (issue 52 item 7), by RPC: a version that is
 * not a version is refused, an agent whose version is not one is never matched (and is named), and a
 * dry run answers the agents a drain would hit, changing nothing. Real daemon, real Postgres; the
 * agents are connect clients that never heartbeat. The same through aiflowctl in a child process is
 * ops-drain-selector-cli.test.ts (slow tier).
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import type { Daemon } from "../src/daemon.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { AgentSummary, OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { refusal, type Session, useTestDaemon } from "./support/kit.js";
import { opsSession, OpsTestAgent } from "./support/ops.js";

const fx = useTestDaemon({ label: "drainsel", config: { instanceId: "drain-sel", heartbeatInterval: 3_600_000 } });
let daemon: Daemon;
let ops: Session<typeof OpsService>;

beforeAll(() => {
  daemon = fx.daemon;
  ops = fx.closers.add(opsSession(daemon.address));
});

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
    expect(await statuses("v-skip")).toEqual({
      "v-skip-0": "ACTIVE",
      "v-skip-1": "DRAINING",
      "v-skip-2": "ACTIVE",
      "v-skip-3": "DRAINING",
      "v-skip-4": "ACTIVE",
      "v-skip-5": "DRAINING",
    });
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
