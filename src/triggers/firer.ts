/**
 * Fires a trigger: carries out its action (a run of its engine's stored definition started; an
 * event for a run, to whichever engine the run directory says owns it) and records the firing in
 * aiflow_trigger_firing, once, after the outcome is known.
 *
 * What must stay true:
 * - A firing that starts or moves a run is recorded in that run's own transaction (the engine's
 *   RunHooks), so a run a trigger started always has its firing row, and its directory row names
 *   the trigger and the firing (triggered_by, trigger_firing_id). A crash before the commit leaves
 *   neither; after it, both.
 * - A refusal (the action could not be carried out: no such definition, run or event, a bad
 *   signature…) is recorded alone, with the action, definition and event it was meant to carry,
 *   and changes nothing else. A replay (a replay key already acted on) is the one refusal `fire`
 *   does not record: it throws Replayed, and the webhook records it as a delivery that proved
 *   nothing (./webhook.ts), since anyone who once saw the delivery can send it again. A failure (a bug) is recorded as `failed` with words
 *   that point to the log, never the cause's text, which may quote the payload.
 * - With the database away nothing can be recorded: the error goes to the caller (the webhook
 *   answers 503, cron tries the tick again at the next sweep) and nothing was written.
 */
import type { DatabasePool, DatabaseTransactionConnection } from "slonik";
import type { Clock } from "../clock.js";
import { isEngineKind } from "../domain/engine-kinds.js";
import type { RunHooks } from "../engines/engine.js";
import type { Engines } from "../engines/engines.js";
import { EngineRunStore } from "../store/engine-runs.js";
import type { Tables } from "../db/tables.js";
import { AppError, notFound, type ErrorKind } from "../domain/errors.js";
import type { Logger } from "../log.js";
import type { TriggerEvents } from "../observability/metrics.js";
import { TriggerFiringStore, type FiringInput, type FiringOutcome } from "../store/trigger-firings.js";
import { TriggerStore, type TriggerRow } from "../store/triggers.js";
import { newId } from "../util/ids.js";
import { replayMessage } from "./signature.js";

/** One firing of a known trigger. */
export interface Firing {
  trigger: TriggerRow;
  /** The payload exactly as it arrived (stored as is). */
  payloadText: string | null;
  /** The payload as JSON, for the run's context or the signal (null when there is none). */
  payload: unknown;
  /** The source's time, epoch ns. */
  firedOnNs: bigint;
  /**
   * What makes a webhook delivery act at most once: its delivery id and the replay key of its
   * signature (./signature.ts), each claimed in the run's transaction. Empty for cron.
   */
  replayKeys: readonly string[];
}

/**
 * A cron tick's hold on its trigger: `take` locks the trigger row (throwing TickTaken when another
 * daemon holds it or has fired the tick), `consume` moves the trigger past the tick. Both run in the
 * transaction that records the firing, whatever its outcome.
 */
export interface TickHold {
  take(tx: DatabaseTransactionConnection): Promise<void>;
  consume(tx: DatabaseTransactionConnection): Promise<void>;
}

/** Another daemon fired, or is firing, this tick: nothing to do. */
export class TickTaken extends Error {}

/** Why a firing was refused, beyond the domain's error kinds. */
export type Refusal = ErrorKind | "replayed" | "unsigned" | "stale" | "too_large" | "unknown_trigger" | "bad_body";

export interface FireResult {
  outcome: FiringOutcome;
  firingId: string;
  runId: string | null;
  error: string | null;
  /** Set on a refusal. */
  refusal?: Refusal;
}

/** A refusal the firer raises itself (the engine's are AppErrors). */
export class FiringRefused extends Error {
  constructor(
    readonly refusal: Refusal,
    message: string,
  ) {
    super(message);
  }
}

/** A delivery whose replay key `key` was already acted on, in `firingId`; nothing was written. */
export class Replayed extends FiringRefused {
  constructor(
    readonly key: string,
    readonly firingId: string | null,
  ) {
    super("replayed", replayMessage(key, firingId));
  }
}

export class TriggerFirer {
  constructor(private readonly d: { pool: DatabasePool; tables: Tables; engines: Pick<Engines, "of">; clock: Clock; log: Logger; metrics: TriggerEvents }) {}

