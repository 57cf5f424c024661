/**
 * The work queue's rules, end to end on one daemon over real HTTP/2 and a real Postgres, with a fake
 * clock: lease fencing (zombies), retries with backoff and dead letters, redrive, not-before,
 * dispatch order, tenant / engine-kind / selector matching, cancellation with fan-out, the release
 * of an inactive agent's work, lease extension, paging, and refusals that change nothing.
 *
 * Every test uses tenants and agents of its own, so tests do not see each other's work. The sweeps
 * and heartbeat flushes never run on their timers: a test runs them after moving the clock.
 * Backoff has no jitter here: the delay after the n-th retry is exactly min(cap, base × 2^n).
 */
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { Code } from "@connectrpc/connect";
import pg from "pg";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { WorkItemStore } from "../src/store/work-items.js";
import { agentClient, agentRow, ok, registerRequest, watchDirectives, type DirectiveWire, type HeartbeatReply } from "./support/agents.js";
import { startTestDaemon, TOKENS } from "./support/daemon.js";
import { createTestDb, type TestDb } from "./support/db.js";
import type { grpc } from "./support/grpc-js.js";
import {
  codeOf,
  countItems,
  DirectiveWatch,
  itemRow,
  notBefore,
  nsText,
  Producer,
  serverNow,
  statusCounts,
  TestAgent,
  track,
  STATEMENT,
  untilLockWait,
  untilStatementRan,
  type AgentSpec,
  type WorkItem,
} from "./support/queue.js";

const BASE = 1_000;
const CAP = 5_000;
const LEASE = 30_000;
/** heartbeatInterval 5 s × livenessIntervals 3. */
const LIVENESS = 15_000;
const PROMPT_MS = 2_000;

const clock = new FakeClock(Date.UTC(2026, 3, 1));
let db: TestDb;
let daemon: Daemon;
let p: Producer;
const closers: (() => unknown)[] = [];

beforeAll(async () => {
  db = await createTestDb({ label: "qsem" });
  daemon = await startTestDaemon({
    schema: db.schema,
    clock,
    config: {
      instanceId: "queue-sem",
      sweepInterval: 3_600_000,
      heartbeatFlush: 3_600_000,
      heartbeatInterval: 5_000,
      livenessIntervals: 3,
      leaseTtl: LEASE,
      backoffBase: BASE,
      backoffCap: CAP,
      backoffJitter: "none",
      payloadMaxBytes: 2048,
      claimMaxItems: 5,
    },
  });
  p = new Producer(daemon.address);
});
afterAll(async () => {
  for (const c of closers.reverse()) await c();
  p?.close();
  await daemon?.stop();
  await db?.drop();
});

const agent = async (name: string, spec: Partial<AgentSpec> & { tenants: string[] }) => {
  const a = await TestAgent.register(daemon.address, name, { engineKinds: ["dag"], ...spec });
  closers.push(() => a.close());
  return a;
};
/** Agents that are alive beat, and the beats are written, so the next liveness sweep spares them. */
const keepAlive = async (agents: readonly TestAgent[]) => {
  await Promise.all(agents.map((a) => a.heartbeat()));
  await daemon.maintenance.flushHeartbeats();
};
const ids = (items: readonly { id: string }[]) => items.map((i) => i.id);
const oks = (outcomes: readonly { ok: boolean }[]) => outcomes.map((o) => o.ok);
const store = () => new WorkItemStore(db.pool, db.tables, { baseMs: BASE, capMs: CAP, jitter: false });

describe("a claimed item", () => {
  it("carries every field as the stored item reads back, with the dispatch's holder, lease and times", async () => {
    const t = "claimed-fields";
    const a = await agent("claimed-fields-a", { tenants: [t], tags: { gpu: "h100", zone: "eu" } });
    const [parent] = await p.enqueue(t, [{ engineKind: "dag" }]);
    const [c1] = await a.claim(1);
    await a.complete([c1!]);
    const id = await p.one(t, {
      engineKind: "dag",
      runId: "run-7",
      taskId: "task-7",
      parentWorkItemId: parent!.id,
      priority: 4,
      maxRetries: 2,
      idempotencyKey: "idem-7",
      payloadJson: '{"job":"render ✓ é 日本 🎬","frames":[1,2],"opts":{"hq":true}}',
      taskName: "render-日本",
      workerParams: { selector: { gpu: "h100" }, affinityKey: "scene-7" },
    });
    const [claimed] = await a.claim(1);
    const stored = await p.item(t, id);
    expect(stored.status).toBe(WorkItemStatus.DISPATCHED);
    // The payload is the same JSON (the claim sends the stored text as it is, GetItem re-serialises).
    expect(JSON.parse(claimed!.payloadJson)).toEqual(JSON.parse(stored.payloadJson));
    expect(JSON.parse(claimed!.payloadJson)).toEqual({ job: "render ✓ é 日本 🎬", frames: [1, 2], opts: { hq: true } });
    // The lease token is the holder's alone: the claim carries it, GetItem never does.
    expect(claimed!.leaseToken).not.toBe("");
    expect(stored.leaseToken).toBe("");
    expect({ ...claimed, payloadJson: "", leaseToken: "" }).toEqual({ ...stored, payloadJson: "" });
    expect(claimed).toMatchObject({ agentId: a.name, leasedBy: "queue-sem", runId: "run-7", taskName: "render-日本", parentWorkItemId: parent!.id, priority: 4, maxRetries: 2 });
  });
});

