/**
 * OpsService queue visibility and operator work-item actions end to end (real HTTP/2, real Postgres,
 * fake clock): QueueStats figures against a queue built to known counts, ListItems across tenants,
 * GetItem, CancelItems, and RedriveItems putting dead letters back with a fresh retry budget.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { durationFromMs, durationMs } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { OpsService, QueueStatsResponse } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { codeOf, type Session, useTestDaemon } from "./support/kit.js";
import { Producer } from "./support/queue.js";
import { opsSession, OpsTestAgent, sorted } from "./support/ops.js";

const clock = new FakeClock(Date.UTC(2026, 4, 1));
const fx = useTestDaemon({
  label: "opsqueue",
  clock,
  config: { instanceId: "ops-queue", sweepInterval: 3_600_000, heartbeatFlush: 3_600_000, heartbeatInterval: 3_600_000 },
});
const closers = fx.closers;
let daemon: Daemon;
let ops: Session<typeof OpsService>;
let producer: Producer;

beforeAll(() => {
  daemon = fx.daemon;
  ops = closers.add(opsSession(daemon.address));
  producer = closers.add(new Producer(daemon.address));
});

const agent = async (name: string, tenants: string[], engineKinds = ["k"]) =>
  closers.add(await OpsTestAgent.register(daemon.address, name, { tenants, engineKinds }));
const stats = (tenantKey = "") => ops.client.queueStats({ tenantKey }, ops.call);
const item = async (id: string) => (await ops.client.getItem({ id }, ops.call)).item!;
/** Depth rows as "tenant/kind/STATUS" → count, order-free. */
const depth = (s: QueueStatsResponse) =>
  Object.fromEntries(s.depth.map((d) => [`${d.tenantKey}/${d.engineKind}/${WorkItemStatus[d.status]}`, Number(d.count)]));