  /** Carries out the trigger's action and records the firing; see the module's comment. */
  async fire(f: Firing, tick?: TickHold): Promise<FireResult> {
    const { trigger: t } = f;
    const firingId = newId(this.d.clock.nowMs());
    let runId: string | null = t.action === "signal" ? t.run_id : null;
    const recordOn = (tx: DatabaseTransactionConnection, outcome: FiringOutcome, run: string | null, error: string | null) =>
      new TriggerFiringStore(tx, this.d.tables).insert(this.#row(f, outcome, run, error), this.d.clock.nowMs(), by(t.name), firingId);
    const hooks = (outcome: FiringOutcome): RunHooks => ({
      guard: tick ? (tx) => tick.take(tx) : undefined,
      record: async (tx, run) => {
        const deliveries = new TriggerStore(tx, this.d.tables);
        for (const key of f.replayKeys)
          if (!(await deliveries.claimDelivery(t.tenant_key, t.name, key, firingId, this.d.clock.nowMs())))
            throw new Replayed(key, (await deliveries.claimed(t.tenant_key, t.name, [key]))?.firingId ?? null);
        await recordOn(tx, outcome, run.id, null);
        await tick?.consume(tx);
      },
    });
    const scope = { by: t.owner, tenantKey: t.tenant_key };
    try {
      if (t.action === "start") {
        const context = { payload: f.payload, trigger: { name: t.name, firing_id: firingId, fired_on: f.firedOnNs.toString() } };
        const cause = { trigger: t.name, firingId };
        const started = await this.d.engines.of(t.engine_kind ?? "dag").startStored(scope, t.definition_id!, context, cause, hooks("started"));
        return this.#done(t, { outcome: "started", firingId, runId: started, error: null });
      }
      runId ??= runIdAt(f.payload, t.run_id_path!);
      const target = runId;
      const owner = await new EngineRunStore(this.d.pool, this.d.tables).get(t.tenant_key, target);
      // A run no engine of the daemon owns reads as no run (as another caller's does).
      if (!owner || !isEngineKind(owner.engine_kind)) throw notFound(`tenant '${t.tenant_key}' has no run '${target}' of yours`);
      await this.d.engines.of(owner.engine_kind).signal(scope, target, t.event!, f.payload, hooks("signalled"));
      return this.#done(t, { outcome: "signalled", firingId, runId: target, error: null });
    } catch (err) {
      if (err instanceof TickTaken || err instanceof Replayed) throw err;
      if (err instanceof AppError && err.kind === "unavailable") throw err;
      const refused = err instanceof FiringRefused ? err.refusal : err instanceof AppError ? err.kind : undefined;
      if (refused === undefined) this.d.log.error({ err, trigger: t.name, tenant: t.tenant_key, firing: firingId }, "a trigger's action failed");
      const outcome: FiringOutcome = refused === undefined ? "failed" : "refused";
      const error = refused === undefined ? `internal error: the daemon's log says why (firing ${firingId})` : (err as Error).message;
      // The run id it was meant for is evidence too, but the column means "what it started or moved".
      await this.record(this.#row(f, outcome, null, error), tick, firingId);
      return { outcome, firingId, runId: null, error, ...(refused ? { refusal: refused } : {}) };
    }
  }

  /**
   * Records a refusal that came before any action: an unknown trigger, a bad signature, a body too
   * large or not JSON. `trigger` is null when no trigger of that name exists (then nothing is known
   * of what it meant to do).
   */
  async refuse(
    where: { tenantKey: string; name: string },
    trigger: TriggerRow | null,
    payloadText: string | null,
    firedOnNs: bigint,
    refusal: FiringRefused,
  ): Promise<FireResult> {
    const firingId = newId(this.d.clock.nowMs());
    const row: FiringInput = trigger
      ? this.#row({ trigger, payloadText, payload: null, firedOnNs, replayKeys: [] }, "refused", null, refusal.message)
      : {
          tenantKey: where.tenantKey,
          triggerName: where.name,
          triggerType: "webhook",
          payload: payloadText,
          action: null,
          definitionId: null,
          event: null,
          runId: null,
          outcome: "refused",
          error: refusal.message,
          firedOn: firedOnNs,
        };
    await this.record(row, undefined, firingId);
    return { outcome: "refused", firingId, runId: null, error: refusal.message, refusal: refusal.refusal };
  }

  /** Records a firing that changed nothing else (a refusal, a failure), under the tick's hold when it is a cron tick's. */
  async record(row: FiringInput, tick?: TickHold, firingId: string = newId(this.d.clock.nowMs())): Promise<string> {
    await this.d.pool.transaction(async (tx) => {
      await tick?.take(tx);
      await new TriggerFiringStore(tx, this.d.tables).insert(row, this.d.clock.nowMs(), by(row.triggerName), firingId);
      await tick?.consume(tx);
    });
    this.d.metrics.triggerFired(row.triggerType ?? "", row.outcome);
    return firingId;
  }

  #row(f: Firing, outcome: FiringOutcome, runId: string | null, error: string | null): FiringInput {
    const t = f.trigger;
    return {
      tenantKey: t.tenant_key,
      triggerName: t.name,
      triggerType: t.trigger_type,
      payload: f.payloadText,
      action: t.action,
      definitionId: t.definition_id,
      event: t.event,
      runId,
      outcome,
      error,
      firedOn: f.firedOnNs,
    };
  }

  #done(t: TriggerRow, r: FireResult): FireResult {
    this.d.metrics.triggerFired(t.trigger_type, r.outcome);
    return r;
  }
}

/** Who wrote a firing row: the trigger, by name. */
const by = (name: string) => `trigger:${name}`;

/** The run id at a dotted path of a JSON body; a refusal naming the path when it is not a run id there. */
export function runIdAt(payload: unknown, path: string): string {
  let v: unknown = payload;
  for (const key of path.split(".")) v = v !== null && typeof v === "object" && !Array.isArray(v) ? (v as Record<string, unknown>)[key] : undefined;
  if (typeof v !== "string" || !/^[A-Za-z0-9_.:-]{1,128}$/.test(v)) throw new FiringRefused("not_found", `the body has no run id at '${path}'`);
  return v;
}
