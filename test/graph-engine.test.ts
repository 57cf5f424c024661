/**
 * The graph engine against a real daemon and a test agent: a loop that stops at its bounds, edges
 * whose conditions follow the result, failures and cancellation, the refusals of bad graphs, and the
 * directory resolving each engine's run ids to the table that holds them.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { NodeKind, RunStatus } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { RunDirectoryService } from "@aiflow/wire/gen/aiflow/cluster/v1/runs_pb.js";
import type { Daemon } from "../src/daemon.js";
import { TOKENS } from "./support/daemon.js";
import { DagClient, definition, work } from "./support/dag.js";
import { refusal, useTestDb } from "./support/kit.js";
import { GraphClient, MachineClient, type GraphDef } from "./support/native.js";
import { TestAgent } from "./support/queue.js";

const fx = useTestDb("graph");
let D: Daemon;
/** Every daemon of the file's schema: any of them may advance a run. */
const daemons: Daemon[] = [];
let graphs: GraphClient;
let agent: TestAgent;
let worker: ReturnType<typeof work>;

beforeAll(async () => {
  D = await fx.startDaemon({ config: { sweepInterval: 50 } });
  daemons.push(D);
  graphs = fx.closers.add(new GraphClient(D.address));
  agent = fx.closers.add(await TestAgent.register(D.address, "graph-agent-1", { tenants: ["t"], engineKinds: ["g"], slots: 16 }));
  // count: {n} → {n: n + 1}; label: {label} → {label}; boom: fails.
  worker = work(agent, (item, payload) => {
    const p = (payload ?? {}) as { n?: number | null; label?: string };
    if (item.taskName === "boom") throw new Error("the node blew up");
    if (item.taskName === "classify") return { label: p.label };
    return { n: (p.n ?? 0) + 1 };
  });
});
afterAll(() => worker.stop());

const task = (name: string, payloadJson = "") => ({ name, kind: NodeKind.TASK, engineKind: "g", payloadJson });
const end = (name: string) => ({ name, kind: NodeKind.END });

const loop = (maxSteps: number, untilN: number): GraphDef => ({
  id: "loop",
  start: "count",
  maxSteps: BigInt(maxSteps),
  nodes: [task("count", '{"n": "{{ context.count.n }}"}'), end("done")],
  edges: [
    { from: "count", to: "done", when: `result.n >= ${untilN}` },
    { from: "count", to: "count" },
  ],
});

