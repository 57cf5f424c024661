/**
 * Run state that grew with every step is bounded (issue 51, item 9): a state machine's history and
 * a graph run's path keep their latest --run-history-max entries (5 here) and count what they
 * dropped, on the wire (history_dropped, path_dropped) and in aiflowctl's views; the stored row
 * stops growing however many steps a run takes (8,000 signals made a 1 MB history, and each save
 * rewrote it); and an action's work item is still numbered by every transition the machine made.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NodeKind, RunStatus } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import type { Daemon } from "../src/daemon.js";
import { graphView, machineView } from "../src/cli/ctl/engines.js";
import { keepLatest } from "../src/engines/run-history.js";
import { useTestDb } from "./support/kit.js";
import { work } from "./support/dag.js";
import { GraphClient, MachineClient, type MachineDef } from "./support/native.js";
import { TestAgent } from "./support/queue.js";

const KEEP = 5;
const fx = useTestDb("hhistory");
let D: Daemon;
let machines: MachineClient;
let graphs: GraphClient;
let worker: ReturnType<typeof work>;

beforeAll(async () => {
  D = await fx.startDaemon({ config: { runHistoryMax: KEEP, sweepInterval: 50 } });
  machines = fx.closers.add(new MachineClient(D.address));
  graphs = fx.closers.add(new GraphClient(D.address));
  const agent = fx.closers.add(await TestAgent.register(D.address, "hhistory-agent", { tenants: ["t"], engineKinds: ["g"], slots: 8 }));
  worker = work(agent, (_item, payload) => ({ n: ((payload as { n?: number | null } | null)?.n ?? 0) + 1 }));
});
afterAll(() => worker.stop());

const pingPong: MachineDef = {
  id: "ping-pong",
  initial: "a",
  states: [
    {
      name: "a",
      transitions: [
        { event: "go", to: "b" },
        { event: "act", to: "done", action: { engineKind: "m", payloadJson: "{}" } },
      ],
    },
    { name: "b", transitions: [{ event: "back", to: "a" }] },
    { name: "done", terminal: true },
  ],
};

const historyRow = async (runId: string) =>
  (
    await fx.db.raw<{ bytes: number; dropped: string }>(
      `SELECT length(history) AS bytes, history_dropped AS dropped FROM ${fx.db.tables.qualified("machine_run")} WHERE run_id = $1`,
      [runId],
    )
  )[0]!;

describe("keepLatest", () => {
  it("drops from the front down to the bound and says how many", () => {
    const list = [1, 2, 3, 4, 5, 6, 7];
    expect(keepLatest(list, 5)).toBe(2);
    expect(list).toEqual([3, 4, 5, 6, 7]);
    expect(keepLatest(list, 5)).toBe(0);
  });
});

describe("a state machine's history", () => {
  it(`keeps the latest ${KEEP} states and counts the rest; the stored row stops growing`, async () => {
    const m = await machines.start("t", pingPong);
    for (let i = 0; i < 12; i++) await machines.signal("t", m.runId, i % 2 === 0 ? "go" : "back");
    const run = await machines.get("t", m.runId);
    // 13 states visited: a, then b, a, … twelve times.
    expect(run.history).toEqual(["a", "b", "a", "b", "a"]);
    expect(run.historyDropped).toBe(8n);
    expect(machineView(run)).toContain("history: (8 earlier dropped) … → a → b → a → b → a");
    const at12 = await historyRow(m.runId);
    expect(at12.dropped).toBe("8");
    for (let i = 0; i < 100; i++) await machines.signal("t", m.runId, i % 2 === 0 ? "go" : "back");
    const at112 = await historyRow(m.runId);
    expect([at112.bytes, at112.dropped]).toEqual([at12.bytes, "108"]);

    // The action's work item is numbered by all 112 transitions, not by the states kept.
    const signalled = await machines.signal("t", m.runId, "act");
    const items = await fx.db.raw<{ task_id: string }>(`SELECT task_id FROM ${fx.db.tables.qualified("work_item")} WHERE id = $1`, [signalled.run!.workItemId]);
    expect(items[0]!.task_id).toBe("machine:113");
  });
});

describe("a graph run's path", () => {
  it(`keeps the latest ${KEEP} nodes and counts the rest, on the wire and in aiflowctl's view`, async () => {
    const started = await graphs.start("t", {
      id: "counter",
      start: "count",
      maxSteps: 100n,
      nodes: [
        { name: "count", kind: NodeKind.TASK, engineKind: "g", payloadJson: '{"n": "{{ context.count.n }}"}' },
        { name: "done", kind: NodeKind.END },
      ],
      edges: [
        { from: "count", to: "done", when: "result.n >= 9" },
        { from: "count", to: "count" },
      ],
    });
    const run = await graphs.ended("t", started.runId);
    expect(run).toMatchObject({ status: RunStatus.COMPLETED, steps: 9n, pathDropped: 5n });
    // Nine steps of count, then done: ten in all, the latest five kept.
    expect(run.path).toEqual(["count", "count", "count", "count", "done"]);
    expect(graphView(run)).toContain("path:   (5 earlier dropped) … → count → count → count → count → done");
  });
});