describe("claims that carry completions", () => {
  it("complete them fenced by their tokens, then claim, in one call", async () => {
    const t = "claim-completes";
    const a = await agent("claim-completes-a", { tenants: [t] });
    await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }]);
    const [x, y] = await a.claim(2);
    const next = await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }]);
    const res = await a.claimCompleting(5, [x!, { id: y!.id, leaseToken: "not-the-token" }], { result: { frames: 3 } });
    expect(res.completionOutcomes.map((o) => [o.workItemId, o.ok, o.code])).toEqual([
      [x!.id, true, 0],
      [y!.id, false, Code.FailedPrecondition],
    ]);
    expect(ids(res.items).sort()).toEqual(next.map((n) => n.id).sort());
    expect(await itemRow(db, x!.id)).toMatchObject({ status: "completed", result: { frames: 3 }, lease_token: x!.leaseToken });
    // The refused one is untouched: still held under its real token.
    expect(await itemRow(db, y!.id)).toMatchObject({ status: "dispatched", lease_token: y!.leaseToken });
    expect(oks(await a.complete([y!]))).toEqual([true]);
  });

  it("answer at once even when nothing is left to claim and a wait was asked for", async () => {
    const t = "claim-completes-nowait";
    const a = await agent("claim-completes-nowait-a", { tenants: [t] });
    await p.enqueue(t, [{ engineKind: "dag" }]);
    const [x] = await a.claim(1);
    // Without the completion this claim would hold the call for the whole minute.
    const res = await a.claimCompleting(5, [x!], { waitMs: 60_000 });
    expect(res.items).toEqual([]);
    expect(oks(res.completionOutcomes)).toEqual([true]);
    expect((await itemRow(db, x!.id)).status).toBe("completed");
  });

  it("with wait_with_completions, apply them at once, wait for work, and bring their outcomes back with it", async () => {
    const t = "claim-completes-wait";
    const a = await agent("claim-completes-wait-a", { tenants: [t] });
    await p.enqueue(t, [{ engineKind: "dag" }]);
    const [x] = await a.claim(1);
    const pending = a.claimCompleting(5, [x!], { waitMs: 60_000, waitWithCompletions: true });
    // Completed before any work came: the wait does not hold the completion back.
    await vi.waitFor(async () => expect((await itemRow(db, x!.id)).status).toBe("completed"));
    const [next] = await p.enqueue(t, [{ engineKind: "dag" }]);
    const res = await pending;
    expect(ids(res.items)).toEqual([next!.id]);
    expect(oks(res.completionOutcomes)).toEqual([true]);
  });

  it("answer ok for a completion carried again after it was applied (a claim cut short after its commit)", async () => {
    const t = "claim-completes-again";
    const a = await agent("claim-completes-again-a", { tenants: [t] });
    await p.enqueue(t, [{ engineKind: "dag" }]);
    const [x] = await a.claim(1);
    expect(oks((await a.claimCompleting(5, [x!], { result: { n: 1 } })).completionOutcomes)).toEqual([true]);
    const row = await itemRow(db, x!.id);
    const again = await a.claimCompleting(5, [x!], { result: { n: 2 } });
    expect(oks(again.completionOutcomes)).toEqual([true]);
    expect(await itemRow(db, x!.id)).toEqual(row);
    // Another agent with the same token is not the one that completed it.
    const other = await agent("claim-completes-again-b", { tenants: [t] });
    expect(oks((await other.claimCompleting(5, [x!])).completionOutcomes)).toEqual([false]);
  });

  it("refuse a completion with bad JSON as INVALID_ARGUMENT, changing nothing and claiming nothing", async () => {
    const t = "claim-completes-bad";
    const a = await agent("claim-completes-bad-a", { tenants: [t] });
    await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }]);
    const [x] = await a.claim(1);
    const bad = a.conn.agent.claim({ name: a.name, maxItems: 5, completions: [{ workItemId: x!.id, leaseToken: x!.leaseToken, resultJson: "{nope" }] }, { headers: { authorization: `Bearer ${TOKENS.agent}` } });
    expect(await codeOf(bad)).toBe(Code.InvalidArgument);
    expect((await itemRow(db, x!.id)).status).toBe("dispatched");
    expect(await statusCounts(db, t)).toEqual({ dispatched: 1, pending: 1 });
  });
});

