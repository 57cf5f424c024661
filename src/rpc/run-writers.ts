/**
 * Who may write a run's directory row through RecordRun, and what such a write must satisfy.
 *
 * A run of one of the daemon's own engines (DAEMON_ENGINE_KINDS) is written by that engine only, on
 * the same save as its own state (src/engines/run-transaction.ts): "one writer, no drift"
 * (the entity reference). RecordRun refuses every write to such a run, and every write that claims
 * one of those kinds, whoever the caller: otherwise any engine token could end a live run in the
 * listing (ended_on is first-write-wins) or give it a cause no trigger produced. The daemon's own
 * triggers hand the cause to the engine that starts the run; they never go through RecordRun.
 *
 * What must stay true: an external write can never change a row of a daemon kind. The pre-read here
 * only shapes the message; the guarantee is the upsert's `WHERE r.engine_kind = EXCLUDED.engine_kind`
 * together with the refusal of daemon kinds before any write, so a row the engine creates between
 * the pre-read and the upsert is still untouchable.
 *
 * Runs of engines outside the daemon keep the merge of src/store/engine-runs.ts, with the checks the
 * directory can make cheaply:
 *  - ended_on is epoch nanoseconds (not before NS_FLOOR: seconds, milliseconds or microseconds given
 *    as nanoseconds land there) and not more than ENDED_AHEAD_MS ahead of the daemon's clock;
 *  - a cause names a firing on record: trigger_firing_id must be a firing of the tenant that started
 *    this run (outcome started, run_id this run) of the trigger triggered_by names, and triggered_by
 *    alone must match such a firing of that trigger (an indexed read on (tenant_key, run_id)). Only
 *    a cause new to the row is looked up; one the row holds was checked when it was stored;
 *  - the run did not end before the firing that caused it fired (ENDED_AHEAD_MS of skew allowed).
 *    The directory has no start time, so this is the only "ended before it started" it can see.
 * ended_on is not restated: the first end wins as before, and a later different one is ignored (an
 * engine may stamp every save after its end with a new time; readers have acted on the first).
 */
import type { EngineRunRow, EngineRunStore, RunFacts } from "../store/engine-runs.js";
import type { FiringRow, TriggerFiringStore } from "../store/trigger-firings.js";
import { ENGINE_KINDS, ENGINE_SERVICES } from "../domain/engine-kinds.js";
import { failedPrecondition, invalidArgument } from "../domain/errors.js";

/** The engine kinds the daemon runs itself, each written to the directory by its own engine only. */
export const DAEMON_ENGINE_KINDS: ReadonlySet<string> = new Set(ENGINE_KINDS);

/** The service a person uses instead, for each daemon kind. */
const SERVICE_OF: Record<string, string> = ENGINE_SERVICES;

/** 10^18 ns is 2001-09-09: an epoch-ns time below it is a time in another unit, not a real end. */
export const NS_FLOOR = 1_000_000_000_000_000_000n;
/** How far ahead of the daemon's clock an external engine's clock may be. */
export const ENDED_AHEAD_MS = 5 * 60_000;
const ENDED_AHEAD_NS = BigInt(ENDED_AHEAD_MS) * 1_000_000n;

const iso = (ns: bigint) => new Date(Number(ns / 1_000_000n)).toISOString();

/** A write's ended_on (non-negative; the wire's 0 is null already) must be a plausible epoch-ns time now. */
function checkEndedOn(raw: bigint, nowNs: bigint): void {
  if (raw < NS_FLOOR)
    throw invalidArgument(
      "ended_on",
      `${raw} is not epoch nanoseconds (as nanoseconds it is ${iso(raw)}); seconds, milliseconds and microseconds must be multiplied up to nanoseconds`,
    );
  if (raw > nowNs + ENDED_AHEAD_NS) {
    const s = (raw - nowNs) / 1_000_000_000n;
    throw invalidArgument(
      "ended_on",
      `${raw} (${iso(raw)}) is ${s} s ahead of the daemon's clock; a run cannot have ended in the future (up to ${ENDED_AHEAD_MS / 1000} s is taken as clock skew)`,
    );
  }
}

export interface WriterDeps {
  runs: EngineRunStore;
  firings: TriggerFiringStore;
}

/**
 * Refuses a RecordRun the rules above do not allow (`f` has passed the wire's format checks);
 * returns the facts to write (triggered_by filled in from the firing when the write named only it).
 */
