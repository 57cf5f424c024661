/**
 * The state-machine engine against real daemons: a machine driven by signed webhooks through
 * triggers to its terminal state, actions run on an agent (and failing), the refusals that change
 * nothing, and events raced at one machine through two daemons applying one after the other.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { Action, TriggerType } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import type { Daemon } from "../src/daemon.js";
import type { TableName } from "../src/db/tables.js";
import { TOKENS } from "./support/daemon.js";
import { work } from "./support/dag.js";
import { refusal, useTestCluster } from "./support/kit.js";
import { GraphClient, MachineClient, type MachineDef } from "./support/native.js";
import { NodeKind } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { TestAgent } from "./support/queue.js";
import { deliver, TriggerClient } from "./support/triggers.js";

// Daemon A serves webhooks on an HTTP port of its own.
const fx = useTestCluster("machine", {
  instances: ["m-a", "m-b"],
  config: (id) => ({ sweepInterval: 50, ...(id === "m-a" ? { httpListen: { host: "127.0.0.1", port: 0 } } : {}) }),
});
const SECRET = "machine-hook-secret";
let A: Daemon;
let B: Daemon;
let machines: MachineClient;
let agent: TestAgent;
let worker: ReturnType<typeof work>;

beforeAll(async () => {
  [A, B] = fx.daemons;
  machines = fx.closers.add(new MachineClient(A.address));
  agent = fx.closers.add(await TestAgent.register(A.address, "machine-agent-1", { tenants: ["t"], engineKinds: ["review"], slots: 8 }));
  // review: {doc} → {score}; a doc named "bad" fails for good.
  worker = work(agent, (_item, payload) => {
    const p = payload as { doc?: string };
    if (p.doc === "bad") throw new Error("the reviewer crashed");
    return { score: p.doc === "good" ? 0.9 : 0.1 };
  });
});
afterAll(() => worker.stop());

const table = (name: TableName) => fx.db.tables.qualified(name);

/** draft --submit--> reviewing (a review on an agent) --decide--> approved | rejected, by the review's score. */
const review: MachineDef = {
  id: "review",
  initial: "draft",
  states: [
    {
      name: "draft",
      transitions: [{ event: "submit", to: "reviewing", action: { engineKind: "review", payloadJson: '{"doc": "{{ context.submit.doc }}"}' } }],
    },
    {
      name: "reviewing",
      transitions: [
        { event: "decide", to: "approved", guard: "context.reviewing.score >= 0.5 && event.by != null" },
        { event: "decide", to: "rejected", guard: "context.reviewing.score < 0.5" },
      ],
    },
    { name: "approved", terminal: true },
    { name: "rejected", terminal: true },
  ],
};