describe("a graph run", () => {
  it("loops until an edge's condition sends it to the end node: path, steps and run counts record the walk", async () => {
    const run = await graphs.ended("t", (await graphs.start("t", loop(100, 4))).runId);
    expect(run).toMatchObject({ status: RunStatus.COMPLETED, task: "done", steps: 4n, reason: "reached end node 'done'", error: "" });
    expect(run.path).toEqual(["count", "count", "count", "count", "done"]);
    expect(run.runCounts).toEqual({ count: 4n });
    expect(JSON.parse(run.stateJson)).toEqual({ count: { n: 4 } });
  });

  it("a loop that would go on stops at max_steps, with the reason", async () => {
    const run = await graphs.ended("t", (await graphs.start("t", loop(5, 1_000))).runId);
    expect(run).toMatchObject({ status: RunStatus.STOPPED, task: "count", steps: 5n, error: "" });
    expect(run.reason).toBe("max_steps reached: 5 steps taken, the most the definition allows (next was 'count')");
    expect(run.path).toEqual(Array(5).fill("count"));
    expect(JSON.parse(run.stateJson)).toEqual({ count: { n: 5 } });
    // One work item per step, each completed once.
    const items = await fx.db.raw<{ task_id: string; status: string }>(
      `SELECT task_id, status FROM ${fx.db.tables.qualified("work_item")} WHERE run_id = $1 ORDER BY task_id`,
      [run.runId],
    );
    expect(items.map((i) => i.task_id).sort()).toEqual(["graph:1", "graph:2", "graph:3", "graph:4", "graph:5"]);
    expect(items.every((i) => i.status === "completed")).toBe(true);
  });

  it("WatchRun sends the run now and after every step until it ends, on another daemon than the one that advances it", async () => {
    const other = await fx.startDaemon({ config: { instanceId: "graph-watch", sweepInterval: 3_600_000 } });
    daemons.push(other);
    const watcher = fx.closers.add(new GraphClient(other.address));
    const run = await graphs.start("t", loop(100, 5));
    const seen: { status: RunStatus; steps: bigint }[] = [];
    for await (const m of watcher.graph.watchRun({ tenantKey: "t", runId: run.runId })) seen.push({ status: m.run!.status, steps: m.run!.steps });
    expect(seen.at(-1)).toEqual({ status: RunStatus.COMPLETED, steps: 5n });
    expect(seen.slice(0, -1).every((s) => s.status === RunStatus.RUNNING)).toBe(true);
    // Steps only grow, and several steps may arrive in one message, but the last message is the end.
    expect(seen.map((s) => Number(s.steps))).toEqual([...seen.map((s) => Number(s.steps))].sort((a, b) => a - b));
    expect(
      (
        await refusal(
          (async () => {
            for await (const _ of watcher.graph.watchRun({ tenantKey: "t", runId: "no-such-run" })) void _;
          })(),
        )
      ).code,
    ).toBe(Code.NotFound);
  });

  it("a node's max_visits stops a cycle before the step bound", async () => {
    const def = loop(100, 1_000);
    def.nodes![0] = { ...task("count", '{"n": "{{ context.count.n }}"}'), maxVisits: 3n };
    const run = await graphs.ended("t", (await graphs.start("t", def)).runId);
    expect(run).toMatchObject({ status: RunStatus.STOPPED, steps: 3n, reason: "max_visits reached: node 'count' ran 3 times, the most it may" });
  });

  it("the edge whose condition holds for the result picks the branch", async () => {
    const def: GraphDef = {
      start: "classify",
      nodes: [task("classify", '{"label": "{{ context.animal }}"}'), task("cats", "{}"), task("dogs", "{}"), end("done")],
      edges: [
        { from: "classify", to: "cats", when: 'result.label == "cat"' },
        { from: "classify", to: "dogs", when: "result.label in ['dog', 'wolf']" },
        { from: "cats", to: "done" },
        { from: "dogs", to: "done" },
      ],
    };
    const [cat, wolf, fish] = await Promise.all(
      ["cat", "wolf", "fish"].map(async (animal) => graphs.ended("t", (await graphs.start("t", def, { animal })).runId)),
    );
    expect(cat!.path).toEqual(["classify", "cats", "done"]);
    expect(wolf!.path).toEqual(["classify", "dogs", "done"]);
    expect(fish).toMatchObject({ status: RunStatus.FAILED, task: "classify", error: "no edge from node 'classify' holds for its result" });
    expect(JSON.parse(cat!.stateJson)).toMatchObject({ animal: "cat", classify: { label: "cat" }, cats: { n: 1 } });
  });

  it("fails when a node's work item fails for good, naming the node", async () => {
    const def: GraphDef = { start: "boom", nodes: [task("boom"), end("done")], edges: [{ from: "boom", to: "done" }] };
    const run = await graphs.ended("t", (await graphs.start("t", def)).runId);
    expect(run).toMatchObject({ status: RunStatus.FAILED, task: "boom", steps: 1n });
    expect(run.error).toMatch(/^node 'boom' failed: the node blew up/);
  });

  it("CancelRun stops it and cancels its work item; cancelling again is FAILED_PRECONDITION", async () => {
    const quiet: GraphDef = {
      start: "wait",
      nodes: [{ name: "wait", kind: NodeKind.TASK, engineKind: "nobody-serves-this" }, end("done")],
      edges: [{ from: "wait", to: "done" }],
    };
    const started = await graphs.start("t", quiet);
    const run = (await graphs.graph.cancelRun({ tenantKey: "t", runId: started.runId, reason: "changed my mind" })).run!;
    expect(run).toMatchObject({ status: RunStatus.CANCELLED, reason: "changed my mind" });
    const [item] = await fx.db.raw<{ status: string }>(`SELECT status FROM ${fx.db.tables.qualified("work_item")} WHERE id = $1`, [started.workItemId]);
    expect(item!.status).toBe("cancelled");
    expect((await refusal(graphs.graph.cancelRun({ tenantKey: "t", runId: started.runId }))).code).toBe(Code.FailedPrecondition);
  });

  it("counts its transactions by kind and the runs that ended by status (aiflow_engine_step_seconds, aiflow_engine_runs_ended_total)", async () => {
    const metric = async (name: string) =>
      (await Promise.all(daemons.map(async (d) => (await d.metrics.registry.getMetricsAsJSON()).find((m) => m.name === name)!.values))).flat();
    const ended = async (status: string) =>
      (await metric("aiflow_engine_runs_ended_total"))
        .filter((v) => v.labels.engine === "graph" && v.labels.status === status)
        .reduce((n, v) => n + v.value, 0);
    const before = { completed: await ended("completed"), stopped: await ended("stopped") };
    await graphs.ended("t", (await graphs.start("t", loop(100, 2))).runId);
    await graphs.ended("t", (await graphs.start("t", loop(2, 100))).runId);
    expect({ completed: await ended("completed"), stopped: await ended("stopped") }).toEqual({ completed: before.completed + 1, stopped: before.stopped + 1 });
    const steps = (await metric("aiflow_engine_step_seconds")).filter(
      (v) => (v as { metricName?: string }).metricName === "aiflow_engine_step_seconds_count" && v.labels.engine === "graph",
    );
    expect(new Set(steps.map((v) => v.labels.kind))).toEqual(new Set(["start", "advance", "cancel"]));
  });

  it("belongs to its caller: another caller's run id, or one of another tenant, is NOT_FOUND", async () => {
    const run = await graphs.start("t", loop(3, 1));
    const other = fx.closers.add(new GraphClient(D.address, TOKENS.runs2));
    expect((await refusal(other.get("t", run.runId))).code).toBe(Code.NotFound);
    expect((await refusal(graphs.get("u", run.runId))).code).toBe(Code.NotFound);
  });
});

