/**
 * What the graph and state-machine engines share: a transaction of one run (its row, its directory
 * row, the work items it queues or cancels) and the advance loop that applies the outcomes of their
 * work items.
 *
 * What must stay true (as for the DAG engine, ../dag/engine.ts):
 * - Every change to a run is one transaction under the run row's lock: a call's, or an advance's.
 *   A run's directory row (aiflow_engine_run) is written in that same transaction, and the items it
 *   queues are inserted in it too, so a step and its item commit together or not at all.
 * - An advance takes a run's events (migration 0012's trigger wrote each in the transaction that
 *   ended its work item) and applies them in the transaction that deletes them: a daemon killed in
 *   between loses nothing (the events wait for the next advance, on any daemon) and doubles nothing.
 *   Daemons lock runs with SKIP LOCKED, so several advance one database's runs, never one run twice
 *   at once.
 * - An advance starts when a daemon hears the trigger's NOTIFY and on every maintenance tick (a
 *   notification may be lost with a dropped listener).
 * - Every save of a run sends `r<run id>` on the same channel at commit, which watchers (WatchRun,
 *   on any daemon) hear; the trigger's notifications are the bare run id, which start advances.
 */
import { performance } from "node:perf_hooks";
import { sql, type DatabasePool, type DatabaseTransactionConnection } from "slonik";
import { msToNs, type Clock } from "../clock.js";
import type { Config } from "../config.js";
import type { Scope } from "./dag/engine.js";
import type { PgListener } from "../db/notify.js";
import type { Tables } from "../db/tables.js";
import type { Logger } from "../log.js";
import type { MaintenanceTask } from "../maintenance.js";
import type { EngineEvents, EngineStepKind } from "../observability/metrics.js";
import { KickLoop } from "../util/kick-loop.js";
import type { WorkQueue } from "../queue/work-queue.js";
import type { NativeKind } from "../store/engine-definitions.js";
import { EngineEventStore, type ItemEnded } from "../store/engine-events.js";
import { EngineRunStore } from "../store/engine-runs.js";
import type { EnqueueRow, NewItem, Requeued, WorkItemStore } from "../store/work-items.js";
import { newId } from "../util/ids.js";
import { enqueueQuota } from "../queue/enqueue-quota.js";

export interface NativeDeps {
  pool: DatabasePool;
  tables: Tables;
  config: Config;
  clock: Clock;
  log: Logger;
  queue: WorkQueue;
  listener: PgListener;
  /** The queue's statements on a transaction. */
  itemsOn: (db: DatabaseTransactionConnection) => WorkItemStore;
  metrics: EngineEvents;
}

/** The LISTEN/NOTIFY topic of both engines (migration 0012's trigger sends on it too): bare run ids start advances, `r<run id>` tells watchers. */
export const TOPIC = "engines";

/** Whose runs a call may touch: the caller's, in the tenant it names (as for DAG runs). */
export type { Scope };

/** The trigger firing that started a run. */
export interface Cause {
  trigger: string;
  firingId: string;
}

/**
 * What a caller other than the engine's own service adds to a run's transaction (a trigger's
 * firing): `guard` runs first (under the run's lock for a change) and may throw to write nothing;
 * `record` runs after the run and its directory row are saved, before the commit.
 */
export interface RunHooks {
  guard?: (w: Writes) => Promise<void>;
  record?: (w: Writes, run: { id: string }) => Promise<void>;
}

/** What one transaction of a run writes besides its row: the items it queues and cancels. */
export class Writes {
  readonly enqueued: EnqueueRow[] = [];
  readonly revoked: Requeued[] = [];
  readonly nowNs: bigint;
  /** How the run ended in this transaction, when it did (for the metrics, after the commit). */
  ended: string | null = null;
  /** Runs saved in this transaction: their watchers are told at commit. */
  readonly #saved = new Set<string>();

  constructor(
    readonly tx: DatabaseTransactionConnection,
    private readonly d: NativeDeps,
    readonly nowMs: number,
  ) {
    this.nowNs = msToNs(nowMs);
  }

  /** Queues `item` for the run (inserted at the end of the transaction); returns its id. */
  enqueue(tenantKey: string, by: string, runId: string, taskId: string, taskName: string, item: NewItem): string {
    const id = newId(this.nowMs);
    this.enqueued.push({ id, tenant: tenantKey, engineId: this.d.config.instanceId, by, nowMs: this.nowMs, item: { ...item, runId, taskId, taskName } });
    return id;
  }

  /** Cancels a run's work item now; its holder is told after the commit. */
  async cancel(tenantKey: string, itemId: string, reason: string, by: string): Promise<void> {
    this.revoked.push(...(await this.d.itemsOn(this.tx).cancel(tenantKey, { ids: [itemId], runId: null, parentIds: [] }, reason, this.nowMs, by)));
  }