describe("fencing", () => {
  it("a zombie whose lease expired cannot complete after the item went to another agent; the second completion stands", async () => {
    const t = "zombie";
    const [za, zb] = [await agent("zombie-a", { tenants: [t] }), await agent("zombie-b", { tenants: [t] })];
    const watch = new DirectiveWatch(za);
    closers.push(() => watch.close());
    await watch.ready();
    const id = await p.one(t, { engineKind: "dag", maxRetries: 3, payloadJson: '{"job":"render"}' });
    const claimedAt = clock.nowMs();
    const [first] = await za.claim(1);
    expect(first).toMatchObject({ id, agentId: "zombie-a", leasedBy: "queue-sem", leaseExpiresAtNs: BigInt(nsText(claimedAt + LEASE)) });

    // A pauses past its lease (its heartbeats still arrive: it is alive, just stuck). The sweep
    // takes the item back, an attempt spent, due again after the first backoff.
    clock.advance(LEASE + 1);
    await keepAlive([za, zb]);
    await daemon.maintenance.runOnce();
    const now = clock.nowMs();
    expect(await itemRow(db, id)).toMatchObject({
      status: "pending",
      retry_count: 1,
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
    expect(second).toMatchObject({ id, agentId: "zombie-b", retryCount: 1 });
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
    expect(await itemRow(db, id)).toMatchObject({ status: "completed", agent_id: "zombie-b", result: { by: "zombie-b" }, lease_token: second!.leaseToken, retry_count: 1 });
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
    const [x, y] = ids(await p.enqueue(t, [{ engineKind: "dag", priority: 0 }, { engineKind: "dag", priority: 1 }]));
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

describe("retries, backoff and dead letters", () => {
  it("a retryable failure re-queues with retry_count + 1 after min(cap, base × 2^n); at max_retries the item fails and keeps its error", async () => {
    const t = "backoff";
    const a = await agent("backoff-1", { tenants: [t] });
    const id = await p.one(t, { engineKind: "dag", maxRetries: 4 });
    const delays = [1_000, 2_000, 4_000, 5_000]; // the last one capped (base × 2^3 = 8 s)
    for (const [n, delay] of delays.entries()) {
      const [item] = await a.claim(1);
      expect(item).toMatchObject({ id, retryCount: n });
      const now = clock.nowMs();
      expect(oks(await a.fail([item!], { error: `attempt ${n} broke`, retryable: true }))).toEqual([true]);
      expect(await itemRow(db, id)).toMatchObject({
        status: "pending",
        retry_count: n + 1,
        next_attempt_at: nsText(now + delay),
        error: `attempt ${n} broke`,
        agent_id: null,
        lease_token: null,
        lease_expires_at: null,
      });
      clock.advance(delay - 1);
      expect(await a.claim(1)).toEqual([]);
      clock.advance(1);
    }
    const [last] = await a.claim(1);
    expect(last).toMatchObject({ id, retryCount: 4 });
    const now = clock.nowMs();
    expect(oks(await a.fail([last!], { error: "still broken", retryable: true }))).toEqual([true]);
    expect(await itemRow(db, id)).toMatchObject({ status: "failed", retry_count: 4, error: "still broken", completed_at: nsText(now), lease_token: null });
    clock.advance(CAP * 10);
    expect(await a.claim(1)).toEqual([]);
    expect(await p.item(t, id)).toMatchObject({ status: WorkItemStatus.FAILED, error: "still broken" });
  });

  it("a non-retryable failure is a dead letter at once; a retryable one honours the asked retry delay; max_retries 0 means no retry", async () => {
    const t = "failmodes";
    const a = await agent("failmodes-1", { tenants: [t] });
    const [fatal, delayed, once] = ids(
      await p.enqueue(t, [
        { engineKind: "dag", maxRetries: 5, taskName: "fatal" },
        { engineKind: "dag", maxRetries: 5, taskName: "delayed" },
        { engineKind: "dag", maxRetries: 0, taskName: "once" },
      ]),
    ) as [string, string, string];
    const items = await a.claim(3);
    const byId = new Map(items.map((i) => [i.id, i]));
    expect(new Set(byId.keys())).toEqual(new Set([fatal, delayed, once]));
    const now = clock.nowMs();
    expect(oks(await a.fail([byId.get(fatal)!], { error: "bad input", retryable: false }))).toEqual([true]);
    expect(oks(await a.fail([byId.get(delayed)!], { error: "rate limited", retryable: true, retryDelayMs: 7_500 }))).toEqual([true]);
    expect(oks(await a.fail([byId.get(once)!], { error: "flaky", retryable: true }))).toEqual([true]);
    expect(await itemRow(db, fatal)).toMatchObject({ status: "failed", retry_count: 0, error: "bad input" });
    expect(await itemRow(db, once)).toMatchObject({ status: "failed", retry_count: 0, error: "flaky" });
    expect(await itemRow(db, delayed)).toMatchObject({ status: "pending", retry_count: 1, next_attempt_at: nsText(now + 7_500), error: "rate limited" });
    clock.advance(7_499);
    expect(await a.claim(3)).toEqual([]);
    clock.advance(1);
    expect(ids(await a.claim(3))).toEqual([delayed]);
  });

  it("an expired lease with no retries left makes the item a dead letter", async () => {
    const t = "expiry-dead";
    const a = await agent("expiry-dead-1", { tenants: [t] });
    const id = await p.one(t, { engineKind: "dag", maxRetries: 0 });
    await a.claim(1);
    clock.advance(LEASE + 1);
    await keepAlive([a]);
    await daemon.maintenance.runOnce();
    expect(await itemRow(db, id)).toMatchObject({ status: "failed", retry_count: 0, error: "lease expired", completed_at: nsText(clock.nowMs()), lease_token: null });
    // A producer waiting for it hears that it finished.
    const res = await p.q.wait({ tenantKey: t, ids: [id] }, p.call);
    expect(res).toMatchObject({ done: true });
    expect(res.items[0]!.status).toBe(WorkItemStatus.FAILED);
  });

  it("redrive puts chosen dead letters back to pending with a fresh retry budget, and touches nothing else", async () => {
    const t = "redrive";
    const a = await agent("redrive-1", { tenants: [t] });
    const [dead1, dead2, done] = ids(
      await p.enqueue(t, [
        { engineKind: "dag", maxRetries: 1, taskName: "dead1" },
        { engineKind: "dag", maxRetries: 1, taskName: "dead2" },
        { engineKind: "dag", taskName: "done" },
      ]),
    ) as [string, string, string];
    const items = await a.claim(3);
    const byId = new Map(items.map((i) => [i.id, i]));
    await a.fail([byId.get(dead1)!, byId.get(dead2)!], { error: "no", retryable: false });
    await a.complete([byId.get(done)!]);
    const otherTenant = await p.one("redrive-other", { engineKind: "dag" });
    await db.raw(`UPDATE ${db.tables.qualified("work_item")} SET status = 'failed' WHERE id = $1`, [otherTenant]);

    const now = clock.nowMs();
    const redriven = await store().redrive(t, { ids: [dead1, done, otherTenant], runId: null, all: false }, now, "ops-test");
    expect(redriven).toEqual([dead1]);
    expect(await itemRow(db, dead1)).toMatchObject({ status: "pending", retry_count: 0, next_attempt_at: nsText(now), completed_at: null, agent_id: null, updatedby: "ops-test" });
    expect(await itemRow(db, dead2)).toMatchObject({ status: "failed" });
    expect(await itemRow(db, done)).toMatchObject({ status: "completed" });
    expect(await itemRow(db, otherTenant)).toMatchObject({ status: "failed" });

    // The redriven item runs again, with its whole budget: one retryable failure re-queues it.
    const [again] = await a.claim(3);
    expect(again).toMatchObject({ id: dead1, retryCount: 0 });
    await a.fail([again!], { error: "once more", retryable: true });
    expect(await itemRow(db, dead1)).toMatchObject({ status: "pending", retry_count: 1 });

    // By run: every failed item of the run.
    const runItems = ids(await p.enqueue(t, [0, 1].map(() => ({ engineKind: "dag", runId: "run-r", maxRetries: 0 }))));
    clock.advance(BASE);
    const taken = await a.claim(5);
    const claimed = taken.filter((i) => runItems.includes(i.id));
    expect(claimed).toHaveLength(2);
    // dead1 came due again too: hand it back without spending an attempt.
    expect(oks(await a.release(taken.filter((i) => !runItems.includes(i.id))))).toEqual([true]);
    await a.fail(claimed, { retryable: false });
    expect(new Set(await store().redrive(t, { ids: [], runId: "run-r", all: false }, clock.nowMs(), "ops-test"))).toEqual(new Set(runItems));
    expect(await statusCounts(db, t)).toEqual({ pending: 3, failed: 1, completed: 1 });
  });
});

describe("what a claim takes, and in what order", () => {
  it("an item is not claimable before its not-before time; a waiting claim wakes when the clock passes it", async () => {
    const t = "notbefore";
    const a = await agent("notbefore-1", { tenants: [t] });
    const id = await p.one(t, { engineKind: "dag", notBefore: notBefore(clock.nowMs() + 5_000) });
    expect((await itemRow(db, id)).next_attempt_at).toBe(nsText(clock.nowMs() + 5_000));
    expect(await a.claim(1)).toEqual([]);
    clock.advance(4_999);
    expect(await a.claim(1)).toEqual([]);

    const t0 = await serverNow(db);
    const claim = track(a.claim(1, 10_000));
    await untilStatementRan(db, STATEMENT.claim, t0);
    expect(claim.settled()).toBe(false);
    clock.advance(1);
    const start = performance.now();
    await daemon.maintenance.runOnce();
    expect(ids(await claim.promise)).toEqual([id]);
    expect(claim.settledAt()! - start).toBeLessThan(PROMPT_MS);
  });

  it("takes lower priority first, and first-in-first-out within a priority", async () => {
    const t = "order";
    const a = await agent("order-1", { tenants: [t] });
    // One Enqueue call per item with the clock standing still: only the order of arrival orders them.
    const specs: [string, number][] = [
      ["a", 3],
      ["b", 1],
      ["c", 3],
      ["d", 0],
      ["e", 1],
      ["f", 3],
      ["g", 1],
    ];
    for (const [name, priority] of specs) await p.one(t, { engineKind: "dag", priority, taskName: name });
    const taken: string[] = [];
    for (;;) {
      const [item] = await a.claim(1);
      if (!item) break;
      taken.push(item.taskName);
      await a.complete([item]);
    }
    expect(taken).toEqual(["d", "b", "e", "g", "a", "c", "f"]);

    // Within one batch too, and a batch claim takes the first ones in that order.
    const batch = "abcdefghij".split("");
    await p.enqueue(t, batch.map((name) => ({ engineKind: "dag", priority: 2, taskName: name })));
    // (Which items a batch claim takes is the dispatch order; the order inside a reply is not specified.)
    const first = await a.claim(5);
    expect(new Set(first.map((i) => i.taskName))).toEqual(new Set(batch.slice(0, 5)));
    expect(new Set((await a.claim(5)).map((i) => i.taskName))).toEqual(new Set(batch.slice(5)));
  });

  it("an agent only gets work of the tenants it serves and the engine kinds it runs", async () => {
    const [t1, t2] = ["iso-1", "iso-2"];
    const only1 = await agent("iso-t1", { tenants: [t1] });
    const only2 = await agent("iso-t2", { tenants: [t2] });
    const graph1 = await agent("iso-graph", { tenants: [t1], engineKinds: ["graph"] });
    const both = await agent("iso-both", { tenants: [t1, t2], engineKinds: ["dag", "graph"] });
    // The other tenant's work is older and more urgent: it must still not be taken.
    const t2Items = ids(await p.enqueue(t2, [{ engineKind: "dag", priority: 0 }, { engineKind: "dag", priority: 0 }]));
    const [t1Dag, t1Graph, t1Other] = ids(
      await p.enqueue(t1, [
        { engineKind: "dag", priority: 5 },
        { engineKind: "graph", priority: 5 },
        { engineKind: "statemachine", priority: 0 },
      ]),
    );
    expect(ids(await only1.claim(5))).toEqual([t1Dag]);
    expect(ids(await graph1.claim(5))).toEqual([t1Graph]);
    expect(new Set(ids(await only2.claim(5)))).toEqual(new Set(t2Items));
    expect(await both.claim(5)).toEqual([]);
    expect((await itemRow(db, t1Other!)).status).toBe("pending");
  });

  it("an item's selector must be contained in the agent's tags", async () => {
    const t = "selector";
    const h100eu = await agent("sel-h100-eu", { tenants: [t], tags: { gpu: "h100", zone: "eu", rack: "7" } });
    const a100eu = await agent("sel-a100-eu", { tenants: [t], tags: { gpu: "a100", zone: "eu" } });
    const untagged = await agent("sel-plain", { tenants: [t] });
    const [h100, h100us, eu, anyone] = ids(
      await p.enqueue(t, [
        { engineKind: "dag", priority: 0, workerParams: { selector: { gpu: "h100" } } },
        { engineKind: "dag", priority: 0, workerParams: { selector: { gpu: "h100", zone: "us" } } },
        { engineKind: "dag", priority: 0, workerParams: { selector: { zone: "eu" } } },
        { engineKind: "dag", priority: 1 },
      ]),
    );
    expect(ids(await untagged.claim(5))).toEqual([anyone]);
    expect(ids(await a100eu.claim(5))).toEqual([eu]);
    expect(ids(await h100eu.claim(5))).toEqual([h100]);
    expect(await itemRow(db, h100us!)).toMatchObject({ status: "pending" });
    expect((await p.item(t, h100us!)).workerParams?.selector).toEqual({ gpu: "h100", zone: "us" });
  });

  it("max_items over the daemon's cap is clamped to it", async () => {
    const t = "clamp";
    const a = await agent("clamp-1", { tenants: [t] });
    await p.enqueue(t, Array.from({ length: 8 }, () => ({ engineKind: "dag" })));
    expect(await a.claim(1_000)).toHaveLength(5);
    expect(await a.claim(1_000)).toHaveLength(3);
    expect(await statusCounts(db, t)).toEqual({ dispatched: 8 });
  });
});

describe("cancel", () => {
  it("a pending item is cancelled at once and never dispatched", async () => {
    const t = "cancel-pending";
    const a = await agent("cxp-1", { tenants: [t] });
    const [doomed, kept] = ids(await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }]));
    const res = await p.q.cancel({ tenantKey: t, ids: [doomed!], reason: "not needed" }, p.call);
    expect(res.cancelledIds).toEqual([doomed]);
    expect(await itemRow(db, doomed!)).toMatchObject({ status: "cancelled", error: "not needed", completed_at: nsText(clock.nowMs()) });
    expect((await p.item(t, doomed!)).status).toBe(WorkItemStatus.CANCELLED);
    expect(ids(await a.claim(5))).toEqual([kept]);
    // Cancelling again, or from another tenant, cancels nothing.
    expect((await p.q.cancel({ tenantKey: t, ids: [doomed!] }, p.call)).cancelledIds).toEqual([]);
    expect((await p.q.cancel({ tenantKey: "cancel-elsewhere", ids: [kept!] }, p.call)).cancelledIds).toEqual([]);
    expect((await itemRow(db, kept!)).status).toBe("dispatched");

    // A run's unfinished items, at once.
    const run = ids(await p.enqueue(t, [0, 1, 2].map(() => ({ engineKind: "dag", runId: "run-c" }))));
    const other = await p.one(t, { engineKind: "dag", runId: "run-keep" });
    expect(new Set((await p.q.cancel({ tenantKey: t, runId: "run-c" }, p.call)).cancelledIds)).toEqual(new Set(run));
    expect((await itemRow(db, other)).status).toBe("pending");
  });

  it("a dispatched item is cancelled and its agent told so (stream and heartbeat); its late completion is refused (stock grpc-js agent)", async () => {
    const t = "cancel-dispatched";
    const name = "cxd-grpc";
    const client: grpc.Client = agentClient(daemon.address);
    closers.push(() => client.close());
    await ok(client, "register", registerRequest(name, { metadata: { tenants: [t], engineKinds: ["dag"], tags: {}, slots: 1 } }));
    const stream = watchDirectives(client, name);
    closers.push(() => stream.close());
    expect((await stream.next()).status?.status).toBe("AGENT_STATUS_ACTIVE");

    const id = await p.one(t, { engineKind: "dag" });
    const claimed = await ok<{ items: { id: string; leaseToken: string; status: string }[] }>(client, "claim", { name, maxItems: 1 });
    expect(claimed.items.map((i) => [i.id, i.status])).toEqual([[id, "WORK_ITEM_STATUS_DISPATCHED"]]);
    const token = claimed.items[0]!.leaseToken;

    const res = await p.q.cancel({ tenantKey: t, ids: [id], reason: "user changed their mind" }, p.call);
    expect(res.cancelledIds).toEqual([id]);
    expect(await itemRow(db, id)).toMatchObject({ status: "cancelled", lease_token: null, error: "user changed their mind" });
    const pushed = await stream.next();
    expect(pushed).toMatchObject({ kind: "cancel", cancel: { workItemId: id, leaseToken: token, reason: "user changed their mind" } });
    const hb = await ok<HeartbeatReply>(client, "heartbeat", { name });
    expect(hb.directives.filter((d: DirectiveWire) => d.kind === "cancel").map((d) => d.cancel)).toEqual([{ workItemId: id, leaseToken: token, reason: "user changed their mind" }]);

    const late = await ok<{ outcomes: { workItemId: string; ok: boolean; code: number; message: string }[] }>(client, "complete", {
      name,
      items: [{ workItemId: id, leaseToken: token, resultJson: '{"too":"late"}' }],
    });
    expect(late.outcomes).toMatchObject([{ workItemId: id, ok: false, code: Code.FailedPrecondition }]);
    expect(late.outcomes[0]!.message).toContain("lease lost");
    expect(await itemRow(db, id)).toMatchObject({ status: "cancelled", result: null });
  });

  it("cancelling a parent cancels its unfinished children and leaves finished ones; the parent shows its children's counts", async () => {
    const t = "fanout";
    const a = await agent("fanout-1", { tenants: [t] });
    const parent = await p.one(t, { engineKind: "orchestrate", taskName: "parent" });
    const [c1, c2, c3, c4] = ids(
      await p.enqueue(t, [0, 1, 2, 2].map((priority, i) => ({ engineKind: "dag", priority, parentWorkItemId: parent, taskName: `child-${i + 1}` }))),
    ) as [string, string, string, string];
    const [first] = await a.claim(1);
    expect(first!.id).toBe(c1);
    await a.complete([first!], { ok: 1 });
    const [second] = await a.claim(1);
    expect(second!.id).toBe(c2);

    const before = await p.get(t, parent);
    expect(before.children).toMatchObject({ pending: 2, dispatched: 1, completed: 1, failed: 0, cancelled: 0 });
    const listed = await p.q.listItems({ tenantKey: t, parentWorkItemId: parent }, p.call);
    expect(ids(listed.items)).toEqual([c1, c2, c3, c4]);
    const c1Before = await itemRow(db, c1);

    clock.advance(10);
    const res = await p.q.cancel({ tenantKey: t, parentIds: [parent] }, p.call);
    expect(new Set(res.cancelledIds)).toEqual(new Set([parent, c2, c3, c4]));
    expect(await itemRow(db, c1)).toEqual(c1Before);
    for (const id of [c2, c3, c4]) expect((await itemRow(db, id)).status).toBe("cancelled");
    const after = await p.get(t, parent);
    expect(after.item?.status).toBe(WorkItemStatus.CANCELLED);
    expect(after.children).toMatchObject({ pending: 0, dispatched: 0, completed: 1, failed: 0, cancelled: 3 });
    expect(oks(await a.complete([second!]))).toEqual([false]);
    // An item without children has no counts.
    expect((await p.get(t, c1)).children).toBeUndefined();
  });
});

describe("agent liveness", () => {
  it("an agent that goes inactive gives its dispatched items back at once, not when their leases end", async () => {
    const t = "liveness";
    const gone = await agent("liveness-gone", { tenants: [t] });
    const alive = await agent("liveness-alive", { tenants: [t] });
    const held = ids(await p.enqueue(t, [{ engineKind: "dag", maxRetries: 3 }, { engineKind: "dag", maxRetries: 3 }]));
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
        retry_count: 1,
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
    await p.enqueue(t, [0, 1, 2].map((priority) => ({ engineKind: "dag", priority, maxRetries: 2 })));
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
    expect(await itemRow(db, lapsed.id)).toMatchObject({ status: "pending", retry_count: 1, error: "lease expired" });
    expect((await itemRow(db, cancelled.id)).status).toBe("cancelled");
    expect(oks(await a.complete([kept]))).toEqual([true]);
  });
});

describe("ListItems", () => {
  it("pages in priority, creation order with page tokens, and an empty token after the last page", async () => {
    const t = "paging";
    const priorities = [2, 0, 1, 0, 2];
    const created: string[] = [];
    for (const priority of priorities) {
      created.push(await p.one(t, { engineKind: "dag", priority }));
      clock.advance(1);
    }
    const expected = [1, 3, 2, 0, 4].map((i) => created[i]!);
    const pages: string[][] = [];
    const tokens: string[] = [];
    let pageToken = "";
    do {
      const res = await p.q.listItems({ tenantKey: t, pageSize: 2, pageToken }, p.call);
      pages.push(ids(res.items));
      tokens.push(res.nextPageToken);
      pageToken = res.nextPageToken;
    } while (pageToken !== "" && pages.length < 10);
    expect(pages).toEqual([expected.slice(0, 2), expected.slice(2, 4), expected.slice(4)]);
    expect(tokens.map((tk) => tk !== "")).toEqual([true, true, false]);

    // Filters: a status filter over the same order.
    const a = await agent("paging-1", { tenants: [t] });
    await a.claim(1);
    const list = async (filter: { statuses?: WorkItemStatus[]; agentId?: string; runId?: string; engineKind?: string }) =>
      ids((await p.q.listItems({ tenantKey: t, pageSize: 10, ...filter }, p.call)).items);
    expect(await list({ statuses: [WorkItemStatus.PENDING] })).toEqual(expected.slice(1));
    expect(await list({ statuses: [WorkItemStatus.DISPATCHED, WorkItemStatus.COMPLETED] })).toEqual(expected.slice(0, 1));
    expect(await list({ agentId: "paging-1" })).toEqual(expected.slice(0, 1));
    const [graph] = ids(await p.enqueue(t, [{ engineKind: "graph", runId: "run-p", priority: 9 }]));
    expect(await list({ engineKind: "graph" })).toEqual([graph]);
    expect(await list({ runId: "run-p" })).toEqual([graph]);
    expect(await list({ engineKind: "dag", runId: "run-p" })).toEqual([]);
    expect(await codeOf(p.q.listItems({ tenantKey: t, pageToken: "not-a-token" }, p.call))).toBe(Code.InvalidArgument);
  });
});

describe("bad input is refused and changes nothing", () => {
  it("refuses each bad Enqueue with its code, with no row written", async () => {
    const t1 = new Producer(daemon.address, TOKENS.engineT1);
    const asAgent = new Producer(daemon.address, TOKENS.agent);
    closers.push(() => t1.close(), () => asAgent.close());
    const valid = { engineKind: "dag", payloadJson: '{"ok":true}' };
    const before = await countItems(db);
    const refusals: [string, Promise<unknown>, Code][] = [
      ["tenant outside the token", t1.enqueue("t2", [valid]), Code.PermissionDenied],
      ["payload over the cap", p.enqueue("bad", [valid, { engineKind: "dag", payloadJson: JSON.stringify({ blob: "x".repeat(3000) }) }]), Code.ResourceExhausted],
      ["negative priority", p.enqueue("bad", [valid, { engineKind: "dag", priority: -1 }]), Code.InvalidArgument],
      ["negative max_retries", p.enqueue("bad", [valid, { engineKind: "dag", maxRetries: -1 }]), Code.InvalidArgument],
      ["payload that is not JSON", p.enqueue("bad", [valid, { engineKind: "dag", payloadJson: '{"unterminated": ' }]), Code.InvalidArgument],
      ["unknown parent", p.enqueue("bad", [valid, { engineKind: "dag", parentWorkItemId: "01NOSUCHPARENT0000000000000" }]), Code.InvalidArgument],
      ["no engine kind", p.enqueue("bad", [valid, { engineKind: "" }]), Code.InvalidArgument],
      ["no items", p.enqueue("bad", []), Code.InvalidArgument],
      ["agent token on the queue service", asAgent.enqueue("bad", [valid]), Code.PermissionDenied],
    ];
    const got = await Promise.all(refusals.map(async ([what, call]) => [what, await codeOf(call)]));
    expect(got).toEqual(refusals.map(([what, , code]) => [what, code]));
    expect(await countItems(db)).toBe(before);
    // The t1 token works for t1, and reads of other tenants are refused too.
    const id = await t1.one("t1", valid);
    expect(await codeOf(t1.get("t2", id))).toBe(Code.PermissionDenied);
    expect(await codeOf(p.get("t2", id))).toBe(Code.NotFound);
    expect(await codeOf(t1.q.cancel({ tenantKey: "t2", ids: [id] }, t1.call))).toBe(Code.PermissionDenied);
    expect(await countItems(db)).toBe(before + 1);
  });

  it("refuses bad agent calls without touching the item", async () => {
    const t = "bad-agent";
    const a = await agent("bad-agent-1", { tenants: [t] });
    const id = await p.one(t, { engineKind: "dag" });
    const [item] = await a.claim(1);
    const before = await itemRow(db, id);
    const completeWith = (resultJson: string) =>
      a.conn.agent.complete({ name: a.name, items: [{ workItemId: id, leaseToken: item!.leaseToken, resultJson }] }, { headers: { authorization: `Bearer ${TOKENS.agent}` } });
    expect(await codeOf(completeWith("{not json"))).toBe(Code.InvalidArgument);
    expect(await codeOf(completeWith(JSON.stringify({ blob: "x".repeat(3000) })))).toBe(Code.ResourceExhausted);
    expect(await codeOf(a.complete([]))).toBe(Code.InvalidArgument);
    expect(await codeOf(a.conn.agent.claim({ name: "never-registered", maxItems: 1 }, { headers: { authorization: `Bearer ${TOKENS.agent}` } }))).toBe(Code.NotFound);
    expect(await codeOf(a.conn.agent.claim({ name: a.name, maxItems: 1 }, { headers: { authorization: `Bearer ${TOKENS.engine}` } }))).toBe(Code.PermissionDenied);
    expect(await itemRow(db, id)).toEqual(before);
    expect(oks(await a.complete([item!], { fine: true }))).toEqual([true]);
  });
});

describe("idempotent enqueue against a concurrent writer", () => {
  it("a batch whose key another transaction holds waits for it instead of deadlocking with it", async () => {
    // Another daemon's batch is mid-statement: it has written key-a and is about to write key-b.
    // Our batch lists key-b before key-a. Were keys written in request order, ours would hold key-b
    // while waiting for key-a, and the other would wait for key-b: a deadlock, which Postgres breaks
    // by failing one of them. The other side checks for deadlocks first (its deadlock_timeout is
    // short), so a deadlock shows as its insert failing (our side's pool would retry, after 1 s).
    const t = "idem-lock";
    const q = db.tables.qualified("work_item");
    const other = new pg.Client({ connectionString: db.url });
    await other.connect();
    closers.push(() => other.end());
    const insert = (id: string, key: string) =>
      other.query(
        `INSERT INTO ${q} (id, tenant_key, engine_id, engine_kind, status, priority, next_attempt_at, retry_count, max_retries, idempotency_key, createdby, createdon)
         VALUES ($1, $2, 'other', 'dag', 'pending', 0, 0, 0, 0, $3, 'other', now())`,
        [id, t, key],
      );
    await other.query("SET deadlock_timeout = '20ms'");
    await other.query("BEGIN");
    await insert("OTHER-A", "key-a");
    const ours = track(p.enqueue(t, [{ engineKind: "dag", idempotencyKey: "key-b" }, { engineKind: "dag", idempotencyKey: "key-a" }]));
    await untilLockWait(db, STATEMENT.insert);
    const second = await insert("OTHER-B", "key-b").then(
      () => "ok",
      (err: Error) => err.message,
    );
    await other.query(second === "ok" ? "COMMIT" : "ROLLBACK");
    const res = await ours.promise.then(
      (r) => r,
      (err: Error) => err.message,
    );
    expect(second).toBe("ok");
    expect(res).toEqual([
      { id: "OTHER-B", existing: true },
      { id: "OTHER-A", existing: true },
    ]);
    expect(await statusCounts(db, t)).toEqual({ pending: 2 });
  });
});
