/**
 * The work items the engines queue (DAG nodes, graph nodes, state-machine actions) are due when they
 * are queued, by the daemon's clock: the queue's age gauge, QueueStats' dispatch wait and the
 * dispatch-wait histogram read them as waiting since then, not since 1970 (issue 52 item 2). And
 * every attempt row of a DAG run, including those the daemon creates after the run started, is
 * created by the run's caller: reads are scoped by createdby = caller (issue 52 item 5).
 *
 * The daemon runs on a fake clock, so every age is exact.
 */
import { durationMs, timestampFromMs } from "@bufbuild/protobuf/wkt";
import { beforeAll, describe, expect, it } from "vitest";
import { NodeKind } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { RunStatus } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { chain, DagClient, definition } from "./support/dag.js";
import { useTestDb } from "./support/kit.js";
import { scrapeMetrics } from "./support/metrics.js";
import { GraphClient, MachineClient } from "./support/native.js";
import { opsSession } from "./support/ops.js";
import { Producer, TestAgent } from "./support/queue.js";

const fx = useTestDb("engineitems");
const clock = new FakeClock(Date.UTC(2026, 11, 1));
const REFRESH = 1_000;
const WAITED_MS = 7_000;
let D: Daemon;

beforeAll(async () => {
  D = await fx.startDaemon({
    clock,
    config: {
      httpListen: { host: "127.0.0.1", port: 0 },
      metricsRefresh: REFRESH,
      // The sweeps do not run: nothing but the test moves these items.
      sweepInterval: 3_600_000,
      heartbeatFlush: 3_600_000,
      heartbeatInterval: 1_800_000,
    },
  });
});

const table = (t: "task" | "run" | "work_item") => fx.db.tables.qualified(t);

describe("items the engines queue", () => {
  it("are due when queued: the age gauge, QueueStats' dispatch wait and the wait histogram count from then", async () => {
    const dags = fx.closers.add(new DagClient(D.address));
    const graphs = fx.closers.add(new GraphClient(D.address));
    const machines = fx.closers.add(new MachineClient(D.address));
    // No agent serves these kinds yet: the items wait, pending.
    await dags.start("t", definition(chain(1).map((n) => ({ ...n, engineKind: "dag-k" }))));
    await graphs.start("t", {
      id: "one",
      start: "a",
      nodes: [
        { name: "a", kind: NodeKind.TASK, engineKind: "graph-k" },
        { name: "z", kind: NodeKind.END },
      ],
      edges: [{ from: "a", to: "z" }],
    });
    const machine = await machines.start("t", {
      id: "m",
      initial: "s0",
      states: [
        { name: "s0", transitions: [{ event: "go", to: "s1", action: { engineKind: "machine-k" } }] },
        { name: "s1", terminal: true },
      ],
    });
    await machines.signal("t", machine.runId, "go");
    const queued = await fx.db.raw<{ engine_kind: string; next_attempt_at: string; created_ns: string }>(
      `SELECT engine_kind, next_attempt_at::text, (extract(epoch FROM createdon) * 1e9)::int8::text AS created_ns FROM ${table("work_item")} ORDER BY engine_kind`,
    );
    expect(queued.map((r) => r.engine_kind)).toEqual(["dag-k", "graph-k", "machine-k"]);
    for (const r of queued) expect(r.next_attempt_at, r.engine_kind).toBe(r.created_ns);

    clock.advance(WAITED_MS);
    const m = await scrapeMetrics(D.httpUrl!);
    for (const kind of ["dag-k", "graph-k", "machine-k"])
      expect(m.series("aiflow_queue_oldest_due_pending_age_seconds", { tenant: "t", engine_kind: kind }), kind).toBe(WAITED_MS / 1000);

    const agent = fx.closers.add(
      await TestAgent.register(D.address, "engine-items-agent", { tenants: ["t"], engineKinds: ["dag-k", "graph-k", "machine-k"], slots: 8 }),
    );
    expect(await agent.claim(8)).toHaveLength(3);
    const ops = fx.closers.add(opsSession(D.address));
    const stats = await ops.client.queueStats({ tenantKey: "t" }, ops.call);
    expect(durationMs(stats.dispatchWaitP50!)).toBe(WAITED_MS);
    expect(durationMs(stats.dispatchWaitP99!)).toBe(WAITED_MS);
    const after = await scrapeMetrics(D.httpUrl!);
    for (const kind of ["dag-k", "graph-k", "machine-k"]) {
      expect(after.series("aiflow_queue_dispatch_wait_seconds_sum", { tenant: "t", engine_kind: kind }), kind).toBe(WAITED_MS / 1000);
      expect(after.series("aiflow_queue_dispatch_wait_seconds_count", { tenant: "t", engine_kind: kind }), kind).toBe(1);
    }
  });
});

describe("the queue's readers", () => {
  it("count an item's wait from when it was queued, even where its next attempt was stated long before", async () => {
    // A producer may state a not_before in the past; rows the engines queued before the fix hold 0.
    const producer = fx.closers.add(new Producer(D.address));
    await producer.one("u", { engineKind: "old-k", notBefore: timestampFromMs(1_000) });
    clock.advance(WAITED_MS);
    const m = await scrapeMetrics(D.httpUrl!);
    expect(m.series("aiflow_queue_oldest_due_pending_age_seconds", { tenant: "u", engine_kind: "old-k" })).toBe(WAITED_MS / 1000);
    const agent = fx.closers.add(await TestAgent.register(D.address, "old-k-agent", { tenants: ["u"], engineKinds: ["old-k"] }));
    expect(await agent.claim(1)).toHaveLength(1);
    const ops = fx.closers.add(opsSession(D.address));
    expect(durationMs((await ops.client.queueStats({ tenantKey: "u" }, ops.call)).dispatchWaitP99!)).toBe(WAITED_MS);
  });
});

describe("a DAG run's attempts", () => {
  it("are all created by the run's caller, those the daemon queues as the run advances too", async () => {
    const dags = fx.closers.add(new DagClient(D.address));
    const agent = fx.closers.add(await TestAgent.register(D.address, "createdby-agent", { tenants: ["t"], engineKinds: ["dag"], slots: 8 }));
    const run = await dags.start("t", definition(chain(3)));
    for (let done = 0; done < 3; ) {
      const items = await agent.claim(8, 200);
      if (items.length > 0) await agent.complete(items, {});
      done += items.length;
    }
    await dags.until("t", run.id, RunStatus.COMPLETED);
    const [owner] = await fx.db.raw<{ createdby: string }>(`SELECT createdby FROM ${table("run")} WHERE id = $1`, [run.id]);
    expect(owner!.createdby).not.toMatch(/^dag:/);
    const tasks = await fx.db.raw<{ name: string; createdby: string }>(`SELECT name, createdby FROM ${table("task")} WHERE runid = $1 ORDER BY name`, [run.id]);
    expect(tasks).toEqual(["n0", "n1", "n2"].map((name) => ({ name, createdby: owner!.createdby })));
  });
});
