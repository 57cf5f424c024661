/**
 * Who may write the run directory through RecordRun (issue 52 item 4). A run of one of the daemon's
 * own engines (dag, graph, statemachine) is written by that engine only, on the save of its own
 * state: RecordRun refuses any write to it, so a forged ended_on or cause can neither end a live run
 * in the listing nor name a trigger that never fired. Runs of engines outside the daemon are still
 * recorded through RecordRun, and what can be checked is checked: ended_on is epoch nanoseconds, not
 * in the future and not before the firing that caused the run; a cause names a firing on record that
 * started this run.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Code, type Client } from "@connectrpc/connect";
import { FakeClock, msToNs } from "../src/clock.js";
import { RunStatus } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { NodeKind } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import {
  FiringAction,
  FiringOutcome,
  RunDirectoryService,
  RunState,
  TriggerFiringService,
  TriggerType,
  type RecordRunRequest,
} from "@aiflow/wire/gen/aiflow/cluster/v1/runs_pb.js";
import { TOKENS } from "./support/daemon.js";
import { DagClient, definition } from "./support/dag.js";
import { codeOf, refusal, useTestDaemon } from "./support/kit.js";
import { GraphClient, MachineClient } from "./support/native.js";
import { TestAgent } from "./support/queue.js";

const clock = new FakeClock();
const fx = useTestDaemon({ label: "runwriters", migrate: false, clock });
const engine = { headers: { authorization: `Bearer ${TOKENS.engine}` } };
const T = "t1";
let dir: Client<typeof RunDirectoryService>;
let firings: Client<typeof TriggerFiringService>;

type Rec = Partial<Omit<RecordRunRequest, "$typeName" | "$unknown">>;
const record = (r: Rec) => dir.recordRun({ tenantKey: T, engineKind: "datapipe", ...r }, engine);
const live = async () => (await dir.listRuns({ tenantKey: T, state: RunState.LIVE, pageSize: 500 }, engine)).runs.map((r) => r.runId);
const ended = async () => (await dir.listRuns({ tenantKey: T, state: RunState.ENDED, pageSize: 500 }, engine)).runs.map((r) => r.runId);

/** A firing on record, as a trigger outside the daemon writes it once its run has started. */
async function fired(trigger: string, runId: string, firedOnNs: bigint = msToNs(clock.nowMs()), outcome = FiringOutcome.STARTED): Promise<string> {
  const action = outcome === FiringOutcome.SIGNALLED ? FiringAction.SIGNAL : FiringAction.START;
  const res = await firings.recordFiring(
    { tenantKey: T, triggerName: trigger, triggerType: TriggerType.WEBHOOK, action, runId, outcome, firedOn: firedOnNs },
    engine,
  );
  return res.firing!.id;
}

beforeAll(() => {
  dir = fx.client(RunDirectoryService);
  firings = fx.client(TriggerFiringService);
});

