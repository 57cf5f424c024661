/**
 * The work queue across two daemon instances sharing one schema, over real HTTP/2 connections and a
 * real Postgres: expiry sweeps on both at once, idempotent enqueue across daemons, and wake-ups
 * (claims and Wait) that cross daemons through LISTEN/NOTIFY instead of the fallback poll. No double
 * dispatch under thousands of concurrent claims is queue-cluster-load.test.ts (slow tier).
 *
 * The fake clock moves only where a test says so (the expiry sweeps), so no lease runs out while the
 * agents work.
 */
import { beforeAll, describe, expect, it, onTestFinished, vi } from "vitest";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { Wakeups } from "../src/queue/wakeups.js";
import type { TestDb } from "./support/db.js";
import { useTestCluster } from "./support/kit.js";
import { itemRows, Producer, serverNow, STATEMENT, statusCounts, TestAgent, track, untilStatementRan, type WorkItem } from "./support/queue.js";

const clock = new FakeClock(Date.UTC(2026, 2, 1));
const config = (instanceId: string) => ({
  instanceId,
  // Timers never fire during the test; nothing here depends on them.
  sweepInterval: 3_600_000,
  heartbeatFlush: 3_600_000,
  claimMaxItems: 256,
});

const fx = useTestCluster("qclu", { clock, instances: ["queue-a", "queue-b"], config });
let db: TestDb;
let A: Daemon;
let B: Daemon;

beforeAll(() => {
  db = fx.db;
  [A, B] = fx.daemons;
});

const agent = async (d: Daemon, name: string, tenant: string, extra: { engineKinds?: string[] } = {}) => {
  const a = await TestAgent.register(d.address, name, { tenants: [tenant], engineKinds: extra.engineKinds ?? ["dag"] });
  return fx.closers.add(a);
};
const producer = (d: Daemon) => fx.closers.add(new Producer(d.address));
const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/**
 * How each wait for a wake-up, on any daemon, ends from now until the test finishes: true when a
 * ring woke it, false when it ran out or was aborted. Nothing rings a daemon's waiters on a timer
 * here (the fallback re-check is a maintenance task, whose timers are parked, and these tests run
 * none): a waiter woken after work arrived through the other daemon was woken by that daemon's
 * notification.
 */
function waitEndings(): boolean[] {
  const endings: boolean[] = [];
  const arm = Wakeups.prototype.arm;
  const spy = vi.spyOn(Wakeups.prototype, "arm").mockImplementation(function (this: Wakeups, keys, capacity, onWake) {
    const armed = arm.call(this, keys, capacity, onWake);
    return {
      disarm: () => armed.disarm(),
      setCapacity: (n) => armed.setCapacity(n),
      wait: async (timeoutMs, signals) => {
        const rung = await armed.wait(timeoutMs, signals);
        endings.push(rung);
        return rung;
      },
    };
  });
  onTestFinished(() => spy.mockRestore());
  return endings;
}

describe("expiry sweeps on every daemon", () => {
  it("two daemons sweeping at once while the holder completes late: each item ends completed or re-queued once, never both", async () => {
    const tenant = "sweep-race";
    const N = 300;
    const holder = await agent(A, "sweep-holder", tenant);
    await producer(A).enqueue(
      tenant,
      range(N).map(() => ({ engineKind: "dag", maxRetries: 3 })),
    );
    const held: WorkItem[] = [];
    while (held.length < N) held.push(...(await holder.claim(256)));
    expect(held).toHaveLength(N);

    // Every lease has run out (the holder is alive: its heartbeat is written, so only expiry acts).
    clock.advance(30_001);
    await holder.heartbeat();
    await A.maintenance.flushHeartbeats();
    const [, , outcomes] = await Promise.all([A.maintenance.runOnce(), B.maintenance.runOnce(), holder.complete(held, { late: true })]);

    const completed = new Set(outcomes.filter((o) => o.ok).map((o) => o.workItemId));
    const rows = await itemRows(db, "tenant_key = $1", [tenant]);
    expect(rows).toHaveLength(N);
    for (const r of rows) {
      if (completed.has(r.id)) expect(r).toMatchObject({ status: "completed", retry_count: 0, result: { late: true }, agent_id: "sweep-holder" });
      else expect(r).toMatchObject({ status: "pending", retry_count: 0, redelivery_count: 1, result: null, error: "lease expired", agent_id: null });
    }
    const counts = await statusCounts(db, tenant);
    expect((counts.completed ?? 0) + (counts.pending ?? 0)).toBe(N);
    // Sweeping again changes nothing.
    await Promise.all([A.maintenance.runOnce(), B.maintenance.runOnce()]);
    expect(await statusCounts(db, tenant)).toEqual(counts);
  });
});