  /** The run's directory row, on the same save. */
  async record(kind: NativeKind, r: { tenantKey: string; runId: string; definitionId: string; by: string; ended: boolean; cause?: Cause }): Promise<void> {
    await new EngineRunStore(this.tx, this.d.tables).recordOwn(
      {
        tenantKey: r.tenantKey,
        runId: r.runId,
        engineKind: kind,
        definitionId: r.definitionId,
        parentRunId: null,
        // Known at the start only; later saves leave them as the start wrote them (the directory merges).
        triggeredBy: r.cause?.trigger ?? null,
        triggerFiringId: r.cause?.firingId ?? null,
        endedOn: r.ended ? this.nowNs : null,
      },
      this.nowMs,
      r.by,
    );
    this.#saved.add(r.runId);
  }

  async flush(): Promise<void> {
    if (this.enqueued.length > 0) await this.d.itemsOn(this.tx).enqueueRows(this.enqueued);
    const channel = this.d.tables.channel(TOPIC);
    for (const runId of this.#saved) await this.tx.query(sql.unsafe`SELECT pg_notify(${channel}, ${`r${runId}`})`);
  }
}

/**
 * Runs `fn` in one transaction (a `step` of `engine`'s), then wakes claims for the items it queued,
 * tells holders of those it cancelled and counts it.
 */
export async function inRunTransaction<T>(
  d: NativeDeps,
  /** `counted`: whether what the transaction returned counts as a step (an advance that found no run does not). */
  step: { engine: NativeKind; kind: EngineStepKind; counted?: (value: T) => boolean },
  reason: string,
  fn: (w: Writes) => Promise<T>,
): Promise<T> {
  const began = performance.now();
  let writes: Writes | undefined;
  const out = await d.pool.transaction(async (tx) => {
    writes = new Writes(tx, d, d.clock.nowMs());
    const value = await fn(writes);
    // What the step queues, before it commits: a call's admitted or refused whole, an advance's charged.
    const quota = enqueueQuota(d.queue);
    for (const [tenant, n] of countBy(writes.enqueued.map((e) => e.tenant)))
      if (step.kind === "start" || step.kind === "signal") quota.admit(tenant, n, `the ${step.engine} run's ${step.kind}`);
      else quota.charge(tenant, n);
    await writes.flush();
    return value;
  });
  const w = writes!;
  await d.queue.announce(w.enqueued, w.revoked, reason);
  if (step.counted?.(out) ?? true) d.metrics.engineStep(step.engine, step.kind, (performance.now() - began) / 1000);
  if (w.ended !== null) d.metrics.engineRunEnded(step.engine, w.ended);
  return out;
}

/** Applies the outcomes of a kind's work items to its runs, one locked run per transaction. */
export class Advancer {
  readonly #loop: KickLoop;
  #unlisten: (() => void) | undefined;

  constructor(
    private readonly kind: NativeKind,
    private readonly d: NativeDeps,
    /** Applies a locked run's events (oldest first) in the advance's transaction. */
    private readonly apply: (w: Writes, runId: string, events: readonly ItemEnded[]) => Promise<void>,
  ) {
    this.#loop = new KickLoop(
      () => this.advanceDue(),
      (err) => this.d.log.warn({ err, engine: this.kind }, "advancing runs failed; the next notification or sweep tries again"),
    );
  }

  async start(): Promise<void> {
    this.#unlisten = await this.d.listener.on(this.d.tables.channel(TOPIC), (payload) => {
      if (!payload.startsWith("r")) this.kick();
    });
    this.d.listener.onReconnect(() => this.kick());
    this.kick();
  }

  async stop(): Promise<void> {
    this.#unlisten?.();
    await this.#loop.stop();
  }

  kick(): void {
    this.#loop.kick();
  }

  task(): MaintenanceTask {
    return { name: `${this.kind}-advance`, run: () => this.advanceDue() };
  }

  /** Advances runs with events until none is left that another daemon is not advancing; returns how many. */
  async advanceDue(): Promise<number> {
    let n = 0;
    const events = (w: Writes) => new EngineEventStore(w.tx, this.d.tables);
    for (;;) {
      const did = await inRunTransaction(this.d, { engine: this.kind, kind: "advance", counted: (advanced: boolean) => advanced }, "its run was cancelled", async (w) => {
        const runId = await events(w).lockDue(this.kind);
        if (runId === null) return false;
        await this.apply(w, runId, await events(w).take(this.kind, runId));
        return true;
      });
      if (!did) return n;
      n++;
    }
  }
}

const countBy = (keys: readonly string[]) => {
  const n = new Map<string, number>();
  for (const k of keys) n.set(k, (n.get(k) ?? 0) + 1);
  return n;
};

/** An ended item's result as JSON (null when it had none). */
export const resultOf = (e: ItemEnded): unknown => (e.result === null ? null : JSON.parse(e.result));
