/**
 * Retries: a retryable failure re-queues after min(cap, base × 2^n), a non-retryable one or spent
 * retries make a dead letter, an expired lease spends an attempt, and redrive gives dead letters a
 * fresh budget.
 *
 * On the daemon of test/support/queue-daemon.ts: one daemon, a fake clock, sweeps run by the tests.
 */
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { Code } from "@connectrpc/connect";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { refusal } from "./support/kit.js";
import type { TestDb } from "./support/db.js";
import { itemRow, nsText, type Producer, statusCounts } from "./support/queue.js";
import { BASE, CAP, LEASE, ids, oks, useQueueDaemon } from "./support/queue-daemon.js";

const fx = useQueueDaemon("qretry");
const { clock, agent, keepAlive, store } = fx;
// The file's schema, daemon and producer, once the fixture's beforeAll has made them.
let db: TestDb, daemon: Daemon, p: Producer;
beforeAll(() => void ({ db, daemon, p } = fx));

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

  it("an expired lease spends a redelivery, never a retry; once its redeliveries are spent the item is a dead letter that says so", async () => {
    const t = "expiry-dead";
    const a = await agent("expiry-dead-1", { tenants: [t] });
    const id = await p.one(t, { engineKind: "dag", maxRetries: 0, maxRedeliveries: 1 });
    await a.claim(1);
    clock.advance(LEASE + 1);
    await keepAlive([a]);
    await daemon.maintenance.runOnce();
    // Its agent lost it (with max_retries 0, spending a retry would have failed it).
    expect(await itemRow(db, id)).toMatchObject({ status: "pending", retry_count: 0, redelivery_count: 1, max_redeliveries: 1, error: "lease expired" });
    clock.advance(BASE);
    expect(ids(await a.claim(1))).toEqual([id]);
    clock.advance(LEASE + 1);
    await keepAlive([a]);
    await daemon.maintenance.runOnce();
    expect(await itemRow(db, id)).toMatchObject({
      status: "failed",
      retry_count: 0,
      redelivery_count: 2,
      error: "lost its lease 2 times (lease expired): the agents running it died, hung or were cut off",
      completed_at: nsText(clock.nowMs()),
      lease_token: null,
    });
    // A producer waiting for it hears that it finished.
    const res = await p.q.wait({ tenantKey: t, ids: [id] }, p.call);
    expect(res).toMatchObject({ done: true });
    expect(res.items[0]).toMatchObject({ status: WorkItemStatus.FAILED, redeliveryCount: 2, maxRedeliveries: 1 });
  });

  it("an item's redelivery budget is the daemon's --max-redeliveries unless its Enqueue says, from 0 to 1000", async () => {
    const t = "redelivery-budget";
    const [byDefault, none] = await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag", maxRedeliveries: 0 }]);
    expect((await itemRow(db, byDefault!.id)).max_redeliveries).toBe(3);
    expect((await itemRow(db, none!.id)).max_redeliveries).toBe(0);
    for (const bad of [-1, 1001]) {
      const err = await refusal(p.enqueue(t, [{ engineKind: "dag", maxRedeliveries: bad }]));
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.rawMessage).toContain("items[0].max_redeliveries");
    }
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
    expect(await itemRow(db, dead1)).toMatchObject({
      status: "pending",
      retry_count: 0,
      next_attempt_at: nsText(now),
      completed_at: null,
      agent_id: null,
      updatedby: "ops-test",
    });
    expect(await itemRow(db, dead2)).toMatchObject({ status: "failed" });
    expect(await itemRow(db, done)).toMatchObject({ status: "completed" });
    expect(await itemRow(db, otherTenant)).toMatchObject({ status: "failed" });

    // The redriven item runs again, with its whole budget: one retryable failure re-queues it.
    const [again] = await a.claim(3);
    expect(again).toMatchObject({ id: dead1, retryCount: 0 });
    await a.fail([again!], { error: "once more", retryable: true });
    expect(await itemRow(db, dead1)).toMatchObject({ status: "pending", retry_count: 1 });

    // By run: every failed item of the run.
    const runItems = ids(
      await p.enqueue(
        t,
        [0, 1].map(() => ({ engineKind: "dag", runId: "run-r", maxRetries: 0 })),
      ),
    );
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