describe("a state machine", () => {
  it("driven by signed webhooks through triggers, runs its action, follows the guard the result satisfies and reaches its terminal state with the right history", async () => {
    await machines.machine.putDefinition({ tenantKey: "t", definition: review });
    const started = (await machines.machine.startRun({ tenantKey: "t", source: { case: "definitionId", value: "review" } })).run!;
    expect(started).toMatchObject({ state: "draft", history: ["draft"], live: true, suspended: false });
    const triggers = fx.closers.add(new TriggerClient(A.address));
    await triggers.put("t", { name: "submitted", type: TriggerType.WEBHOOK, action: Action.SIGNAL, event: "submit", runIdPath: "run", secret: SECRET });
    await triggers.put("t", { name: "decided", type: TriggerType.WEBHOOK, action: Action.SIGNAL, event: "decide", runIdPath: "run", secret: SECRET });

    const submit = await deliver(A.httpUrl!, "t", "submitted", JSON.stringify({ run: started.runId, doc: "good" }), { secret: SECRET });
    expect(submit.status).toBe(202);
    expect(submit.body).toMatchObject({ outcome: "signalled", run_id: started.runId });
    const reviewed = await machines.when("t", started.runId, "its action completed", (r) => !r.suspended);
    expect(reviewed).toMatchObject({ state: "reviewing", history: ["draft", "reviewing"], live: true });
    expect(JSON.parse(reviewed.contextJson)).toMatchObject({ submit: { run: started.runId, doc: "good" }, reviewing: { score: 0.9 } });

    // An event the state has no transition for, from a trigger: refused and recorded, and nothing moved.
    const again = await deliver(A.httpUrl!, "t", "submitted", JSON.stringify({ run: started.runId, doc: "other" }), { secret: SECRET });
    expect(again.body.outcome).toBe("refused");
    expect(again.body.error).toBe("event: state 'reviewing' has no transition for event 'submit' (it takes: decide)");
    expect(await machines.get("t", started.runId)).toMatchObject({ state: "reviewing", history: ["draft", "reviewing"] });

    const decide = await deliver(A.httpUrl!, "t", "decided", JSON.stringify({ run: started.runId, by: "ann" }), { secret: SECRET });
    expect(decide.body.outcome).toBe("signalled");
    const done = await machines.get("t", started.runId);
    expect(done).toMatchObject({
      state: "approved",
      history: ["draft", "reviewing", "approved"],
      live: false,
      suspended: false,
      reason: "reached terminal state 'approved'",
      failure: "",
    });

    // An event the machine no longer takes, from a trigger: a refused firing, and nothing moved.
    const late = await deliver(A.httpUrl!, "t", "decided", JSON.stringify({ run: started.runId, by: "bob" }), { secret: SECRET });
    expect(late.body.outcome).toBe("refused");
    expect(late.body.error).toMatch(/has ended in state 'approved'/);
    const firings = await fx.db.raw<{ trigger_name: string; outcome: string; run_id: string | null }>(
      `SELECT trigger_name, outcome, run_id FROM ${table("trigger_firing")} ORDER BY createdon, id`,
    );
    expect(firings).toEqual([
      { trigger_name: "submitted", outcome: "signalled", run_id: started.runId },
      { trigger_name: "submitted", outcome: "refused", run_id: null },
      { trigger_name: "decided", outcome: "signalled", run_id: started.runId },
      { trigger_name: "decided", outcome: "refused", run_id: null },
    ]);
    expect((await machines.get("t", started.runId)).history).toEqual(["draft", "reviewing", "approved"]);
  });

  it("refuses an event no transition of its state takes, or whose guards do not hold, changing nothing; and one while its action runs", async () => {
    const m = await machines.start("t", review);
    const none = await refusal(machines.signal("t", m.runId, "decide", { by: "x" }));
    expect(none.code).toBe(Code.InvalidArgument);
    expect(none.rawMessage).toBe("event: state 'draft' has no transition for event 'decide' (it takes: submit)");
    const slow = {
      ...review,
      states: review.states!.map((s) =>
        s.name === "draft" ? { ...s, transitions: [{ event: "submit", to: "reviewing", action: { engineKind: "nobody" } }] } : s,
      ),
    } as MachineDef;
    const s = await machines.start("t", slow);
    const res = await machines.signal("t", s.runId, "submit", { doc: "x" });
    expect(res).toMatchObject({
      to: "reviewing",
      actionStarted: true,
      run: { suspended: true, state: "draft", pendingEvent: "submit", pendingTo: "reviewing" },
    });
    const busy = await refusal(machines.signal("t", s.runId, "submit", { doc: "y" }));
    expect(busy.code).toBe(Code.FailedPrecondition);
    expect(busy.rawMessage).toMatch(/is running the action of 'draft' --submit--> 'reviewing': signal again once it completes/);

    // Guards over the event and the context: none holds for a decision without `by` on a good score.
    const g = await machines.start("t", review);
    await machines.signal("t", g.runId, "submit", { doc: "good" });
    await machines.when("t", g.runId, "reviewed", (r) => !r.suspended);
    const unguarded = await refusal(machines.signal("t", g.runId, "decide", {}));
    expect(unguarded.rawMessage).toMatch(/^event: no guard of state 'reviewing''s transitions for 'decide' holds/);
    expect((await machines.get("t", g.runId)).history).toEqual(["draft", "reviewing"]);
  });

  it("WatchRun sends the machine now and after each change, until it has ended", async () => {
    const m = await machines.start("t", review);
    const viaB = fx.closers.add(new MachineClient(B.address));
    const states: string[] = [];
    const watched = (async () => {
      for await (const msg of viaB.machine.watchRun({ tenantKey: "t", runId: m.runId })) {
        const r = msg.run!;
        states.push(`${r.state}${r.suspended ? "*" : ""}${r.live ? "" : "!"}`);
        if (states.length === 1) await machines.signal("t", m.runId, "submit", { doc: "good" });
        if (r.state === "reviewing" && !r.suspended && r.live) await machines.signal("t", m.runId, "decide", { by: "ann" });
      }
    })();
    await watched;
    expect(states[0]).toBe("draft");
    expect(states.at(-1)).toBe("approved!");
    expect(states).toContain("reviewing");
  });

  it("stops where it was when its action fails, saying why", async () => {
    const m = await machines.start("t", review);
    await machines.signal("t", m.runId, "submit", { doc: "bad" });
    const failed = await machines.when("t", m.runId, "stopped", (r) => !r.live);
    expect(failed).toMatchObject({ state: "draft", history: ["draft"], suspended: false, reason: "the action of 'draft' --submit--> 'reviewing' failed" });
    expect(failed.failure).toMatch(/the reviewer crashed/);
    expect((await refusal(machines.signal("t", m.runId, "submit", { doc: "good" }))).code).toBe(Code.FailedPrecondition);
  });

  it("CancelRun ends a suspended machine and cancels its action's work item", async () => {
    const slow: MachineDef = {
      initial: "a",
      states: [
        { name: "a", transitions: [{ event: "go", to: "b", action: { engineKind: "nobody" } }] },
        { name: "b", terminal: true },
      ],
    };
    const m = await machines.start("t", slow);
    const item = (await machines.signal("t", m.runId, "go")).run!.workItemId;
    const cancelled = (await machines.machine.cancelRun({ tenantKey: "t", runId: m.runId, reason: "no longer needed" })).run!;
    expect(cancelled).toMatchObject({ live: false, suspended: false, reason: "no longer needed", state: "a" });
    expect((await fx.db.raw<{ status: string }>(`SELECT status FROM ${table("work_item")} WHERE id = $1`, [item]))[0]!.status).toBe("cancelled");
  });

  it("belongs to its caller: another caller's machine is NOT_FOUND", async () => {
    const m = await machines.start("t", review);
    const other = fx.closers.add(new MachineClient(A.address, TOKENS.runs2));
    expect((await refusal(other.signal("t", m.runId, "submit", {}))).code).toBe(Code.NotFound);
  });

  it("a definition whose transition names an unknown state, whose guard does not parse, or that can never end is INVALID_ARGUMENT naming it", async () => {
    const cases: [MachineDef, RegExp][] = [
      [
        {
          initial: "a",
          states: [
            { name: "a", transitions: [{ event: "go", to: "nowhere" }] },
            { name: "b", terminal: true },
          ],
        },
        /state 'a'\.transitions\[0\]\.to: names 'nowhere'/,
      ],
      [
        {
          initial: "a",
          states: [
            { name: "a", transitions: [{ event: "go", to: "b", guard: "event.x >" }] },
            { name: "b", terminal: true },
          ],
        },
        /state 'a'\.transitions\[0\]\.guard: bad condition/,
      ],
      [
        {
          initial: "a",
          states: [
            { name: "a", transitions: [{ event: "go", to: "a" }] },
            { name: "b", terminal: true },
          ],
        },
        /no terminal state is reachable from the initial state 'a'/,
      ],
      [{ initial: "a", states: [{ name: "a" }, { name: "b", terminal: true }] }, /state 'a': has no transitions and is not terminal/],
      [
        {
          initial: "b",
          states: [
            { name: "a", transitions: [{ event: "go", to: "b" }] },
            { name: "b", terminal: true },
          ],
        },
        /definition\.initial: 'b' is terminal/,
      ],
    ];
    for (const [def, message] of cases) {
      const err = await refusal(machines.start("t", def));
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.rawMessage).toMatch(message);
    }
  });
});

