/**
 * kill -9 of a daemon while the graph engine advances runs: the daemons are child processes on one
 * schema, both advancing (each takes runs with SKIP LOCKED as their items end); one is killed with
 * SIGKILL three times, mid-run, and started again on its port. No step is lost (every run reaches
 * its end node) and none is doubled (one work item per step, each completed once, and each node's
 * count of its own runs in the state is exactly its steps).
 */
import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NodeKind, RunStatus } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { spawnDaemon } from "../agent-sdk/test/daemon-process.js";
import { work } from "./support/dag.js";
import { freePort } from "./support/free-port.js";
import { until, useTestDb } from "./support/kit.js";
import { GraphClient, type GraphDef } from "./support/native.js";
import { TestAgent } from "./support/queue.js";

const fx = useTestDb("nativekill");
// The test agent claims without heartbeating: a long interval keeps it live for the whole test.
const timings = { heartbeatInterval: "60s", leaseTtl: "30s" };
let victim: ChildProcess;
let survivor: ChildProcess;
let victimPort: number;
let survivorAddress: string;

beforeAll(async () => {
  victimPort = await freePort();
  const survivorPort = await freePort();
  victim = await spawnDaemon(fx.db.schema, victimPort, "kill-victim-0", timings);
  survivor = await spawnDaemon(fx.db.schema, survivorPort, "kill-survivor", timings);
  survivorAddress = `127.0.0.1:${survivorPort}`;
}, 60_000);
afterAll(async () => {
  for (const c of [victim, survivor])
    if (c && c.exitCode === null && c.signalCode === null) {
      c.kill("SIGKILL");
      await once(c, "exit");
    }
});

const STEPS = 30;
const RUNS = 20;

describe("kill -9 of a daemon mid-step", () => {
  it(`loses no step and doubles none: ${RUNS} runs of ${STEPS} steps, the advancing daemon killed three times`, { timeout: 120_000 }, async () => {
    const graphs = fx.closers.add(new GraphClient(survivorAddress));
    const agent = fx.closers.add(await TestAgent.register(survivorAddress, "kill-agent", { tenants: ["t"], engineKinds: ["count"], slots: 64 }));
    const worker = work(agent, (_item, payload) => ({ n: ((payload as { n: number | null }).n ?? 0) + 1 }), { slots: 64 });
    const def: GraphDef = {
      id: "count-to",
      start: "count",
      maxSteps: BigInt(STEPS + 5),
      nodes: [
        { name: "count", kind: NodeKind.TASK, engineKind: "count", payloadJson: '{"n": "{{ context.count.n }}"}' },
        { name: "done", kind: NodeKind.END },
      ],
      edges: [
        { from: "count", to: "done", when: `result.n >= ${STEPS}` },
        { from: "count", to: "count" },
      ],
    };
    const runs = await Promise.all(Array.from({ length: RUNS }, () => graphs.start("t", def)));
    const stepsTaken = async () =>
      Number((await fx.db.raw<{ n: string }>(`SELECT coalesce(sum(steps), 0) AS n FROM ${fx.db.tables.qualified("graph_run")}`))[0]!.n);
    for (let kill = 1; kill <= 3; kill++) {
      // Mid-run: a quarter, half and three quarters of the steps taken.
      const mark = Math.floor((RUNS * STEPS * kill) / 4);
      await until(`${mark} steps taken`, async () => (await stepsTaken()) >= mark, 60_000, 10);
      // The victim is advancing runs: some run's last step is its.
      const advancedBy = `graph:kill-victim-${kill - 1}`;
      await until(
        `${advancedBy} advanced a run`,
        async () => (await fx.db.raw(`SELECT 1 FROM ${fx.db.tables.qualified("graph_run")} WHERE updatedby = $1 LIMIT 1`, [advancedBy])).length > 0,
        60_000,
        5,
      );
      victim.kill("SIGKILL");
      await once(victim, "exit");
      victim = await spawnDaemon(fx.db.schema, victimPort, `kill-victim-${kill}`, timings);
    }
    const ended = await Promise.all(runs.map((r) => graphs.ended("t", r.runId, 60_000)));
    await worker.stop();
    for (const run of ended) {
      expect(run).toMatchObject({ status: RunStatus.COMPLETED, steps: BigInt(STEPS), task: "done" });
      expect(run.path).toEqual([...Array(STEPS).fill("count"), "done"]);
      expect(JSON.parse(run.stateJson)).toEqual({ count: { n: STEPS } });
    }
    const items = await fx.db.raw<{ run_id: string; task_id: string; status: string }>(
      `SELECT run_id, task_id, status FROM ${fx.db.tables.qualified("work_item")}`,
    );
    expect(items.length).toBe(RUNS * STEPS);
    expect(new Set(items.map((i) => `${i.run_id}/${i.task_id}`)).size).toBe(RUNS * STEPS);
    expect(items.every((i) => i.status === "completed")).toBe(true);
    expect(await fx.db.raw(`SELECT id FROM ${fx.db.tables.qualified("engine_event")}`)).toEqual([]);
  });
});
