/**
 * What one caller may queue (issue 51, item 10: one StartRun with a 100,000-way fan-out queued
 * 100,000 items in 6 s, +414 MB): at most --max-items-per-call work items in one call (an Enqueue's
 * items, a DAG fan-out's iterations, all a run's start queues), and per tenant at most
 * --max-enqueue-rate a second. Refusals are RESOURCE_EXHAUSTED naming the flag (INVALID_ARGUMENT
 * for a call more than a second of the rate, which could never be admitted), and a refused call
 * writes nothing. A fan-out an engine reaches on its own, with no caller, fails its node instead.
 *
 * On a fake clock, so the token bucket refills only when the test moves time.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { NodeKind } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { NodeStatus, RunStatus } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { refusal, useTestDaemon } from "./support/kit.js";
import { DagClient, definition } from "./support/dag.js";
import { GraphClient, MachineClient } from "./support/native.js";
import { Producer, TestAgent } from "./support/queue.js";

const PER_CALL = 500;
const RATE = 100;
const clock = new FakeClock(Date.UTC(2026, 5, 1));
const fx = useTestDaemon({ label: "hquota", clock, config: { maxItemsPerCall: PER_CALL, maxEnqueueRate: RATE, sweepInterval: 3_600_000 } });
let D: Daemon;
let p: Producer;
let dags: DagClient;

beforeAll(() => {
  D = fx.daemon;
  p = fx.closers.add(new Producer(D.address));
  dags = fx.closers.add(new DagClient(D.address));
});

const items = (n: number) => Array.from({ length: n }, () => ({ engineKind: "q" }));
const queued = async (tenant: string) =>
  Number((await fx.db.raw<{ n: string }>(`SELECT count(*) AS n FROM ${fx.db.tables.qualified("work_item")} WHERE tenant_key = $1`, [tenant]))[0]!.n);
const runs = async () => Number((await fx.db.raw<{ n: string }>(`SELECT count(*) AS n FROM ${fx.db.tables.qualified("run")}`))[0]!.n);

describe("one call", () => {
  it(`of more than --max-items-per-call (${PER_CALL}) items is RESOURCE_EXHAUSTED naming the flag, and queues nothing`, async () => {
    const err = await refusal(p.enqueue("q-call", items(PER_CALL + 1)));
    expect([err.code, err.rawMessage]).toEqual([
      Code.ResourceExhausted,
      `items: ${PER_CALL + 1} work items in one call; the limit is ${PER_CALL} (--max-items-per-call)`,
    ]);
    expect(await queued("q-call")).toBe(0);
  });

  it("more than a second of --max-enqueue-rate is INVALID_ARGUMENT: it could never be admitted", async () => {
    const err = await refusal(p.enqueue("q-never", items(RATE + 1)));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toBe(
      `items: ${RATE + 1} work items in one call are more than tenant 'q-never' may queue in a second (--max-enqueue-rate ${RATE}): queue at most ${RATE} per call`,
    );
    expect(await queued("q-never")).toBe(0);
  });

  it("a DAG StartRun whose fan-out is wider than one call may queue is RESOURCE_EXHAUSTED, and writes no run and no item", async () => {
    const before = await runs();
    const err = await refusal(
      dags.start("q-fan", definition([{ name: "wide", fanOut: "context.list", payloadJson: '{"x":"{{ item }}"}' }]), {
        list: Array.from({ length: 100_000 }, (_, i) => i),
      }),
    );
    expect([err.code, err.rawMessage]).toEqual([
      Code.ResourceExhausted,
      "node 'wide': fan_out 'context.list' has 100000 elements; one call or step queues at most 500 work items (--max-items-per-call)",
    ]);
    expect([await runs(), await queued("q-fan")]).toEqual([before, 0]);
  });
});

describe("a tenant's rate", () => {
  it(`admits ${RATE} items a second: past it a call is RESOURCE_EXHAUSTED saying how long to wait, other tenants unaffected`, async () => {
    await p.enqueue("q-rate", items(60));
    const err = await refusal(p.enqueue("q-rate", items(60)));
    expect([err.code, err.rawMessage]).toEqual([
      Code.ResourceExhausted,
      `tenant 'q-rate' may queue ${RATE} work items a second on this daemon (--max-enqueue-rate); 60 more now would pass it: try again in 200 ms`,
    ]);
    expect(await queued("q-rate")).toBe(60);
    await p.enqueue("q-rate-other", items(60));
    clock.advance(199);
    expect((await refusal(p.enqueue("q-rate", items(60)))).code).toBe(Code.ResourceExhausted);
    clock.advance(1);
    await p.enqueue("q-rate", items(60));
    expect(await queued("q-rate")).toBe(120);
  });

  it("counts what engines' calls queue: a DAG start, a graph start and a machine's signal are refused once it is spent", async () => {
    const t = "q-engines";
    await p.enqueue(t, items(RATE));
    const dag = await refusal(dags.start(t, definition([{ name: "one" }])));
    expect([dag.code, dag.rawMessage]).toEqual([
      Code.ResourceExhausted,
      expect.stringMatching(/^tenant 'q-engines' may queue 100 work items a second .*--max-enqueue-rate/),
    ]);
    const graphs = fx.closers.add(new GraphClient(D.address));
    const graph = await refusal(
      graphs.start(t, {
        id: "g",
        start: "a",
        nodes: [
          { name: "a", kind: NodeKind.TASK, engineKind: "g" },
          { name: "end", kind: NodeKind.END },
        ],
        edges: [{ from: "a", to: "end" }],
      }),
    );
    expect(graph.code).toBe(Code.ResourceExhausted);
    const machines = fx.closers.add(new MachineClient(D.address));
    const m = await machines.start(t, {
      id: "m",
      initial: "a",
      states: [
        { name: "a", transitions: [{ event: "go", to: "b", action: { engineKind: "m" } }] },
        { name: "b", terminal: true },
      ],
    });
    expect((await refusal(machines.signal(t, m.runId, "go"))).code).toBe(Code.ResourceExhausted);
    expect(await queued(t)).toBe(RATE);
    clock.advance(1_000);
    expect((await machines.signal(t, m.runId, "go")).actionStarted).toBe(true);
  });
});

describe("a fan-out a DAG reaches on its own", () => {
  it("wider than one step may queue fails its node, naming the flag, and queues none of it", async () => {
    const t = "q-advance";
    const agent = fx.closers.add(await TestAgent.register(D.address, "q-advance-agent", { tenants: [t], engineKinds: ["dag"] }));
    const run = await dags.start(t, definition([{ name: "split" }, { name: "wide", dependsOn: ["split"], fanOut: "context.split.list" }]));
    const [item] = await agent.claim(1);
    await agent.complete([item!], { list: Array.from({ length: PER_CALL + 1 }, (_, i) => i) });
    const ended = await dags.until(t, run.id, RunStatus.FAILED);
    const wide = ended.nodes.find((n) => n.name === "wide")!;
    expect(wide.status).toBe(NodeStatus.FAILED);
    expect(ended.reason).toContain(
      `fan_out 'context.split.list' has ${PER_CALL + 1} elements; one call or step queues at most ${PER_CALL} work items (--max-items-per-call)`,
    );
    expect(await queued(t)).toBe(1);
  });
});