describe("triggers that start runs of these engines", () => {
  it("a webhook starts a machine and a graph run of stored definitions, each with the payload in its data and its directory row naming the trigger and the firing", async () => {
    await machines.machine.putDefinition({ tenantKey: "t", definition: { ...review, id: "review-started" } });
    const graphs = fx.closers.add(new GraphClient(A.address));
    await graphs.graph.putDefinition({
      tenantKey: "t",
      definition: {
        id: "one-review",
        start: "r",
        nodes: [
          { name: "r", kind: NodeKind.TASK, engineKind: "review", payloadJson: '{"doc": "{{ context.payload.doc }}"}' },
          { name: "z", kind: NodeKind.END },
        ],
        edges: [{ from: "r", to: "z" }],
      },
    });
    const triggers = fx.closers.add(new TriggerClient(A.address));
    await triggers.put("t", {
      name: "new-review",
      type: TriggerType.WEBHOOK,
      action: Action.START,
      engineKind: "statemachine",
      definitionId: "review-started",
      secret: SECRET,
    });
    await triggers.put("t", {
      name: "new-graph",
      type: TriggerType.WEBHOOK,
      action: Action.START,
      engineKind: "graph",
      definitionId: "one-review",
      secret: SECRET,
    });
    expect((await triggers.triggers.getTrigger({ tenantKey: "t", name: "new-graph" })).trigger).toMatchObject({
      engineKind: "graph",
      definitionId: "one-review",
    });

    const m = await deliver(A.httpUrl!, "t", "new-review", JSON.stringify({ doc: "good" }), { secret: SECRET });
    const g = await deliver(A.httpUrl!, "t", "new-graph", JSON.stringify({ doc: "good" }), { secret: SECRET });
    expect([m.status, m.body.outcome, g.status, g.body.outcome]).toEqual([202, "started", 202, "started"]);
    const machine = await machines.get("t", m.body.run_id!);
    expect(machine).toMatchObject({ state: "draft", definitionId: "review-started", live: true });
    expect(JSON.parse(machine.contextJson)).toMatchObject({ payload: { doc: "good" }, trigger: { name: "new-review", firing_id: m.body.firing_id } });
    const run = await graphs.ended("t", g.body.run_id!);
    expect(JSON.parse(run.stateJson)).toMatchObject({ payload: { doc: "good" }, r: { score: 0.9 } });
    const dir = await fx.db.raw(
      `SELECT run_id, engine_kind, triggered_by, trigger_firing_id FROM ${table("engine_run")} WHERE run_id = ANY($1) ORDER BY engine_kind`,
      [[m.body.run_id, g.body.run_id]],
    );
    expect(dir).toEqual([
      { run_id: g.body.run_id, engine_kind: "graph", triggered_by: "new-graph", trigger_firing_id: g.body.firing_id },
      { run_id: m.body.run_id, engine_kind: "statemachine", triggered_by: "new-review", trigger_firing_id: m.body.firing_id },
    ]);
    // A signal goes to the engine the directory names; a graph run takes none, and says so.
    await triggers.put("t", { name: "poke", type: TriggerType.WEBHOOK, action: Action.SIGNAL, event: "poke", runIdPath: "run", secret: SECRET });
    const poke = await deliver(A.httpUrl!, "t", "poke", JSON.stringify({ run: g.body.run_id }), { secret: SECRET });
    expect(poke.body).toMatchObject({ outcome: "refused", error: expect.stringMatching(/is a graph run, and graph runs take no events/) });
  });

  it("a start trigger names an engine there is, and a signal trigger none", async () => {
    const triggers = fx.closers.add(new TriggerClient(A.address));
    const bad = await refusal(
      triggers.put("t", { name: "x", type: TriggerType.WEBHOOK, action: Action.START, engineKind: "pipeline", definitionId: "d", secret: SECRET }),
    );
    expect(bad.rawMessage).toMatch(/^trigger\.engine_kind: 'pipeline' is not an engine: give dag, graph or statemachine/);
    const sig = await refusal(
      triggers.put("t", { name: "y", type: TriggerType.WEBHOOK, action: Action.SIGNAL, engineKind: "graph", event: "e", runId: "r", secret: SECRET }),
    );
    expect(sig.rawMessage).toMatch(/^trigger\.engine_kind: is for a start/);
  });
});

