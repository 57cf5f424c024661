/**
 * OpsService drains, undrain and removal end to end: real HTTP/2, a real Postgres, and a fake clock
 * that only maintenance.runOnce() reads for deadlines (the timers never fire during the test).
 * Every test uses a tenant of its own, so agents of one test never see another's items.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { durationFromMs, durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import type { Directive } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { AgentSummary } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import type { TestDb } from "./support/db.js";
import { codeOf, refusal, type Session, useTestDaemon } from "./support/kit.js";
import { Producer } from "./support/queue.js";
import { opsSession, OpsTestAgent, sorted, type AgentOptions } from "./support/ops.js";
import type { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";

const clock = new FakeClock(Date.UTC(2026, 3, 1));
const fx = useTestDaemon({
  label: "opsdrain",
  clock,
  config: {
    instanceId: "ops-drain",
    // Nothing runs on a timer: the test calls maintenance.runOnce() after moving the clock.
    sweepInterval: 3_600_000,
    heartbeatFlush: 3_600_000,
    // Agents here never heartbeat; moving the clock must not make them miss heartbeats.
    heartbeatInterval: 3_600_000,
  },
});
const closers = fx.closers;
let db: TestDb;
let daemon: Daemon;
let ops: Session<typeof OpsService>;
let producer: Producer;

beforeAll(() => {
  ({ db, daemon } = fx);
  ops = closers.add(opsSession(daemon.address));
  producer = closers.add(new Producer(daemon.address));
});

const agent = async (name: string, opts: Partial<AgentOptions> & { tenants: string[] }) =>
  closers.add(await OpsTestAgent.register(daemon.address, name, { engineKinds: ["k"], ...opts }));
const getAgent = (name: string) => ops.client.getAgent({ name }, ops.call);
const item = async (id: string) => (await ops.client.getItem({ id }, ops.call)).item!;
const isStatus = (status: AgentStatus) => (d: Directive) => d.kind.case === "status" && d.kind.value.status === status;
const cancels = (d: Directive[]) => d.flatMap((x) => (x.kind.case === "cancel" ? [x.kind.value] : []));
const names = (agents: readonly AgentSummary[]) => agents.map((a) => a.name);

describe("DrainAgent by name, work finishing normally", () => {
  it("goes DRAINING at once, tells the agent, claims nothing more, lets leases renew, and completes at zero in flight", async () => {
    const tenant = "drain-normal";
    const ids = await producer.many(tenant, "k", 3);
    const a = await agent("dn-agent", { tenants: [tenant] });
    const held = await a.claim(2);
    expect(held).toHaveLength(2);
    const watch = closers.add(await a.watch());

    const reply = await ops.client.drainAgent({ name: a.name, reason: "rolling deploy 42" }, ops.call);
    expect(names(reply.agents)).toEqual([a.name]);
    const s = reply.agents[0]!;
    expect(s.status).toBe(AgentStatus.DRAINING);
    expect(s.inFlight).toBe(2);
    expect(s.drain).toMatchObject({ reason: "rolling deploy 42", inFlightAtStart: 2, inFlightNow: 2, complete: false, releasedAtDeadline: 0 });
    expect(s.drain?.deadline).toBeUndefined();
    expect(timestampMs(s.drain!.startedAt!)).toBe(clock.nowMs());

    // The agent is told on its stream, and (once the daemon heard the directive) by its heartbeats.
    const d = await watch.until(isStatus(AgentStatus.DRAINING));
    expect(d.kind.case === "status" && d.kind.value.reason).toBe("rolling deploy 42");
    expect((await a.heartbeat()).status).toBe(AgentStatus.DRAINING);

    // A pending item is there, but a draining agent claims nothing.
    const claim = await a.claimResponse(5);
    expect(claim.items).toEqual([]);
    expect(claim.status).toBe(AgentStatus.DRAINING);
    const third = ids.find((id) => !held.some((h) => h.id === id))!;
    expect((await item(third)).status).toBe(WorkItemStatus.PENDING);

    // In-flight work keeps its leases.
    const ext = await a.extend(held);
    expect(ext.map((o) => o.ok)).toEqual([true, true]);

    let got = await getAgent(a.name);
    expect(sorted(got.dispatched.map((i) => i.id))).toEqual(sorted(held.map((h) => h.id)));
    expect(got.agent?.drain).toMatchObject({ inFlightAtStart: 2, inFlightNow: 2, complete: false });

    expect((await a.complete([held[0]!])).map((o) => o.ok)).toEqual([true]);
    got = await getAgent(a.name);
    expect(got.agent?.drain).toMatchObject({ inFlightAtStart: 2, inFlightNow: 1, complete: false });

    // The last one is reported on a claim: a draining agent gets nothing new, but the completion lands.
    const last = await a.claimCompleting(5, [held[1]!]);
    expect(last.items).toEqual([]);
    expect(last.status).toBe(AgentStatus.DRAINING);
    expect(last.completionOutcomes.map((o) => o.ok)).toEqual([true]);
    got = await getAgent(a.name);
    expect(got.agent?.status).toBe(AgentStatus.DRAINING);
    expect(got.agent?.inFlight).toBe(0);
    expect(got.agent?.drain).toMatchObject({ inFlightAtStart: 2, inFlightNow: 0, complete: true, releasedAtDeadline: 0 });
    expect(got.dispatched).toEqual([]);
    // Completing normally released nothing: the third item is still waiting for another agent.
    expect((await item(third)).status).toBe(WorkItemStatus.PENDING);
  });

  it("an unknown name is NOT_FOUND; neither a name nor a selector is INVALID_ARGUMENT", async () => {
    const e = await refusal(ops.client.drainAgent({ name: "no-such-agent" }, ops.call));
    expect(e.code).toBe(Code.NotFound);
    expect(e.rawMessage).toBe("agent 'no-such-agent' not found");
    expect(await codeOf(ops.client.drainAgent({}, ops.call))).toBe(Code.InvalidArgument);
    expect(await codeOf(ops.client.drainAgent({ selector: { tags: {}, versionBelow: "" } }, ops.call))).toBe(Code.InvalidArgument);
  });
});

describe("DrainAgent with a deadline", () => {
  it("at the deadline gives the work back without spending retries, tells the agent to stop, and refuses its late completions", async () => {
    const tenant = "drain-deadline";
    const a = await agent("dd-a", { tenants: [tenant] });
    // One item has already used a retry, so "unchanged" is not just "still zero".
    const [retried] = await producer.ids(tenant, [{ engineKind: "k", maxRetries: 3 }]);
    const first = await a.claim(1);
    expect((await a.fail(first, true)).map((o) => o.ok)).toEqual([true]);
    const [fresh] = await producer.ids(tenant, [{ engineKind: "k", maxRetries: 3 }]);
    const held = await a.claim(5);
    expect(sorted(held.map((h) => h.id))).toEqual(sorted([retried!, fresh!]));
    const retriesBefore = Object.fromEntries(held.map((h) => [h.id, h.retryCount]));
    expect(retriesBefore).toEqual({ [retried!]: 1, [fresh!]: 0 });
    const watch = closers.add(await a.watch());

    const startedAt = clock.nowMs();
    const reply = await ops.client.drainAgent({ name: a.name, deadline: durationFromMs(10_000), reason: "deploy" }, ops.call);
    const drain = reply.agents[0]?.drain;
    expect(drain).toMatchObject({ inFlightAtStart: 2, inFlightNow: 2, complete: false });
    expect(timestampMs(drain!.deadline!)).toBe(startedAt + 10_000);
    const told = await watch.until(isStatus(AgentStatus.DRAINING));
    expect(told.kind.case === "status" && timestampMs(told.kind.value.drainDeadline!)).toBe(startedAt + 10_000);

    // Before the deadline a sweep leaves the work alone.
    clock.advance(9_000);
    await daemon.maintenance.runOnce();
    expect((await item(retried!)).status).toBe(WorkItemStatus.DISPATCHED);
    expect((await a.extend(held)).map((o) => o.ok)).toEqual([true, true]);

    clock.advance(1_001);
    await daemon.maintenance.runOnce();
    for (const h of held) {
      const it = await item(h.id);
      expect(it.status).toBe(WorkItemStatus.PENDING);
      expect(it.retryCount).toBe(retriesBefore[h.id]);
      expect(it.agentId).toBe("");
      expect(it.leaseToken).toBe("");
    }
    const got = await getAgent(a.name);
    expect(got.agent?.status).toBe(AgentStatus.DRAINING);
    expect(got.agent?.drain).toMatchObject({ inFlightAtStart: 2, inFlightNow: 0, complete: true, releasedAtDeadline: 2 });
    expect(got.dispatched).toEqual([]);

    // The agent is told to abort exactly those leases.
    await watch.until(() => cancels(watch.received).length >= 2);
    const cancelled = cancels(watch.received);
    expect(sorted(cancelled.map((c) => `${c.workItemId}/${c.leaseToken}`))).toEqual(sorted(held.map((h) => `${h.id}/${h.leaseToken}`)));

    // Another agent picks them up and completes them.
    const b = await agent("dd-b", { tenants: [tenant] });
    const again = await b.claim(5);
    expect(sorted(again.map((x) => x.id))).toEqual(sorted(held.map((h) => h.id)));
    expect(again.map((x) => x.retryCount).sort()).toEqual([0, 1]);

    // A later sweep (the drain is still past its deadline) must not touch b's leases.
    clock.advance(1_000);
    await daemon.maintenance.runOnce();
    expect((await item(retried!)).status).toBe(WorkItemStatus.DISPATCHED);
    expect((await getAgent(a.name)).agent?.drain?.releasedAtDeadline).toBe(2);

    expect((await b.complete(again, { by: "b" })).map((o) => o.ok)).toEqual([true, true]);

    // The drained agent's late completion carries the old tokens and is refused item by item.
    const late = await a.complete(held, { by: "a" });
    expect(late.map((o) => [o.ok, o.code])).toEqual([
      [false, Code.FailedPrecondition],
      [false, Code.FailedPrecondition],
    ]);
    for (const h of held) {
      const it = await item(h.id);
      expect(it.status).toBe(WorkItemStatus.COMPLETED);
      expect(it.agentId).toBe("dd-b");
      expect(JSON.parse(it.resultJson)).toEqual({ by: "b" });
    }
  });
});

describe("DrainAgent's result counts the agent's own releases at the deadline", () => {
  it("a release at or after the deadline, or one the agent marks drain_deadline, counts; an early unmarked one does not", async () => {
    const tenant = "drain-agent-released";
    await producer.many(tenant, "k", 4);
    const a = await agent("dr-a", { tenants: [tenant] });
    const [early, marked, late, last] = await a.claim(4);
    expect(last).toBeDefined();
    // An agent that is not draining has no drain to count in: its marked release writes nothing.
    const other = await agent("dr-other", { tenants: [tenant] });
    await producer.many(tenant, "k", 1);
    const [own] = await other.claim(1);
    expect((await other.release([own!], true)).map((o) => o.ok)).toEqual([true]);
    expect((await getAgent(other.name)).agent?.drain).toBeUndefined();

    await ops.client.drainAgent({ name: a.name, deadline: durationFromMs(10_000) }, ops.call);
    // Before the deadline: an item given back unmarked (claimed ahead, never started) is not work the deadline cut off.
    expect((await a.release([early!])).map((o) => o.ok)).toEqual([true]);
    expect((await getAgent(a.name)).agent?.drain?.releasedAtDeadline).toBe(0);
    // The agent's timer fired first by its own clock: it says why.
    expect((await a.release([marked!], true)).map((o) => o.ok)).toEqual([true]);
    expect((await getAgent(a.name)).agent?.drain?.releasedAtDeadline).toBe(1);

    // At the deadline, before any sweep ran: the agent gives the rest back itself, unmarked.
    clock.advance(10_000);
    expect((await a.release([late!])).map((o) => o.ok)).toEqual([true]);
    let got = await getAgent(a.name);
    expect(got.agent?.drain).toMatchObject({ inFlightAtStart: 4, inFlightNow: 1, releasedAtDeadline: 2 });
    // The sweep gives back what is left and counts it; a release it already made is not counted twice.
    await daemon.maintenance.runOnce();
    expect((await a.release([last!], true)).map((o) => o.code)).toEqual([Code.FailedPrecondition]);
    got = await getAgent(a.name);
    expect(got.agent?.drain).toMatchObject({ inFlightNow: 0, complete: true, releasedAtDeadline: 3 });
    for (const h of [early, marked, late, last]) expect((await item(h!.id)).status).toBe(WorkItemStatus.PENDING);
  });
});

describe("DrainAgent by selector", () => {
  it("version_below drains only the older versions (dotted numeric order); a tag selector drains its matches; a re-drain keeps the start", async () => {
    const tenant = "drain-selector";
    await agent("sel-a", { tenants: [tenant], version: "1.9.2", tags: { pool: "gpu" } });
    await agent("sel-b", { tenants: [tenant], version: "1.10.0", tags: { pool: "cpu" } });
    await agent("sel-c", { tenants: [tenant], version: "2.0.0", tags: { pool: "gpu" } });
    const status = async () => {
      const res = await ops.client.listAgents({ tags: {}, statuses: [] }, ops.call);
      return Object.fromEntries(res.agents.filter((x) => x.name.startsWith("sel-")).map((x) => [x.name, x.status]));
    };

    const t0 = clock.nowMs();
    const byVersion = await ops.client.drainAgent({ selector: { versionBelow: "1.10.0" }, reason: "upgrade to 1.10" }, ops.call);
    expect(names(byVersion.agents)).toEqual(["sel-a"]);
    expect(byVersion.agents[0]?.agentVersion).toBe("1.9.2");
    expect(await status()).toEqual({ "sel-a": AgentStatus.DRAINING, "sel-b": AgentStatus.ACTIVE, "sel-c": AgentStatus.ACTIVE });

    // Nothing older than the oldest: a selector that matches nobody drains nobody.
    expect((await ops.client.drainAgent({ selector: { versionBelow: "1.0" } }, ops.call)).agents).toEqual([]);

    clock.advance(2_000);
    const byTag = await ops.client.drainAgent({ selector: { tags: { pool: "gpu" } } }, ops.call);
    expect(names(byTag.agents)).toEqual(["sel-a", "sel-c"]);
    expect(await status()).toEqual({ "sel-a": AgentStatus.DRAINING, "sel-b": AgentStatus.ACTIVE, "sel-c": AgentStatus.DRAINING });
    const [a, c] = byTag.agents;
    expect(timestampMs(a!.drain!.startedAt!)).toBe(t0);
    expect(timestampMs(c!.drain!.startedAt!)).toBe(t0 + 2_000);

    // Both conditions must hold.
    await ops.client.undrainAgent({ name: "sel-c" }, ops.call);
    const both = await ops.client.drainAgent({ selector: { tags: { pool: "gpu" }, versionBelow: "2.0.0" } }, ops.call);
    expect(names(both.agents)).toEqual(["sel-a"]);
    expect((await status())["sel-c"]).toBe(AgentStatus.ACTIVE);
  });

  it("ListAgents is ordered by name and filters by status, tag and version", async () => {
    const tenant = "list-agents";
    await agent("la-2", { tenants: [tenant], version: "3.0.0", tags: { team: "x" } });
    await agent("la-1", { tenants: [tenant], version: "3.0.1", tags: { team: "x", zone: "z1" } });
    await agent("la-0", { tenants: [tenant], version: "3.0.0", tags: { team: "y" } });
    await ops.client.drainAgent({ name: "la-0" }, ops.call);

    const all = await ops.client.listAgents({}, ops.call);
    expect(names(all.agents)).toEqual([...names(all.agents)].sort());
    expect(names(all.agents).filter((n) => n.startsWith("la-"))).toEqual(["la-0", "la-1", "la-2"]);
    expect(names((await ops.client.listAgents({ tags: { team: "x" } }, ops.call)).agents)).toEqual(["la-1", "la-2"]);
    expect(names((await ops.client.listAgents({ tags: { team: "x", zone: "z1" } }, ops.call)).agents)).toEqual(["la-1"]);
    expect(names((await ops.client.listAgents({ version: "3.0.0" }, ops.call)).agents)).toEqual(["la-0", "la-2"]);
    const draining = names((await ops.client.listAgents({ statuses: [AgentStatus.DRAINING] }, ops.call)).agents);
    expect(draining).toContain("la-0");
    expect(draining).not.toContain("la-1");

    const row = all.agents.find((x) => x.name === "la-1")!;
    expect(row).toMatchObject({ status: AgentStatus.ACTIVE, agentVersion: "3.0.1", inFlight: 0 });
    expect(row.metadata?.tags).toEqual({ team: "x", zone: "z1" });
    expect(row.metadata?.slots).toBe(4);
    expect(row.drain).toBeUndefined();
    expect(durationMs(row.lastSeenAge!)).toBe(0);
    clock.advance(7_000);
    const later = (await ops.client.listAgents({ version: "3.0.1" }, ops.call)).agents[0]!;
    expect(durationMs(later.lastSeenAge!)).toBe(7_000);

    // An operator's drain or undrain is not a sign of life: the age keeps counting.
    const drained = await ops.client.drainAgent({ name: "la-1" }, ops.call);
    expect(durationMs(drained.agents[0]!.lastSeenAge!)).toBe(7_000);
    const undrained = await ops.client.undrainAgent({ name: "la-0" }, ops.call);
    expect(durationMs(undrained.agent!.lastSeenAge!)).toBe(7_000);
  });
});

describe("UndrainAgent and reconnects", () => {
  it("a drain survives re-registering and going inactive; undrain makes the agent ACTIVE and it claims again", async () => {
    const tenant = "undrain";
    const a = await agent("ud-a", { tenants: [tenant] });
    const [id] = await producer.many(tenant, "k", 1);
    await ops.client.drainAgent({ name: a.name, reason: "maintenance" }, ops.call);

    // Reconnect: registering again does not end the drain.
    const reg = await a.register();
    expect(reg.status).toBe(AgentStatus.DRAINING);
    expect((await getAgent(a.name)).agent?.drain?.reason).toBe("maintenance");
    expect(await a.claim(1)).toEqual([]);

    // Nor does a clean exit and a restart.
    await a.s.client.deregister({ name: a.name }, a.s.call);
    expect((await getAgent(a.name)).agent?.status).toBe(AgentStatus.INACTIVE);
    expect((await a.register()).status).toBe(AgentStatus.DRAINING);
    expect(await a.claim(1)).toEqual([]);
    expect((await item(id!)).status).toBe(WorkItemStatus.PENDING);

    const watch = closers.add(await a.watch());
    expect(watch.received[0]?.kind.case === "status" && watch.received[0].kind.value.status).toBe(AgentStatus.DRAINING);
    const res = await ops.client.undrainAgent({ name: a.name }, ops.call);
    expect(res.agent?.status).toBe(AgentStatus.ACTIVE);
    expect(res.agent?.drain).toBeUndefined();
    await watch.until(isStatus(AgentStatus.ACTIVE));

    const claimed = await a.claim(1);
    expect(claimed.map((x) => x.id)).toEqual([id]);
    expect((await a.register()).status).toBe(AgentStatus.ACTIVE);

    expect(await codeOf(ops.client.undrainAgent({ name: "no-such-agent" }, ops.call))).toBe(Code.NotFound);
  });

  it("draining an inactive agent keeps it INACTIVE (its heartbeats say register again) and it comes back DRAINING", async () => {
    const a = await agent("ud-gone", { tenants: ["undrain-gone"] });
    await a.s.client.deregister({ name: a.name }, a.s.call);
    const watch = closers.add(await a.watch());
    expect(watch.received[0]?.kind.case === "status" && watch.received[0].kind.value.status).toBe(AgentStatus.INACTIVE);

    const reply = await ops.client.drainAgent({ name: a.name, reason: "decommission", deadline: durationFromMs(60_000) }, ops.call);
    expect(reply.agents[0]?.status).toBe(AgentStatus.INACTIVE);
    expect(reply.agents[0]?.drain?.reason).toBe("decommission");
    // Whatever the daemon tells the agent, it must not be that it is now draining (it is not running).
    const told = await watch.next();
    expect(told.kind.case === "status" && AgentStatus[told.kind.value.status]).toBe("INACTIVE");
    expect((await a.heartbeat()).status).toBe(AgentStatus.INACTIVE);
    expect((await a.register()).status).toBe(AgentStatus.DRAINING);
    expect((await getAgent(a.name)).agent?.drain?.reason).toBe("decommission");
  });
});

describe("RemoveAgent", () => {
  it("is refused while the agent holds work; with force its work goes back; it is then unlisted and unknown", async () => {
    const tenant = "remove";
    const a = await agent("rm-a", { tenants: [tenant] });
    await producer.many(tenant, "k", 2, { maxRetries: 2 });
    const held = await a.claim(5);
    expect(held).toHaveLength(2);
    const watch = closers.add(await a.watch());

    const refused = await refusal(ops.client.removeAgent({ name: a.name }, ops.call));
    expect(refused.code).toBe(Code.FailedPrecondition);
    expect(refused.rawMessage).toContain("'rm-a'");
    expect((await getAgent(a.name)).agent?.inFlight).toBe(2);
    for (const h of held) expect((await item(h.id)).status).toBe(WorkItemStatus.DISPATCHED);

    const removedAt = clock.nowMs();
    const res = await ops.client.removeAgent({ name: a.name, force: true }, ops.call);
    expect(res.released).toBe(2);
    for (const h of held) {
      const it = await item(h.id);
      expect(it.status).toBe(WorkItemStatus.PENDING);
      expect(it.retryCount).toBe(0);
    }
    await watch.until((d) => cancels([d]).length > 0);
    await watch.until(isStatus(AgentStatus.INACTIVE));
    expect(sorted(cancels(watch.received).map((c) => c.leaseToken))).toEqual(sorted(held.map((h) => h.leaseToken)));

    expect(names((await ops.client.listAgents({}, ops.call)).agents)).not.toContain("rm-a");
    const removed = (await ops.client.listAgents({ includeRemoved: true }, ops.call)).agents.find((x) => x.name === "rm-a");
    expect(removed?.status).toBe(AgentStatus.INACTIVE);
    const [row] = await db.raw<{ deletedby: string | null; deletedon: Date | null }>(
      `SELECT deletedby, deletedon FROM ${db.tables.qualified("agent")} WHERE name = $1`,
      ["rm-a"],
    );
    expect(row?.deletedby).toBeTruthy();
    expect(row?.deletedon?.getTime()).toBe(removedAt);

    expect(await codeOf(getAgent(a.name))).toBe(Code.NotFound);
    expect(await codeOf(ops.client.removeAgent({ name: a.name }, ops.call))).toBe(Code.NotFound);
    // Its heartbeats are no longer those of a live agent: at once INACTIVE at worst (the daemon
    // re-caches its own INACTIVE directive; see the report), and NOT_FOUND once a flush found no row.
    const first = await a.heartbeat().then(
      (r) => `status ${AgentStatus[r.status]}`,
      (e) => `code ${Code[ConnectError.from(e).code]}`,
    );
    expect(["status INACTIVE", "code NotFound"]).toContain(first);
    await daemon.maintenance.flushHeartbeats();
    expect(await codeOf(a.heartbeat())).toBe(Code.NotFound);
    expect(await codeOf(a.heartbeat())).toBe(Code.NotFound);
    // Its late completions are refused, and the items stay claimable by others.
    expect((await a.complete(held)).map((o) => o.ok)).toEqual([false, false]);
    const b = await agent("rm-b", { tenants: [tenant] });
    expect(sorted((await b.claim(5)).map((x) => x.id))).toEqual(sorted(held.map((h) => h.id)));
  });

  it("an agent holding nothing is removed without force", async () => {
    const a = await agent("rm-idle", { tenants: ["remove-idle"] });
    expect((await ops.client.removeAgent({ name: a.name }, ops.call)).released).toBe(0);
    expect(names((await ops.client.listAgents({}, ops.call)).agents)).not.toContain("rm-idle");
  });
});