describe("a run of the daemon's own engine", () => {
  it("a live DAG run: forged ended_on and cause are refused, it stays LIVE, and on completion its row has the engine's real end", async () => {
    const agent = fx.closers.add(await TestAgent.register(fx.address, "writers-agent", { tenants: [T], engineKinds: ["dag"] }));
    const dag = fx.closers.add(new DagClient(fx.address));
    const run = await dag.start(T, definition([{ name: "only" }]));
    const [item] = await agent.claim(1);
    expect(item?.runId).toBe(run.id);

    const forged = await refusal(record({ runId: run.id, engineKind: "dag", endedOn: 12_345n }));
    expect(forged.code).toBe(Code.FailedPrecondition);
    expect(forged.rawMessage).toContain(`run '${run.id}' belongs to the daemon's dag engine`);
    expect(await codeOf(record({ runId: run.id, engineKind: "dag", triggeredBy: "on-push", triggerFiringId: "01J0000000000000000000FAKE" }))).toBe(
      Code.FailedPrecondition,
    );
    expect(await codeOf(record({ runId: run.id, engineKind: "dag", definitionId: run.definitionId }))).toBe(Code.FailedPrecondition);
    // Another kind for the same id says whose run it is, not which fact disagrees.
    const other = await refusal(record({ runId: run.id, engineKind: "datapipe", endedOn: msToNs(clock.nowMs()) }));
    expect(other.code).toBe(Code.FailedPrecondition);
    expect(other.rawMessage).toContain("belongs to the daemon's dag engine");

    const row = (await dir.getRun({ tenantKey: T, runId: run.id }, engine)).run!;
    expect(row.endedOn).toBeUndefined();
    expect(row).toMatchObject({ engineKind: "dag", triggeredBy: "", triggerFiringId: "" });
    expect(await live()).toContain(run.id);

    clock.advance(2_000);
    await agent.complete([item!], { ok: true });
    const done = await dag.until(T, run.id, RunStatus.COMPLETED);
    const after = (await dir.getRun({ tenantKey: T, runId: run.id }, engine)).run!;
    expect(after.endedOn).toBe(done.endTime);
    expect(after.endedOn).toBe(msToNs(clock.nowMs()));
    expect(await live()).not.toContain(run.id);
    expect(await ended()).toContain(run.id);
  });

  it("graph and state-machine runs, and new ids under an engine kind the daemon owns, are refused too", async () => {
    const graphs = fx.closers.add(new GraphClient(fx.address));
    const machines = fx.closers.add(new MachineClient(fx.address));
    // Its one task is of a kind no agent serves: the run stays live.
    const g = await graphs.start(T, {
      id: "g",
      start: "work",
      maxSteps: 5n,
      nodes: [
        { name: "work", kind: NodeKind.TASK, engineKind: "nobody" },
        { name: "done", kind: NodeKind.END },
      ],
      edges: [{ from: "work", to: "done" }],
    });
    const m = await machines.start(T, {
      initial: "a",
      states: [
        { name: "a", transitions: [{ event: "go", to: "b" }] },
        { name: "b", terminal: true },
      ],
    });
    for (const [runId, kind] of [
      [g.runId, "graph"],
      [m.runId, "statemachine"],
    ] as const) {
      const err = await refusal(record({ runId, engineKind: kind, endedOn: 12_345n }));
      expect(err.code).toBe(Code.FailedPrecondition);
      expect(err.rawMessage).toContain(`belongs to the daemon's ${kind} engine`);
    }
    expect((await dir.getRun({ tenantKey: T, runId: m.runId }, engine)).run!.endedOn).toBeUndefined();
    for (const kind of ["dag", "graph", "statemachine"]) {
      const err = await refusal(record({ runId: `squat-${kind}`, engineKind: kind }));
      expect(err.code).toBe(Code.FailedPrecondition);
      expect(err.rawMessage).toContain(`engine_kind '${kind}' is the daemon's own`);
      expect(await codeOf(dir.getRun({ tenantKey: T, runId: `squat-${kind}` }, engine))).toBe(Code.NotFound);
    }
  });
});