describe("QueueStats", () => {
  it("reports depth by tenant × kind × status, totals, the oldest pending age, rates over the last minute, and dead letters", async () => {
    await producer.many("qs", "k", 7);
    const a = await agent("qs-agent", ["qs"]);
    const claimed = await a.claim(4);
    expect(claimed).toHaveLength(4);
    expect((await a.complete(claimed.slice(0, 2))).every((o) => o.ok)).toBe(true);
    expect((await a.fail(claimed.slice(2, 3), false)).every((o) => o.ok)).toBe(true);

    // Another tenant, two seconds younger, with a kind of its own.
    clock.advance(2_000);
    await producer.many("qs2", "k2", 1);
    clock.advance(3_000);

    const s = await stats("qs");
    expect(depth(s)).toEqual({ "qs/k/PENDING": 3, "qs/k/DISPATCHED": 1, "qs/k/COMPLETED": 2, "qs/k/FAILED": 1 });
    expect(s.pending).toBe(3n);
    expect(s.dispatched).toBe(1n);
    expect(s.deadLetters).toBe(1n);
    expect(durationMs(s.oldestPendingAge!)).toBe(5_000);
    expect(s.completedPerSecond).toBeCloseTo(2 / 60, 10);
    expect(s.dispatchedPerSecond).toBeCloseTo(4 / 60, 10);
    // Claimed as soon as enqueued (the fake clock had not moved): no wait.
    expect([durationMs(s.dispatchWaitP50!), durationMs(s.dispatchWaitP99!)]).toEqual([0, 0]);

    const other = await stats("qs2");
    expect(depth(other)).toEqual({ "qs2/k2/PENDING": 1 });
    expect(durationMs(other.oldestPendingAge!)).toBe(3_000);
    expect(other.completedPerSecond).toBe(0);
    expect(other.deadLetters).toBe(0n);

    const all = await stats();
    expect(depth(all)).toEqual({ ...depth(s), "qs2/k2/PENDING": 1 });
    expect(all.pending).toBe(4n);
    expect(durationMs(all.oldestPendingAge!)).toBe(5_000);

    // A minute later the rates have decayed; the ages have grown.
    clock.advance(61_000);
    const later = await stats("qs");
    expect(later.completedPerSecond).toBe(0);
    expect(later.dispatchedPerSecond).toBe(0);
    expect(later.dispatchWaitP50).toBeUndefined();
    expect(durationMs(later.oldestPendingAge!)).toBe(66_000);
    expect(later.pending).toBe(3n);

    // Nothing pending: the age is zero.
    const rest = await a.claim(10);
    expect(rest).toHaveLength(3);
    const none = await stats("qs");
    expect(durationMs(none.oldestPendingAge!)).toBe(0);
    expect(none.pending).toBe(0n);
    expect(none.dispatched).toBe(4n);
    expect(none.dispatchedPerSecond).toBeCloseTo(3 / 60, 10);
    // Those three waited from their enqueue, 66 s before.
    expect([durationMs(none.dispatchWaitP50!), durationMs(none.dispatchWaitP99!)]).toEqual([66_000, 66_000]);
  });

  it("names due work no ACTIVE agent serves (its tenant or engine kind), with the age of the oldest and the agents that are not active", async () => {
    const unserved = async (tenant = "") =>
      (await stats(tenant)).unserved
        .filter((u) => u.tenantKey.startsWith("ns"))
        .map((u) => ({ group: `${u.tenantKey}/${u.engineKind}`, count: Number(u.count), ageMs: durationMs(u.oldestAge!), notActive: u.agentsNotActive }));
    await producer.many("ns", "gpu", 2, { maxRetries: 3 });
    await producer.many("ns", "cpu", 1);
    clock.advance(1_000);
    // A tenant no agent serves at all.
    await producer.many("ns2", "cpu", 1);
    await agent("ns-cpu", ["ns"], ["cpu"]);
    clock.advance(3_000);
    expect(await unserved()).toEqual([
      { group: "ns/gpu", count: 2, ageMs: 4_000, notActive: 0 },
      { group: "ns2/cpu", count: 1, ageMs: 3_000, notActive: 0 },
    ]);
    expect(await unserved("ns2")).toEqual([{ group: "ns2/cpu", count: 1, ageMs: 3_000, notActive: 0 }]);

    // Served once an agent of that tenant and kind registers.
    const gpu = await agent("ns-gpu", ["ns"], ["gpu"]);
    expect(await unserved("ns")).toEqual([]);

    // One item back for a retry later (not due: nothing is waiting on it yet), and the agent drained:
    // the due one is unserved again, and the drained agent is counted.
    const [taken] = await gpu.claim(1);
    const retry = { workItemId: taken!.id, leaseToken: taken!.leaseToken, error: "later", retryable: true, retryDelay: durationFromMs(60_000) };
    expect((await gpu.s.client.fail({ name: gpu.name, items: [retry] }, gpu.s.call)).outcomes.every((o) => o.ok)).toBe(true);
    expect((await item(taken!.id)).status).toBe(WorkItemStatus.PENDING);
    await ops.client.drainAgent({ name: "ns-gpu", reason: "deploy" }, ops.call);
    expect(await unserved("ns")).toEqual([{ group: "ns/gpu", count: 1, ageMs: 4_000, notActive: 1 }]);
    await ops.client.undrainAgent({ name: "ns-gpu" }, ops.call);
    expect(await unserved("ns")).toEqual([]);
  });

  it("an unknown tenant has an empty queue; a malformed one is INVALID_ARGUMENT", async () => {
    const s = await stats("nobody");
    expect(s.depth).toEqual([]);
    expect(s.pending).toBe(0n);
    expect(durationMs(s.oldestPendingAge!)).toBe(0);
    expect(await codeOf(stats("no spaces allowed"))).toBe(Code.InvalidArgument);
  });
});