describe("idempotent enqueue across daemons", () => {
  it("the same (tenant, key) through daemon A and daemon B at once yields one item and one id", async () => {
    const tenant = "idem";
    const [pa, pb] = [producer(A), producer(B)];
    for (const round of range(5)) {
      const item = { engineKind: "dag", idempotencyKey: `order-${round}`, payloadJson: `{"round":${round}}` };
      const [[ra], [rb]] = await Promise.all([pa.enqueue(tenant, [item]), pb.enqueue(tenant, [item])]);
      expect(ra!.id).toBe(rb!.id);
      expect([ra!.existing, rb!.existing].sort()).toEqual([false, true]);
    }
    const rows = await itemRows(db, "tenant_key = $1", [tenant]);
    expect(rows.map((r) => r.idempotency_key).sort()).toEqual(range(5).map((r) => `order-${r}`));
    // The key is per tenant: another tenant's item with the same key is a different item.
    const [other] = await pa.enqueue("idem-other", [{ engineKind: "dag", idempotencyKey: "order-0" }]);
    expect(other!.existing).toBe(false);
    expect(rows.map((r) => r.id)).not.toContain(other!.id);
  });

  it("four producers on two daemons enqueue overlapping batches, their keys in different orders: one item per key, every reply agrees", async () => {
    const tenant = "idem-batch";
    const producers = [producer(A), producer(B), producer(A), producer(B)];
    const keys = range(400).map((i) => `k-${String(i).padStart(3, "0")}`);
    // A fixed shuffle, so a failure replays the same orders.
    const shuffled = [...keys].sort((x, y) => ((x.charCodeAt(4) * 7 + x.charCodeAt(5) * 3) % 11) - ((y.charCodeAt(4) * 7 + y.charCodeAt(5) * 3) % 11));
    const orders = [keys, [...keys].reverse(), shuffled, [...shuffled].reverse()];
    const rounds = 3;
    for (const round of range(rounds)) {
      const replies = await Promise.all(
        producers.map((p, i) =>
          p.enqueue(
            tenant,
            orders[i]!.map((k) => ({ engineKind: "dag", idempotencyKey: `${round}-${k}` })),
          ),
        ),
      );
      const byKey = new Map<string, { id: string; existing: boolean }[]>();
      for (const [i, reply] of replies.entries()) for (const [j, r] of reply.entries()) byKey.set(orders[i]![j]!, [...(byKey.get(orders[i]![j]!) ?? []), r]);
      for (const [key, rs] of byKey) {
        expect(new Set(rs.map((r) => r.id)).size, key).toBe(1);
        expect(
          rs.filter((r) => !r.existing),
          key,
        ).toHaveLength(1);
      }
    }
    expect(await statusCounts(db, tenant)).toEqual({ pending: rounds * keys.length });
  });
});

describe("wake-ups cross daemons", () => {
  it("a claim long-polling on daemon B is woken by an enqueue on daemon A", async () => {
    const tenant = "wake";
    const waiter = await agent(B, "wake-b", tenant);
    const t0 = await serverNow(db);
    const waits = waitEndings();
    const claim = track(waiter.claim(1, 10_000));
    // The claim looked at the table, found nothing and is waiting now.
    await untilStatementRan(db, STATEMENT.claim, t0);
    expect(claim.settled()).toBe(false);

    const id = await producer(A).one(tenant, { engineKind: "dag", payloadJson: '{"hello":1}' });
    const items = await claim.promise;
    expect(items.map((i) => i.id)).toEqual([id]);
    // Its one wait ended woken, not run out (the claim would then have looked again and found it too).
    expect(waits).toEqual([true]);
  });

  it("wakes a claim on another daemon even when both were configured with the same instance id", async () => {
    const tenant = "wake-twin";
    const twin = await fx.startDaemon({ clock, config: config("queue-a") });
    const waiter = await agent(twin, "wake-twin", tenant);
    const t0 = await serverNow(db);
    const waits = waitEndings();
    const claim = track(waiter.claim(1, 10_000));
    await untilStatementRan(db, STATEMENT.claim, t0);
    expect(claim.settled()).toBe(false);

    const id = await producer(A).one(tenant, { engineKind: "dag" });
    const items = await claim.promise;
    expect(items.map((i) => i.id)).toEqual([id]);
    expect(waits).toEqual([true]);
  });

  it("Wait on daemon A is woken, and returns done, when an agent completes the item through daemon B", async () => {
    const tenant = "waitd";
    const worker = await agent(B, "wait-b", tenant);
    const p = producer(A);
    const id = await p.one(tenant, { engineKind: "dag", runId: "run-1" });
    const [item] = await worker.claim(1);
    expect(item!.id).toBe(id);

    const t0 = await serverNow(db);
    const waits = waitEndings();
    const wait = track(p.q.wait({ tenantKey: tenant, ids: [id], timeout: durationFromMs(10_000) }, p.call));
    await untilStatementRan(db, STATEMENT.select, t0);
    expect(wait.settled()).toBe(false);

    expect((await worker.complete([item!], { answer: 42 })).map((o) => o.ok)).toEqual([true]);
    const res = await wait.promise;
    // Woken, not at its own re-check (Wait looks again every 5 s): that wait would have ended false.
    expect(waits).toEqual([true]);
    expect(res.done).toBe(true);
    expect(res.items.map((i) => [i.id, i.status, JSON.parse(i.resultJson)])).toEqual([[id, WorkItemStatus.COMPLETED, { answer: 42 }]]);

    // Waiting for a run that is already finished answers at once.
    const run = await p.q.wait({ tenantKey: tenant, runId: "run-1", timeout: durationFromMs(10_000) }, p.call);
    expect(run.done).toBe(true);
  });

  it("Wait that runs out reports done=false with the items as they are", async () => {
    const p = producer(A);
    const id = await p.one("waitd-timeout", { engineKind: "dag" });
    const res = await p.q.wait({ tenantKey: "waitd-timeout", ids: [id], timeout: durationFromMs(50) }, p.call);
    expect(res.done).toBe(false);
    expect(res.items.map((i) => i.status)).toEqual([WorkItemStatus.PENDING]);
  });
});