describe("a graph definition", () => {
  /** A plain object a test spoils before it is sent. */
  type Plain = {
    start: string;
    maxSteps?: bigint;
    nodes: { name: string; kind?: NodeKind; engineKind?: string; payloadJson?: string }[];
    edges: { from: string; to: string; when?: string }[];
  };
  const base = (): Plain => ({
    start: "a",
    nodes: [task("a"), task("b"), end("done")],
    edges: [
      { from: "a", to: "b" },
      { from: "b", to: "done" },
    ],
  });
  it.each<[string, (d: Plain) => void, RegExp]>([
    [
      "an edge to an unknown node",
      (d) => d.edges.push({ from: "a", to: "ghost" }),
      /edge 2 \('a' -> 'ghost'\)\.to: names 'ghost', which is not a node of the definition/,
    ],
    [
      "an end node no path reaches",
      (d) =>
        (d.edges = [
          { from: "a", to: "b" },
          { from: "b", to: "a" },
        ]),
      /no end node is reachable from the start 'a'/,
    ],
    [
      "a condition that does not parse",
      (d) => (d.edges[0]!.when = "result.ok = true"),
      /edge 0 \('a' -> 'b'\)\.when: bad condition 'result.ok = true': at 11: '=' is not part of the language/,
    ],
    [
      "a condition reading what edges cannot",
      (d) => (d.edges[0]!.when = "context.x"),
      /'context' is not a value here: paths start at result, state, steps, visits/,
    ],
    ["a task node with no edges", (d) => d.nodes.push(task("stuck")), /node 'stuck': has no edges/],
    ["a task node without an engine kind", (d) => (d.nodes[1] = { name: "b", kind: NodeKind.TASK }), /node 'b'\.engine_kind: is required/],
    ["an edge out of an end node", (d) => d.edges.push({ from: "done", to: "a" }), /leaves end node 'done'/],
    ["an unknown start", (d) => (d.start = "zzz"), /definition\.start: names 'zzz'/],
    ["a duplicate node", (d) => d.nodes.push(task("a")), /node 'a': is a duplicate name/],
    ["max_steps past the cap", (d) => (d.maxSteps = 100_001n), /definition\.max_steps: 100001 is outside 1\.\.100000/],
    ["a payload that is not JSON", (d) => (d.nodes[0] = task("a", "{nope")), /node 'a'\.payload_json: is not valid JSON/],
  ])("with %s is INVALID_ARGUMENT naming it", async (_what, spoil, message) => {
    const def = base();
    spoil(def);
    const err = await refusal(graphs.start("t", def as GraphDef));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toMatch(message);
  });

  it("is stored by PutDefinition and started by id", async () => {
    const put = await graphs.graph.putDefinition({ tenantKey: "t", definition: { ...loop(10, 2), id: "stored-loop" } });
    expect(put).toMatchObject({ definitionId: "stored-loop", created: true });
    const run = (await graphs.graph.startRun({ tenantKey: "t", source: { case: "definitionId", value: "stored-loop" } })).run!;
    expect((await graphs.ended("t", run.runId)).path).toEqual(["count", "count", "done"]);
    expect((await refusal(graphs.graph.startRun({ tenantKey: "t", source: { case: "definitionId", value: "nope" } }))).code).toBe(Code.NotFound);
  });
});

describe("the run directory", () => {
  it("has each engine's run under its kind, and GetRun resolves the id to the table that holds it, in the reference's order", async () => {
    const dir = fx.clientAt(D.address, RunDirectoryService, TOKENS.engine);
    const dag = fx.closers.add(new DagClient(D.address));
    const machines = fx.closers.add(new MachineClient(D.address));
    const dagRun = await dag.start("t", definition([{ name: "only", engineKind: "g" }]));
    const graphRun = await graphs.start("t", loop(2, 1));
    const machine = await machines.start("t", {
      initial: "a",
      states: [
        { name: "a", transitions: [{ event: "go", to: "b" }] },
        { name: "b", terminal: true },
      ],
    });
    const resolved = await Promise.all([dagRun.id, graphRun.runId, machine.runId].map((runId) => dir.getRun({ tenantKey: "t", runId })));
    expect(resolved.map((r) => [r.run!.engineKind, r.engineTable])).toEqual([
      ["dag", "aiflow_run"],
      ["graph", "aiflow_graph_run"],
      ["statemachine", "aiflow_machine_run"],
    ]);
    expect(resolved[1]!.run!.definitionId).toBe("loop");
    // A run another engine records through RecordRun has no table here.
    await dir.recordRun({ tenantKey: "t", runId: "elsewhere-1", engineKind: "datapipe" });
    expect((await dir.getRun({ tenantKey: "t", runId: "elsewhere-1" })).engineTable).toBe("");
    // Ended runs carry ended_on.
    await graphs.ended("t", graphRun.runId);
    expect((await dir.getRun({ tenantKey: "t", runId: graphRun.runId })).run!.endedOn).toBeGreaterThan(0n);
  });
});