describe("operator work-item actions", () => {
  it("ListItems spans tenants with every filter and pages; GetItem needs no tenant", async () => {
    const [a1, a2] = await producer.ids("la", [
      { engineKind: "k", runId: "run-la", priority: 1 },
      { engineKind: "k", runId: "run-la", priority: 2, idempotencyKey: "order-42" },
    ]);
    const [b1] = await producer.ids("lb", [{ engineKind: "k", priority: 3 }]);
    const x = await agent("li-agent", ["lb"]);
    expect((await x.claim(1)).map((i) => i.id)).toEqual([b1]);

    const list = (req: Parameters<typeof ops.client.listItems>[0]) => ops.client.listItems(req, ops.call);
    const both = await list({ statuses: [WorkItemStatus.PENDING, WorkItemStatus.DISPATCHED], engineKind: "k" });
    expect(both.items.filter((i) => ["la", "lb"].includes(i.tenantKey)).map((i) => i.id)).toEqual([a1, a2, b1]);
    expect((await list({ tenantKey: "la" })).items.map((i) => i.id)).toEqual([a1, a2]);
    expect((await list({ runId: "run-la" })).items.map((i) => i.id)).toEqual([a1, a2]);
    expect((await list({ idempotencyKey: "order-42" })).items.map((i) => i.id)).toEqual([a2]);
    expect((await list({ tenantKey: "lb", idempotencyKey: "order-42" })).items).toEqual([]);
    const mine = (await list({ agentId: "li-agent" })).items;
    expect(mine.map((i) => [i.id, i.tenantKey, i.status])).toEqual([[b1, "lb", WorkItemStatus.DISPATCHED]]);

    const p1 = await list({ tenantKey: "la", pageSize: 1 });
    expect(p1.items.map((i) => i.id)).toEqual([a1]);
    expect(p1.nextPageToken).not.toBe("");
    const p2 = await list({ tenantKey: "la", pageSize: 1, pageToken: p1.nextPageToken });
    expect(p2.items.map((i) => i.id)).toEqual([a2]);
    expect(p2.nextPageToken).toBe("");

    const got = await ops.client.getItem({ id: b1! }, ops.call);
    expect(got.item).toMatchObject({ id: b1, tenantKey: "lb", status: WorkItemStatus.DISPATCHED, agentId: "li-agent" });
    expect(await codeOf(ops.client.getItem({ id: "NOPE" }, ops.call))).toBe(Code.NotFound);
  });

  it("CancelItems cancels a tenant's items (telling the holder), never another tenant's", async () => {
    const [c1, c2] = await producer.many("ca", "k", 2);
    const [other] = await producer.many("cb", "k", 1);
    const holder = await agent("ca-agent", ["ca"]);
    const held = await holder.claim(1);
    expect(held).toHaveLength(1);
    const watch = closers.add(await holder.watch());

    // Tenant-scoped: naming cb's item under tenant ca cancels nothing.
    expect((await ops.client.cancelItems({ tenantKey: "ca", ids: [other!], reason: "wrong tenant" }, ops.call)).cancelledIds).toEqual([]);
    expect((await item(other!)).status).toBe(WorkItemStatus.PENDING);
    expect(await codeOf(ops.client.cancelItems({ ids: [c1!] }, ops.call))).toBe(Code.InvalidArgument);
    expect(await codeOf(ops.client.cancelItems({ tenantKey: "ca" }, ops.call))).toBe(Code.InvalidArgument);

    const res = await ops.client.cancelItems({ tenantKey: "ca", ids: [c1!, c2!], reason: "operator says no" }, ops.call);
    expect(sorted(res.cancelledIds)).toEqual(sorted([c1!, c2!]));
    for (const id of [c1!, c2!]) {
      const it = await item(id);
      expect(it.status).toBe(WorkItemStatus.CANCELLED);
      expect(it.error).toBe("operator says no");
    }
    const cancel = await watch.until((d) => d.kind.case === "cancel");
    expect(cancel.kind.case === "cancel" && [cancel.kind.value.workItemId, cancel.kind.value.leaseToken]).toEqual([held[0]!.id, held[0]!.leaseToken]);
    expect((await holder.complete(held)).map((o) => o.code)).toEqual([Code.FailedPrecondition]);
    expect((await item(held[0]!.id)).status).toBe(WorkItemStatus.CANCELLED);
  });

  it("RedriveItems puts dead letters back (one by id, a run, all) with retry_count 0, and nothing else", async () => {
    const [r1, r2] = await producer.ids("ra", [
      { engineKind: "k", runId: "run-r", maxRetries: 3 },
      { engineKind: "k", runId: "run-r", maxRetries: 3 },
    ]);
    const [single] = await producer.ids("ra", [{ engineKind: "k", maxRetries: 3 }]);
    const [elsewhere] = await producer.ids("rb", [{ engineKind: "k", maxRetries: 3 }]);
    const [alive] = await producer.ids("rb", [{ engineKind: "k2", maxRetries: 3 }]);
    const dead = [r1!, r2!, single!, elsewhere!];
    // Dead letters left by the tests above (the QueueStats one) are part of "all" too.
    const earlier = (await ops.client.listItems({ statuses: [WorkItemStatus.FAILED] }, ops.call)).items.map((i) => i.id);
    const w = await agent("rd-agent", ["ra", "rb"]);

    // Every dead letter first spends a retry (so the redrive visibly resets the count), then fails for good.
    const first = await w.claim(10);
    expect(sorted(first.map((i) => i.id))).toEqual(sorted(dead));
    expect((await w.fail(first, true)).every((o) => o.ok)).toBe(true);
    const second = await w.claim(10);
    expect(sorted(second.map((i) => i.id))).toEqual(sorted(dead));
    expect((await w.fail(second, false, "poison")).every((o) => o.ok)).toBe(true);
    for (const id of dead) expect(await item(id)).toMatchObject({ status: WorkItemStatus.FAILED, retryCount: 1 });
    expect((await stats()).deadLetters).toBe(BigInt(4 + earlier.length));

    const deadLetters = await ops.client.listItems({ statuses: [WorkItemStatus.FAILED] }, ops.call);
    expect(sorted(deadLetters.items.map((i) => i.id))).toEqual(sorted([...dead, ...earlier]));

    const expectRedriven = async (ids: string[]) => {
      for (const id of ids) {
        const it = await item(id);
        expect(it.status).toBe(WorkItemStatus.PENDING);
        expect(it.retryCount).toBe(0);
        expect(it.agentId).toBe("");
      }
    };

    // One by id; a pending item named alongside it is left alone.
    const one = await ops.client.redriveItems({ ids: [single!, alive!] }, ops.call);
    expect(one.redrivenIds).toEqual([single]);
    await expectRedriven([single!]);
    expect((await item(alive!)).status).toBe(WorkItemStatus.PENDING);

    // A run of one tenant.
    expect((await ops.client.redriveItems({ tenantKey: "rb", runId: "run-r" }, ops.call)).redrivenIds).toEqual([]);
    const run = await ops.client.redriveItems({ tenantKey: "ra", runId: "run-r" }, ops.call);
    expect(sorted(run.redrivenIds)).toEqual(sorted([r1!, r2!]));
    await expectRedriven([r1!, r2!]);

    // Every dead letter, of every tenant.
    const all = await ops.client.redriveItems({ all: true }, ops.call);
    expect(sorted(all.redrivenIds)).toEqual(sorted([elsewhere!, ...earlier]));
    await expectRedriven([elsewhere!, ...earlier]);
    expect((await ops.client.redriveItems({ all: true }, ops.call)).redrivenIds).toEqual([]);
    expect((await stats()).deadLetters).toBe(0n);
    expect(await codeOf(ops.client.redriveItems({}, ops.call))).toBe(Code.InvalidArgument);

    // They are claimable again, with their full budget.
    const again = await w.claim(10);
    expect(sorted(again.map((i) => i.id))).toEqual(sorted(dead));
    expect(again.every((i) => i.retryCount === 0 && i.maxRetries === 3)).toBe(true);
    expect((await w.heartbeat()).status).toBe(AgentStatus.ACTIVE);
  });
});
