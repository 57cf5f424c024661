/**
 * The two queries of the entity reference's "Tracing a run back to what caused it", run verbatim
 * (table names substituted for this test's schema and prefix) against rows written only through the
 * RPCs, the way an engine outside the daemon and a trigger would write them (the daemon's own dag,
 * graph and statemachine engines write their rows themselves; RecordRun refuses those kinds).
 */
import { beforeAll, describe, expect, it } from "vitest";
import { FakeClock, msToNs } from "../src/clock.js";
import { FiringAction, FiringOutcome, RunDirectoryService, TriggerFiringService, TriggerType } from "@aiflow/wire/gen/aiflow/cluster/v1/runs_pb.js";
import type { TestDb } from "./support/db.js";
import { TOKENS } from "./support/daemon.js";
import { Connection, useTestDaemon } from "./support/kit.js";

const clock = new FakeClock();
// The daemon migrates the schema itself, with a prefix of its own.
const fx = useTestDaemon({ label: "trace", prefix: "tr_", migrate: false, clock });
let db: TestDb;
const opts = { headers: { authorization: `Bearer ${TOKENS.engine}` } };
const T = "acme";
/** The clock at the first firing, epoch ns. */
let t0Ns = 0n;

const PUSH_1 = '{"ref":"refs/heads/main","after":"aaa111"}';
const PUSH_2 = '{ "ref": "refs/heads/main", "after": "bbb222" }';

beforeAll(async () => {
  db = fx.db;
  const conn = fx.closers.add(new Connection(fx.address));
  const runs = conn.client(RunDirectoryService);
  const firings = conn.client(TriggerFiringService);
  const t0 = clock.nowMs();
  t0Ns = msToNs(t0);
  const step = () => clock.advance(1000);

  // on-push fires; the engine saves run r1 first, then the trigger records the firing and the cause.
  await runs.recordRun({ tenantKey: T, runId: "r1", engineKind: "datapipe", definitionId: "deploy" }, opts);
  const f1 = (
    await firings.recordFiring(
      {
        tenantKey: T,
        triggerName: "on-push",
        triggerType: TriggerType.WEBHOOK,
        payload: PUSH_1,
        action: FiringAction.START,
        definitionId: "deploy",
        runId: "r1",
        outcome: FiringOutcome.STARTED,
        firedOn: msToNs(t0),
      },
      opts,
    )
  ).firing!;
  await runs.recordRun({ tenantKey: T, runId: "r1", engineKind: "datapipe", triggeredBy: "on-push", triggerFiringId: f1.id }, opts);

  // A caller starts r2 by hand: no trigger.
  step();
  await runs.recordRun({ tenantKey: T, runId: "r2", engineKind: "etl", definitionId: "adhoc" }, opts);

  // on-push fires again; this time the cause reaches the directory before the engine's first save.
  step();
  const f2 = (
    await firings.recordFiring(
      {
        tenantKey: T,
        triggerName: "on-push",
        triggerType: TriggerType.WEBHOOK,
        payload: PUSH_2,
        action: FiringAction.START,
        definitionId: "deploy",
        runId: "r3",
        outcome: FiringOutcome.STARTED,
        firedOn: msToNs(clock.nowMs()),
      },
      opts,
    )
  ).firing!;
  await runs.recordRun({ tenantKey: T, runId: "r3", engineKind: "flows", triggeredBy: "on-push", triggerFiringId: f2.id }, opts);
  await runs.recordRun({ tenantKey: T, runId: "r3", engineKind: "flows", definitionId: "deploy", endedOn: msToNs(clock.nowMs() + 500) }, opts);

  // Another trigger starts r4.
  step();
  const f3 = (
    await firings.recordFiring(
      {
        tenantKey: T,
        triggerName: "nightly",
        triggerType: TriggerType.CRON,
        action: FiringAction.START,
        definitionId: "report",
        runId: "r4",
        outcome: FiringOutcome.STARTED,
        firedOn: msToNs(clock.nowMs()),
      },
      opts,
    )
  ).firing!;
  await runs.recordRun({ tenantKey: T, runId: "r4", engineKind: "datapipe", definitionId: "report", triggeredBy: "nightly", triggerFiringId: f3.id }, opts);

  // Firings that caused nothing: a refused webhook (signal for an unknown run) and a failed cron.
  step();
  await firings.recordFiring(
    {
      tenantKey: T,
      triggerName: "on-push",
      triggerType: TriggerType.WEBHOOK,
      payload: "{}",
      action: FiringAction.SIGNAL,
      event: "approve",
      outcome: FiringOutcome.REFUSED,
      error: "unknown run 'r-404'",
      firedOn: msToNs(clock.nowMs()),
    },
    opts,
  );
  step();
  await firings.recordFiring(
    {
      tenantKey: T,
      triggerName: "nightly",
      triggerType: TriggerType.CRON,
      action: FiringAction.START,
      definitionId: "report",
      outcome: FiringOutcome.FAILED,
      error: "engine unavailable",
      firedOn: msToNs(clock.nowMs()),
    },
    opts,
  );
});

describe("tracing a run back to what caused it", () => {
  it("runs triggered by on-push, with what each firing carried", async () => {
    const rows = await db.raw(`
      SELECT r.run_id, r.engine_kind, r.definition_id, f.outcome, f.payload
      FROM   ${db.tables.qualified("engine_run")} r
      JOIN   ${db.tables.qualified("trigger_firing")} f ON f.id = r.trigger_firing_id
      WHERE  r.triggered_by = 'on-push'
      ORDER  BY r.createdon DESC`);
    expect(rows).toEqual([
      { run_id: "r3", engine_kind: "flows", definition_id: "deploy", outcome: "started", payload: PUSH_2 },
      { run_id: "r1", engine_kind: "datapipe", definition_id: "deploy", outcome: "started", payload: PUSH_1 },
    ]);
  });

  it("the firings that caused nothing", async () => {
    const rows = await db.raw(`
      SELECT trigger_name, outcome, error, fired_on
      FROM   ${db.tables.qualified("trigger_firing")}
      WHERE  outcome IN ('refused', 'failed')
      ORDER  BY fired_on DESC`);
    expect(rows).toEqual([
      { trigger_name: "nightly", outcome: "failed", error: "engine unavailable", fired_on: (t0Ns + 5_000_000_000n).toString() },
      { trigger_name: "on-push", outcome: "refused", error: "unknown run 'r-404'", fired_on: (t0Ns + 4_000_000_000n).toString() },
    ]);
  });
});
