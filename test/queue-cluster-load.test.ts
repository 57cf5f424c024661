/**
 * No double dispatch across two daemon instances sharing one schema, under load: thousands of items
 * claimed concurrently by agents on both, and claims long-polling while producers enqueue, over real
 * HTTP/2 connections and a real Postgres. Each runs for seconds, so this file is in the slow tier;
 * queue-cluster.test.ts holds the rest of the queue across daemons.
 *
 * The fake clock never moves, so no lease runs out while the agents work.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import type { TestDb } from "./support/db.js";
import { useTestCluster } from "./support/kit.js";
import { itemRows, Producer, statusCounts, TestAgent, type WorkItem } from "./support/queue.js";

const clock = new FakeClock(Date.UTC(2026, 2, 1));
const fx = useTestCluster("qcluload", {
  clock,
  instances: ["queue-a", "queue-b"],
  // Timers never fire during the test; nothing here depends on them.
  config: { sweepInterval: 3_600_000, heartbeatFlush: 3_600_000, claimMaxItems: 256 },
});
let db: TestDb;
let A: Daemon;
let B: Daemon;

beforeAll(() => {
  db = fx.db;
  [A, B] = fx.daemons;
});

const agent = async (d: Daemon, name: string, tenant: string) =>
  fx.closers.add(await TestAgent.register(d.address, name, { tenants: [tenant], engineKinds: ["dag"] }));
const producer = (d: Daemon) => fx.closers.add(new Producer(d.address));
const range = (n: number) => Array.from({ length: n }, (_, i) => i);

describe("no double dispatch", () => {
  it("8 agents on two daemons claim 5,000 items concurrently: each is dispatched and completed exactly once", async () => {
    const tenant = "bulk";
    const N = 5_000;
    const agents = await Promise.all(range(8).map((i) => agent(i % 2 === 0 ? A : B, `bulk-${i}`, tenant)));
    const [pa, pb] = [producer(A), producer(B)];
    const batch = (from: number, to: number) =>
      range(to - from).map((i) => ({ engineKind: "dag", taskId: `task-${from + i}`, payloadJson: JSON.stringify({ n: from + i }) }));
    const [ra, rb] = await Promise.all([pa.enqueue(tenant, batch(0, N / 2)), pb.enqueue(tenant, batch(N / 2, N))]);
    const ids = [...ra, ...rb].map((r) => r.id);
    expect(new Set(ids).size).toBe(N);
    expect([...ra, ...rb].every((r) => !r.existing)).toBe(true);

    const deliveredTo = new Map<string, string[]>();
    const completedBy = new Map<string, string[]>();
    const refused: string[] = [];
    const oversized: number[] = [];
    const perAgent = new Map<string, number>();

    await Promise.all(
      agents.map(async (a, i) => {
        const max = 10 + i * 7;
        for (;;) {
          const items: WorkItem[] = await a.claim(max);
          if (items.length === 0) return;
          if (items.length > max) oversized.push(items.length);
          perAgent.set(a.name, (perAgent.get(a.name) ?? 0) + items.length);
          for (const it of items) {
            expect(it.status).toBe(WorkItemStatus.DISPATCHED);
            expect(it.agentId).toBe(a.name);
            deliveredTo.set(it.id, [...(deliveredTo.get(it.id) ?? []), a.name]);
          }
          const outcomes = await a.complete(items, { by: a.name });
          for (const o of outcomes) {
            if (o.ok) completedBy.set(o.workItemId, [...(completedBy.get(o.workItemId) ?? []), a.name]);
            else refused.push(`${o.workItemId}: ${o.code} ${o.message}`);
          }
        }
      }),
    );

    expect(oversized).toEqual([]);
    expect(refused).toEqual([]);
    const twice = [...deliveredTo].filter(([, who]) => who.length !== 1);
    expect(twice).toEqual([]);
    expect(deliveredTo.size).toBe(N);
    expect(new Set(deliveredTo.keys())).toEqual(new Set(ids));
    expect([...completedBy.values()].every((who) => who.length === 1)).toBe(true);
    expect(completedBy.size).toBe(N);
    // Every agent's first claim ran while thousands of items were pending, so every one got work,
    // through both daemons.
    expect(perAgent.size).toBe(8);

    expect(await statusCounts(db, tenant)).toEqual({ completed: N });
    const rows = await itemRows(db, "tenant_key = $1", [tenant]);
    expect(rows).toHaveLength(N);
    for (const r of rows) {
      expect(r.agent_id).toBe(deliveredTo.get(r.id)![0]);
      expect(r.result).toEqual({ by: r.agent_id });
      // The token of the dispatch that completed it stays, so a repeated report is recognised.
      expect(r.lease_token).not.toBeNull();
      expect(r.retry_count).toBe(0);
    }
    expect(new Set(rows.map((r) => r.leased_by))).toEqual(new Set(["queue-a", "queue-b"]));
  });
});

describe("no double dispatch with handoff", () => {
  it("8 agents long-polling on two daemons while 4 producers enqueue 2,000 items one by one and in small batches: each is dispatched and completed exactly once", async () => {
    const tenant = "handoff-race";
    const N = 2_000;
    const agents = await Promise.all(range(8).map((i) => agent(i % 2 === 0 ? A : B, `race-${i}`, tenant)));
    const producers = [producer(A), producer(B), producer(A), producer(B)];
    const deliveredTo = new Map<string, string[]>();
    const completedBy = new Map<string, string[]>();
    const refused: string[] = [];
    const oversized: number[] = [];
    let done = false;

    const working = Promise.all(
      agents.map(async (a, i) => {
        const max = 1 + (i % 4) * 3;
        while (!done) {
          // Long-polls: most of these wait while the producers enqueue, so inserts hand items over.
          const items: WorkItem[] = await a.claim(max, 300);
          if (items.length > max) oversized.push(items.length);
          for (const it of items) deliveredTo.set(it.id, [...(deliveredTo.get(it.id) ?? []), a.name]);
          if (items.length === 0) continue;
          for (const o of await a.complete(items)) {
            if (o.ok) completedBy.set(o.workItemId, [...(completedBy.get(o.workItemId) ?? []), a.name]);
            else refused.push(`${o.workItemId}: ${o.code} ${o.message}`);
          }
          if (completedBy.size >= N) done = true;
        }
      }),
    );
    // Each producer sends its quarter as single items and batches of up to 5, with mixed priorities.
    const ids = (
      await Promise.all(
        producers.map(async (p, k) => {
          const mine: string[] = [];
          for (let n = k * (N / 4); n < (k + 1) * (N / 4); ) {
            const size = Math.min(1 + (n % 5), (k + 1) * (N / 4) - n);
            const res = await p.enqueue(
              tenant,
              range(size).map((j) => ({ engineKind: "dag", priority: (n + j) % 3, taskId: `t-${n + j}` })),
            );
            mine.push(...res.map((r) => r.id));
            n += size;
          }
          return mine;
        }),
      )
    ).flat();
    expect(new Set(ids).size).toBe(N);
    await working;

    expect(oversized).toEqual([]);
    expect(refused).toEqual([]);
    expect([...deliveredTo].filter(([, who]) => who.length !== 1)).toEqual([]);
    expect(new Set(deliveredTo.keys())).toEqual(new Set(ids));
    expect([...completedBy.values()].every((who) => who.length === 1)).toBe(true);
    expect(await statusCounts(db, tenant)).toEqual({ completed: N });
  });
});
