/**
 * Leases: fencing of a zombie whose lease expired, Release and per-item batch outcomes, the release
 * of an inactive agent's work before its leases end, and ExtendLease.
 *
 * On the daemon of test/support/queue-daemon.ts: one daemon, a fake clock, sweeps run by the tests.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import type { Daemon } from "../src/daemon.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { agentRow } from "./support/agents.js";
import type { TestDb } from "./support/db.js";
import { DirectiveWatch, itemRow, nsText, type Producer, statusCounts, type WorkItem } from "./support/queue.js";
import { BASE, LEASE, LIVENESS, ids, oks, useQueueDaemon } from "./support/queue-daemon.js";

const fx = useQueueDaemon("qlease");
const { clock, agent, keepAlive, closers } = fx;
// The file's schema, daemon and producer, once the fixture's beforeAll has made them.
let db: TestDb, daemon: Daemon, p: Producer;
beforeAll(() => void ({ db, daemon, p } = fx));

describe("fencing", () => {
  it("a zombie whose lease expired cannot complete after the item went to another agent; the second completion stands", async () => {
    const t = "zombie";
    const [za, zb] = [await agent("zombie-a", { tenants: [t] }), await agent("zombie-b", { tenants: [t] })];
    const watch = new DirectiveWatch(za);
    closers.add(watch);
    await watch.ready();
    const id = await p.one(t, { engineKind: "dag", maxRetries: 3, payloadJson: '{"job":"render"}' });
    const claimedAt = clock.nowMs();
    const [first] = await za.claim(1);
    expect(first).toMatchObject({ id, agentId: "zombie-a", leasedBy: "queue-sem", leaseExpiresAtNs: BigInt(nsText(claimedAt + LEASE)) });

    // A pauses past its lease (its heartbeats still arrive: it is alive, just stuck). The sweep
    // takes the item back, a redelivery spent (not one of its retries), due again after the first backoff.
    clock.advance(LEASE + 1);
    await keepAlive([za, zb]);
    await daemon.maintenance.runOnce();
    const now = clock.nowMs();
    expect(await itemRow(db, id)).toMatchObject({
      status: "pending",
      retry_count: 0,
      redelivery_count: 1,
      agent_id: null,
      lease_token: null,
      error: "lease expired",
      next_attempt_at: nsText(now + BASE),
    });
    // The holder is told to stop (it may be alive enough to listen).
    expect(await watch.cancelFor(id)).toMatchObject({ leaseToken: first!.leaseToken, reason: "lease expired" });
    expect(await zb.claim(1)).toEqual([]);
    clock.advance(BASE);
    const [second] = await zb.claim(1);
    expect(second).toMatchObject({ id, agentId: "zombie-b", retryCount: 0, redeliveryCount: 1 });
    expect(second!.leaseToken).not.toBe(first!.leaseToken);

    // The zombie wakes up and reports; every fenced call is refused and changes nothing.
    const before = await itemRow(db, id);
    const [late] = await za.complete([first!], { by: "zombie-a" });
    expect(late).toMatchObject({ workItemId: id, ok: false, code: Code.FailedPrecondition });
    expect(late!.message).toContain("lease lost");
    for (const outcomes of [await za.fail([first!]), (await za.extend([first!])).outcomes, await za.release([first!])])
      expect(outcomes.map((o) => [o.ok, o.code])).toEqual([[false, Code.FailedPrecondition]]);
    // Even with the new holder's token, A is not the holder.
    expect(oks(await za.complete([second!], { by: "zombie-a" }))).toEqual([false]);
    expect(await itemRow(db, id)).toEqual(before);

    expect(oks(await zb.complete([second!], { by: "zombie-b" }))).toEqual([true]);
    expect(oks(await za.complete([first!], { by: "zombie-a" }))).toEqual([false]);
    expect(await itemRow(db, id)).toMatchObject({
      status: "completed",
      agent_id: "zombie-b",
      result: { by: "zombie-b" },
      lease_token: second!.leaseToken,
      retry_count: 0,
      redelivery_count: 1,
    });
    const read = await p.item(t, id);
    expect(read).toMatchObject({ status: WorkItemStatus.COMPLETED, agentId: "zombie-b" });
    expect(JSON.parse(read.resultJson)).toEqual({ by: "zombie-b" });
    // The rightful holder reporting again (its first answer lost, say) is answered ok and changes
    // nothing: completion is idempotent for the dispatch that completed it, and only for that one.
    const completedRow = await itemRow(db, id);
    expect(oks(await zb.complete([second!], { by: "again" }))).toEqual([true]);
    expect(await itemRow(db, id)).toEqual(completedRow);
    expect(oks(await za.complete([first!], { by: "zombie-a" }))).toEqual([false]);
  });
});

describe("release and batch outcomes", () => {
  it("Release gives items back without spending an attempt; batches answer per item", async () => {
    const t = "release";
    const [ra, rb] = [await agent("release-a", { tenants: [t] }), await agent("release-b", { tenants: [t] })];
    const [x, y] = ids(
      await p.enqueue(t, [
        { engineKind: "dag", priority: 0 },
        { engineKind: "dag", priority: 1 },
      ]),
    );
    const taken = await ra.claim(2);
    const [ix, iy] = [taken.find((i) => i.id === x)!, taken.find((i) => i.id === y)!];
    expect(new Set(ids(taken))).toEqual(new Set([x, y]));
    const now = clock.nowMs();
    const released = await ra.release([ix, { id: iy.id, leaseToken: "not-the-token" }]);
    expect(released.map((o) => [o.workItemId, o.ok, o.code])).toEqual([
      [x, true, 0],
      [y, false, Code.FailedPrecondition],
    ]);
    expect(await itemRow(db, x!)).toMatchObject({ status: "pending", retry_count: 0, agent_id: null, lease_token: null, next_attempt_at: nsText(now) });
    // Due at once, for anyone.
    const [again] = await rb.claim(1);
    expect(again).toMatchObject({ id: x, retryCount: 0, agentId: "release-b" });
    // A batch with a held and a lost item: the held one completes, the other is refused.
    const outcomes = await ra.complete([iy, ix], { by: "release-a" });
    expect(outcomes.map((o) => [o.workItemId, o.ok])).toEqual([
      [y, true],
      [x, false],
    ]);
    expect(await statusCounts(db, t)).toEqual({ completed: 1, dispatched: 1 });
  });
});

describe("agent liveness", () => {
  it("an agent that goes inactive gives its dispatched items back at once, not when their leases end", async () => {
    const t = "liveness";
    const gone = await agent("liveness-gone", { tenants: [t] });
    const alive = await agent("liveness-alive", { tenants: [t] });
    const held = ids(
      await p.enqueue(t, [
        { engineKind: "dag", maxRetries: 3 },
        { engineKind: "dag", maxRetries: 3 },
      ]),
    );
    const claimed = await gone.claim(2);
    expect(new Set(ids(claimed))).toEqual(new Set(held));
    const leaseEnds = clock.nowMs() + LEASE;

    clock.advance(LIVENESS + 1);
    expect(clock.nowMs()).toBeLessThan(leaseEnds);
    await keepAlive([alive]);
    await daemon.maintenance.runOnce();
    const now = clock.nowMs();
    expect((await agentRow(db, "liveness-gone"))!.status).toBe("inactive");
    for (const id of held)
      expect(await itemRow(db, id)).toMatchObject({
        status: "pending",
        retry_count: 0,
        redelivery_count: 1,
        agent_id: null,
        lease_token: null,
        error: "agent 'liveness-gone' went inactive",
        next_attempt_at: nsText(now + BASE),
      });
    expect(oks(await gone.complete(claimed))).toEqual([false, false]);
    expect(await gone.claimWithStatus(2)).toMatchObject({ items: [], status: AgentStatus.INACTIVE });
    clock.advance(BASE);
    expect(new Set(ids(await alive.claim(2)))).toEqual(new Set(held));
  });
});

describe("ExtendLease", () => {
  it("says which leases are held and which are lost; an extended lease survives the sweep at its old expiry", async () => {
    const t = "extend";
    const a = await agent("extend-1", { tenants: [t] });
    await p.enqueue(
      t,
      [0, 1, 2].map((priority) => ({ engineKind: "dag", priority, maxRetries: 2 })),
    );
    const [kept, cancelled, lapsed] = (await a.claim(3)) as [WorkItem, WorkItem, WorkItem];
    const claimedAt = clock.nowMs();
    await p.q.cancel({ tenantKey: t, ids: [cancelled.id] }, p.call);

    clock.advance(20_000);
    const res = await a.extend([kept, cancelled]);
    expect(res.outcomes.map((o) => [o.workItemId, o.ok, o.code])).toEqual([
      [kept.id, true, 0],
      [cancelled.id, false, Code.FailedPrecondition],
    ]);
    expect(res.leaseExpiresAtNs).toBe(BigInt(nsText(clock.nowMs() + LEASE)));
    expect((await itemRow(db, kept.id)).lease_expires_at).toBe(nsText(clock.nowMs() + LEASE));

    clock.advance(claimedAt + LEASE + 1 - clock.nowMs());
    await keepAlive([a]);
    await daemon.maintenance.runOnce();
    expect(await itemRow(db, kept.id)).toMatchObject({ status: "dispatched", lease_token: kept.leaseToken, agent_id: "extend-1" });
    expect(await itemRow(db, lapsed.id)).toMatchObject({ status: "pending", retry_count: 0, redelivery_count: 1, error: "lease expired" });
    expect((await itemRow(db, cancelled.id)).status).toBe("cancelled");
    expect(oks(await a.complete([kept]))).toEqual([true]);
  });
});
