/**
 * Agent streams across daemons of one schema, over real HTTP/2 and a real Postgres: streams on two
 * daemons race for items enqueued through both (pushed from the claim statement, from an insert on
 * the stream's own daemon, and after a ring from the other one), and none is pushed twice or beyond
 * its stream's credits; a daemon that shuts down leaves what its streams pushed leased, for the
 * agent to report through another daemon without spending anything.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import type { WorkItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { AgentStream } from "./support/agent-stream.js";
import type { TestDb } from "./support/db.js";
import { until, useTestCluster } from "./support/kit.js";
import { itemRows, Producer, statusCounts, TestAgent } from "./support/queue.js";

const clock = new FakeClock(Date.UTC(2026, 2, 1));

const config = (instanceId: string) => ({
  instanceId,
  // Timers never fire during the test: no sweep moves a lease, no fallback re-check wakes a stream.
  sweepInterval: 3_600_000,
  heartbeatFlush: 3_600_000,
  claimMaxItems: 64,
});

const fx = useTestCluster("qstreamclu", { clock, instances: ["stream-a", "stream-b"], config });
let db: TestDb;
let A: Daemon;
let B: Daemon;

beforeAll(() => {
  db = fx.db;
  [A, B] = fx.daemons;
});

const agent = async (d: Daemon, name: string, tenant: string) =>
  fx.closers.add(await TestAgent.register(d.address, name, { tenants: [tenant], engineKinds: ["dag"] }));
const handed = async (d: Daemon) => Number((await d.metrics.registry.getSingleMetric("aiflow_queue_direct_dispatches_total")?.get())?.values[0]?.value ?? 0);
const range = (n: number) => Array.from({ length: n }, (_, i) => i);

/**
 * A stream that completes each pushed item at once and grants a credit back for it, counting how
 * far the daemon ever went beyond the credits it had been granted.
 */
function worker(s: AgentStream, credits: number): { pushed: WorkItem[]; overCredit: () => number } {
  const pushed: WorkItem[] = [];
  let outstanding = credits;
  let worst = 0;
  s.onResponse = (r) => {
    if (r.items.length === 0) return;
    outstanding -= r.items.length;
    worst = Math.min(worst, outstanding);
    pushed.push(...r.items);
    s.send({ completions: r.items.map((i) => ({ workItemId: i.id, leaseToken: i.leaseToken, resultJson: "" })), credits: r.items.length });
    outstanding += r.items.length;
  };
  return { pushed, overCredit: () => Math.max(0, -worst) };
}

describe("agent streams on two daemons", () => {
  it("8 streams take 3,000 items enqueued through both daemons: each pushed once and completed once, none beyond its credits", {
    timeout: 60_000,
  }, async () => {
    const tenant = "stream-bulk";
    const N = 3_000;
    const CREDITS = 8;
    const agents = await Promise.all(range(8).map((i) => agent(i % 2 === 0 ? A : B, `stream-bulk-${i}`, tenant)));
    const streams = agents.map((a) => new AgentStream(a.conn.agent, a.name, { credits: CREDITS }));
    const workers = streams.map((s) => worker(s, CREDITS));
    // Every stream has its status, so each is open and waiting when the items arrive.
    await Promise.all(streams.map((s) => s.next("the status", (r) => r.status !== 0)));
    const [pa, pb] = [fx.closers.add(new Producer(A.address)), fx.closers.add(new Producer(B.address))];
    const batch = (from: number) => range(100).map((i) => ({ engineKind: "dag", taskId: `task-${from + i}` }));
    await Promise.all(range(N / 100).map((b) => (b % 2 === 0 ? pa : pb).enqueue(tenant, batch(b * 100))));

    await until("every item completed", async () => (await statusCounts(db, tenant)).completed === N, 45_000, 20);
    const pushed = workers.flatMap((w) => w.pushed.map((i) => i.id));
    expect(pushed).toHaveLength(N);
    expect(new Set(pushed).size).toBe(N);
    expect(workers.map((w) => w.overCredit())).toEqual(workers.map(() => 0));
    // Some went straight from an insert to a waiting stream; both daemons' streams took part.
    expect((await handed(A)) + (await handed(B))).toBeGreaterThan(0);
    expect(workers.filter((_, i) => i % 2 === 0).some((w) => w.pushed.length > 0)).toBe(true);
    expect(workers.filter((_, i) => i % 2 === 1).some((w) => w.pushed.length > 0)).toBe(true);
    const rows = await itemRows(db, "tenant_key = $1", [tenant]);
    expect(rows.filter((r) => r.status !== "completed" || r.redelivery_count !== 0 || r.retry_count !== 0)).toEqual([]);
    for (const s of streams) s.goodbye();
    await Promise.all(streams.map((s) => s.ended));
  });

  it("a daemon shutting down leaves what its stream pushed leased: the agent completes it through another daemon, spending nothing", async () => {
    const tenant = "stream-moving";
    const C = await fx.startDaemon({ clock, config: config("stream-c") });
    const onC = await agent(C, "stream-moving-a", tenant);
    const ids = (
      await fx.closers.add(new Producer(A.address)).enqueue(
        tenant,
        range(3).map(() => ({ engineKind: "dag" })),
      )
    ).map((r) => r.id);
    const s = new AgentStream(onC.conn.agent, onC.name, { credits: 3 });
    const items = await s.itemsAtLeast(3);
    await s.settled();
    await C.stop();
    await s.ended;
    expect(await statusCounts(db, tenant)).toEqual({ dispatched: 3 });

    const onA = await agent(A, "stream-moving-a", tenant);
    const outcomes = await onA.complete(items);
    expect(outcomes.map((o) => o.ok)).toEqual([true, true, true]);
    const rows = await itemRows(db, "tenant_key = $1", [tenant]);
    expect(rows.map((r) => [r.id, r.status, r.redelivery_count, r.retry_count]).sort()).toEqual(ids.map((id) => [id, "completed", 0, 0]).sort());
  });
});