describe("events raced at one machine", () => {
  it("through two daemons, apply one after the other: each sees the state the one before it left", async () => {
    const steps: MachineDef = {
      initial: "s0",
      states: [
        { name: "s0", transitions: [{ event: "go", to: "s1" }] },
        { name: "s1", transitions: [{ event: "go", to: "s2" }] },
        { name: "s2", transitions: [{ event: "go", to: "s3" }] },
        { name: "s3", terminal: true },
      ],
    };
    const viaB = fx.closers.add(new MachineClient(B.address));
    const runs = await Promise.all(Array.from({ length: 20 }, () => machines.start("t", steps)));
    // Three events at each machine at once, through both daemons: all three are taken, in some order.
    const results = await Promise.all(
      runs.flatMap((r) => [
        machines.signal("t", r.runId, "go", { via: "a" }),
        viaB.signal("t", r.runId, "go", { via: "b" }),
        machines.signal("t", r.runId, "go", { via: "a2" }),
      ]),
    );
    expect(results.every((r) => r.run!.history.length >= 2)).toBe(true);
    for (const r of runs) {
      const m = await machines.get("t", r.runId);
      expect(m).toMatchObject({ state: "s3", history: ["s0", "s1", "s2", "s3"], live: false });
    }
    // Each machine's three answers name the three transitions, one each.
    for (let i = 0; i < runs.length; i++)
      expect(
        results
          .slice(i * 3, i * 3 + 3)
          .map((r) => r.to)
          .sort(),
      ).toEqual(["s1", "s2", "s3"]);
  });
});
