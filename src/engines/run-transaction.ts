/**
 * One transaction of one run, for every engine: a call's (start, cancel, signal, resume) or an
 * advance's.
 *
 * What must stay true:
 * - Every change to a run is one transaction under the run row's lock. The run's directory row
 *   (aiflow_engine_run) is written in that same transaction, and the items it queues are inserted in
 *   it too (last, so the tenant's fair-share row the insert takes is held for the commit alone): a
 *   step and its items commit together or not at all.
 * - What a step queues is held to the enqueue quota (../queue/enqueue-quota.ts) before it commits: a
 *   call's is admitted whole or refused (and writes nothing), an advance's is charged.
 * - Every save of a run sends `r<run id>` on the engines' channel at commit, which watchers
 *   (./run-watch.ts, on any daemon) hear; migration 0017's trigger sends the bare run id, which
 *   starts advances (./advancer.ts). One channel, one convention, for every engine.
 * - After the commit, and only then: claims are woken for the items queued, holders of the items
 *   cancelled are told, the step is counted and the engine's own after-commit work runs (the DAG's
 *   audit records).
 */
import { performance } from "node:perf_hooks";
import { sql, type DatabaseTransactionConnection } from "slonik";
import { msToNs } from "../clock.js";
import type { EngineKind } from "../domain/engine-kinds.js";
import type { EngineStepKind } from "../observability/metrics.js";
import { enqueueQuota } from "../queue/enqueue-quota.js";
import { EngineRunStore } from "../store/engine-runs.js";
import type { EnqueueRow, NewItem, Requeued } from "../store/work-items.js";
import { newId } from "../util/ids.js";
import type { Cause, EngineDeps } from "./deps.js";

/** The LISTEN/NOTIFY topic of every engine: bare run ids start advances, `r<run id>` tells watchers. */
export const TOPIC = "engines";

/** What one transaction of a run writes besides its row: the items it queues and cancels, its directory row. */
export class RunTx {
  readonly enqueued: EnqueueRow[] = [];
  readonly revoked: Requeued[] = [];
  readonly nowNs: bigint;
  /** How the run ended in this transaction, when it did (for the metrics, after the commit). */
  ended: string | null = null;
  /** Events an advance applied in this transaction (for the metrics). */
  events = 0;
  /** Runs saved in this transaction: their watchers are told at commit. */
  readonly #saved = new Set<string>();
  readonly #afterCommit: (() => void)[] = [];

  constructor(
    readonly tx: DatabaseTransactionConnection,
    private readonly d: EngineDeps,
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

  /**
   * The run's directory row, on the same save. `endNs`: when it ended (now, unless the engine
   * keeps its own end time); `reopened`: it ran again after it ended (the directory's end goes back
   * to null).
   */
  async record(
    kind: EngineKind,
    r: { tenantKey: string; runId: string; definitionId: string; by: string; ended: boolean; endNs?: bigint | null; reopened?: boolean; cause?: Cause },
  ): Promise<void> {
    const directory = new EngineRunStore(this.tx, this.d.tables);
    if (r.reopened) await directory.reopen(r.tenantKey, r.runId, r.by, this.nowMs);
    await directory.recordOwn(
      {
        tenantKey: r.tenantKey,
        runId: r.runId,
        engineKind: kind,
        definitionId: r.definitionId,
        parentRunId: null,
        // Known at the start only; later saves leave them as the start wrote them (the directory merges).
        triggeredBy: r.cause?.trigger ?? null,
        triggerFiringId: r.cause?.firingId ?? null,
        endedOn: r.ended ? (r.endNs ?? this.nowNs) : null,
      },
      this.nowMs,
      r.by,
    );
    this.#saved.add(r.runId);
  }

  /** Runs `fn` after the commit (never when the transaction rolls back). */
  afterCommit(fn: () => void): void {
    this.#afterCommit.push(fn);
  }

  /** The transaction's last statements: its items, then its watchers' notifications. */
  async flush(): Promise<void> {
    if (this.enqueued.length > 0) await this.d.itemsOn(this.tx).enqueueRows(this.enqueued);
    const channel = this.d.tables.channel(TOPIC);
    for (const runId of this.#saved) await this.tx.query(sql.unsafe`SELECT pg_notify(${channel}, ${`r${runId}`})`);
  }

  /** After the commit: claims woken, holders told, the engine's own work. */
  async committed(reason: string): Promise<void> {
    await this.d.queue.announce(this.enqueued, this.revoked, reason);
    for (const fn of this.#afterCommit) fn();
  }
}

/**
 * Runs `fn` in one transaction (a `step` of `engine`'s), then wakes claims for the items it queued,
 * tells holders of those it cancelled and counts it.
 */
export async function inRunTransaction<T>(
  d: EngineDeps,
  /** `counted`: whether what the transaction returned counts as a step (an advance that found no run does not). */
  step: { engine: EngineKind; kind: EngineStepKind; counted?: (value: T) => boolean },
  /** What holders of the items it cancels are told. */
  reason: string,
  fn: (w: RunTx) => Promise<T>,
): Promise<T> {
  const began = performance.now();
  let writes: RunTx | undefined;
  const out = await d.pool.transaction(async (tx) => {
    writes = new RunTx(tx, d, d.clock.nowMs());
    const value = await fn(writes);
    // What the step queues, before it commits: a call's admitted or refused whole, an advance's charged.
    const quota = enqueueQuota(d.queue);
    for (const [tenant, n] of countBy(writes.enqueued.map((e) => e.tenant)))
      if (step.kind === "advance") quota.charge(tenant, n);
      else quota.admit(tenant, n, `the ${step.engine} run's ${step.kind}`);
    await writes.flush();
    return value;
  });
  const w = writes!;
  await w.committed(reason);
  if (step.counted?.(out) ?? true) d.metrics.engineStep(step.engine, step.kind, (performance.now() - began) / 1000, w.events, w.enqueued.length);
  if (w.ended !== null) d.metrics.engineRunEnded(step.engine, w.ended);
  return out;
}

const countBy = (keys: readonly string[]) => {
  const n = new Map<string, number>();
  for (const k of keys) n.set(k, (n.get(k) ?? 0) + 1);
  return n;
};