describe("a run of an engine outside the daemon", () => {
  it("ended_on must be epoch nanoseconds and not in the future", async () => {
    const unit = await refusal(record({ runId: "x1", endedOn: 12_345n }));
    expect(unit.code).toBe(Code.InvalidArgument);
    expect(unit.rawMessage).toContain("ended_on: 12345 is not epoch nanoseconds");
    // Milliseconds given as nanoseconds.
    expect(await codeOf(record({ runId: "x1", endedOn: BigInt(clock.nowMs()) }))).toBe(Code.InvalidArgument);
    const ahead = await refusal(record({ runId: "x1", endedOn: msToNs(clock.nowMs() + 3_600_000) }));
    expect(ahead.code).toBe(Code.InvalidArgument);
    expect(ahead.rawMessage).toContain("ahead of the daemon's clock");
    expect(await codeOf(dir.getRun({ tenantKey: T, runId: "x1" }, engine))).toBe(Code.NotFound);
    // A minute ahead is clock skew between hosts, not an error; a day-old end is a late record.
    expect((await record({ runId: "x1", endedOn: msToNs(clock.nowMs() + 60_000) })).run!.endedOn).toBe(msToNs(clock.nowMs() + 60_000));
    expect((await record({ runId: "x2", endedOn: msToNs(clock.nowMs() - 86_400_000) })).created).toBe(true);
  });

  it("ended_on: the first end wins; a later different one is not a restatement and changes nothing", async () => {
    const first = msToNs(clock.nowMs());
    await record({ runId: "x3", endedOn: first });
    expect((await record({ runId: "x3", endedOn: first - 1_000_000_000n })).run!.endedOn).toBe(first);
    expect((await record({ runId: "x3", endedOn: first })).run!.endedOn).toBe(first);
  });

  it("a cause names a firing on record that started this run", async () => {
    await record({ runId: "c1", definitionId: "pipe" });
    const madeUp = await refusal(record({ runId: "c1", triggeredBy: "on-push", triggerFiringId: "01J0000000000000000000FAKE" }));
    expect(madeUp.code).toBe(Code.FailedPrecondition);
    expect(madeUp.rawMessage).toContain("trigger_firing_id '01J0000000000000000000FAKE' names no firing of tenant 't1'");
    const noFiring = await refusal(record({ runId: "c1", triggeredBy: "on-push" }));
    expect(noFiring.code).toBe(Code.FailedPrecondition);
    expect(noFiring.rawMessage).toContain("no firing of trigger 'on-push' started run 'c1'");

    const forOther = await fired("on-push", "c-other");
    expect((await refusal(record({ runId: "c1", triggeredBy: "on-push", triggerFiringId: forOther }))).rawMessage).toContain("started run 'c-other', not 'c1'");
    const mine = await fired("on-push", "c1");
    expect((await refusal(record({ runId: "c1", triggeredBy: "nightly", triggerFiringId: mine }))).rawMessage).toContain(
      "is a firing of trigger 'on-push', not 'nightly'",
    );
    const signal = await fired("on-push", "c1", undefined, FiringOutcome.SIGNALLED);
    expect((await refusal(record({ runId: "c1", triggerFiringId: signal }))).rawMessage).toContain(
      "signalled run 'c1'; only the firing that started a run is its cause",
    );
    const row = (await dir.getRun({ tenantKey: T, runId: "c1" }, engine)).run!;
    expect(row).toMatchObject({ triggeredBy: "", triggerFiringId: "" });

    // The firing alone is enough: the trigger's name is the firing's.
    expect((await record({ runId: "c1", triggerFiringId: mine })).run).toMatchObject({ triggeredBy: "on-push", triggerFiringId: mine });
    // A trigger's name alone is checked against the firings that started the run.
    await fired("nightly", "c2");
    expect((await record({ runId: "c2", triggeredBy: "nightly" })).run).toMatchObject({ triggeredBy: "nightly", triggerFiringId: "" });
  });

  it("a cause the row holds is restated without its firing: an engine repeating it keeps working after retention", async () => {
    const f = await fired("on-push", "k1");
    await record({ runId: "k1", triggeredBy: "on-push", triggerFiringId: f });
    // The retention sweep's delete, done directly.
    await fx.db.raw(`DELETE FROM ${fx.db.tables.qualified("trigger_firing")} WHERE id = $1`, [f]);
    expect((await record({ runId: "k1", definitionId: "pipe", triggeredBy: "on-push", triggerFiringId: f })).run).toMatchObject({
      definitionId: "pipe",
      triggerFiringId: f,
    });
    expect(await codeOf(record({ runId: "k2", triggeredBy: "on-push", triggerFiringId: f }))).toBe(Code.FailedPrecondition);
  });

  it("ended_on is not before the firing that caused the run", async () => {
    const firedOn = msToNs(clock.nowMs());
    const f = await fired("on-push", "e1", firedOn);
    await record({ runId: "e1", triggerFiringId: f });
    const early = await refusal(record({ runId: "e1", endedOn: firedOn - 3_600_000_000_000n }));
    expect(early.code).toBe(Code.FailedPrecondition);
    expect(early.rawMessage).toContain(`before firing '${f}'`);
    // Either order: an end on record first, then a cause it contradicts.
    const g = await fired("on-push", "e2", firedOn);
    await record({ runId: "e2", endedOn: firedOn - 3_600_000_000_000n });
    expect(await codeOf(record({ runId: "e2", triggerFiringId: g }))).toBe(Code.FailedPrecondition);
    expect((await record({ runId: "e1", endedOn: firedOn + 1_000_000n })).run!.endedOn).toBe(firedOn + 1_000_000n);
  });
});