export async function admitExternalWrite(d: WriterDeps, f: RunFacts, nowNs: bigint): Promise<RunFacts> {
  const stored = await d.runs.get(f.tenantKey, f.runId);
  if (stored && DAEMON_ENGINE_KINDS.has(stored.engine_kind)) throw ownedRun(stored);
  if (DAEMON_ENGINE_KINDS.has(f.engineKind)) {
    throw failedPrecondition(
      `engine_kind '${f.engineKind}' is the daemon's own: its ${f.engineKind} engine records each of its runs itself, on the save of the run's state, and no other writer may; ` +
        `start and drive ${f.engineKind} runs through ${SERVICE_OF[f.engineKind]}, and record here only runs of engines outside the daemon`,
    );
  }
  // After the ownership refusals: a forged end on the daemon's run is told whose run it is.
  if (f.endedOn !== null) checkEndedOn(f.endedOn, nowNs);
  const facts = { ...f };
  let cause: FiringRow | null = null;
  // A cause the row already holds was checked when it was stored: restating it needs no firing, so
  // an engine that repeats its cause on every save keeps working after the firing's retention.
  const newFiring = f.triggerFiringId !== null && f.triggerFiringId !== stored?.trigger_firing_id;
  const newTrigger = f.triggeredBy !== null && f.triggeredBy !== stored?.triggered_by;
  if (newFiring && f.triggerFiringId !== null) {
    cause = await startingFiring(d, f, f.triggerFiringId);
    if (f.triggeredBy !== null && f.triggeredBy !== cause.trigger_name)
      throw failedPrecondition(
        `trigger_firing_id '${cause.id}' is a firing of trigger '${cause.trigger_name}', not '${f.triggeredBy}'; name the trigger that fired, or leave triggered_by empty`,
      );
    facts.triggeredBy = cause.trigger_name;
  } else if (newTrigger && f.triggeredBy !== null) {
    const page = await d.firings.list(f.tenantKey, { triggerName: f.triggeredBy, runId: f.runId, outcomes: ["started"] }, null, 1, 1);
    cause = page.rows[0] ?? null;
    if (!cause)
      throw failedPrecondition(
        `no firing of trigger '${f.triggeredBy}' started run '${f.runId}' in tenant '${f.tenantKey}'; record the firing with RecordFiring (outcome started, run_id '${f.runId}') first, and pass its id as trigger_firing_id`,
      );
  }
  // Checked when this write brings the end or the cause: the stored end when there is one (first
  // wins, so a later end is ignored, not checked), else this write's.
  const newEnd = stored?.ended_on == null && facts.endedOn !== null;
  const endNs = stored?.ended_on ?? facts.endedOn;
  if (endNs !== null && (newEnd || cause !== null)) {
    cause ??= stored?.trigger_firing_id ? await d.firings.get(f.tenantKey, stored.trigger_firing_id) : null;
    if (cause?.fired_on != null && endNs < cause.fired_on - ENDED_AHEAD_NS)
      throw failedPrecondition(
        `run '${f.runId}' would end at ${endNs} (${iso(endNs)}), before firing '${cause.id}' of trigger '${cause.trigger_name}' that caused it fired at ${cause.fired_on} (${iso(cause.fired_on)}); a run cannot end before what started it`,
      );
  }
  return facts;
}

/** The message for any write to a run of the daemon's own engine. */
export function ownedRun(row: Pick<EngineRunRow, "run_id" | "tenant_key" | "engine_kind">) {
  return failedPrecondition(
    `run '${row.run_id}' belongs to the daemon's ${row.engine_kind} engine; only it records the run (on the save of the run's own state), so RecordRun writes nothing to it. ` +
      `Read it with GetRun or ${SERVICE_OF[row.engine_kind]}; to end it, cancel it through ${SERVICE_OF[row.engine_kind]}`,
  );
}

/** The firing `id` names, when it is the one that started run f.runId; refuses otherwise. */
async function startingFiring(d: WriterDeps, f: RunFacts, id: string): Promise<FiringRow> {
  const firing = await d.firings.get(f.tenantKey, id);
  if (!firing)
    throw failedPrecondition(
      `trigger_firing_id '${id}' names no firing of tenant '${f.tenantKey}'; record the firing with RecordFiring first and pass the id it returns (firings older than --firing-retention-days are deleted)`,
    );
  if (firing.outcome === "signalled")
    throw failedPrecondition(`firing '${id}' signalled run '${firing.run_id}'; only the firing that started a run is its cause`);
  if (firing.outcome !== "started" || firing.run_id === null)
    throw failedPrecondition(`firing '${id}' has outcome '${firing.outcome}': it started no run, so it caused none`);
  if (firing.run_id !== f.runId) throw failedPrecondition(`firing '${id}' started run '${firing.run_id}', not '${f.runId}'`);
  return firing;
}
