/**
 * The DAG engine: runs of DAG definitions on the work queue (aiflow_run, aiflow_task,
 * aiflow_checkpoint, with the run's aiflow_engine_run row written on the same save).
 *
 * Every change to a run is one transaction under the run row's lock (FOR UPDATE): a call's
 * (start, cancel, signal, resume) or an advance's. An advance takes the run's due events (a node's
 * work item ended: the trigger of migration 0010 wrote the event in the transaction that ended it;
 * or a timeout came due), applies them with a Step (./step.ts) and deletes them, all in that one
 * transaction. So a completion and its event commit together, and an event and its advance commit
 * together: a daemon killed in between loses nothing (the events wait for the next advance, on any
 * daemon) and doubles nothing (an applied event is gone). Daemons lock due runs with SKIP LOCKED,
 * so several advance one database's runs without ever advancing one run twice at once.
 *
 * An advance starts when a daemon hears the trigger's NOTIFY for a run, and on every maintenance
 * tick (timeouts come due by the clock; a notification may be lost with a dropped listener).
 * Watchers hear a NOTIFY of the run's id that every save sends at commit.
 *
 * What a step queues is held to the enqueue quota (../queue/enqueue-quota.ts) before it commits: a
 * call's step is admitted whole or refused (and writes nothing), an advance's is charged.
 */
import { performance } from "node:perf_hooks";
import type { DatabasePool, DatabaseTransactionConnection } from "slonik";
import { msToNs, type Clock } from "../../clock.js";
import type { Config } from "../../config.js";
import type { AuditLog } from "../../audit.js";
import type { PgListener } from "../../db/notify.js";
import type { Tables } from "../../db/tables.js";
import { notFound } from "../../domain/errors.js";
import type { Logger } from "../../log.js";
import type { MaintenanceTask } from "../../maintenance.js";
import type { DagEvents, DagStepKind } from "../../observability/metrics.js";
import type { WorkQueue } from "../../queue/work-queue.js";
import { DagRunStore, type RunRow, type TaskRow } from "../../store/dag-runs.js";
import { EngineRunStore } from "../../store/engine-runs.js";
import type { WorkItemRow, WorkItemStore } from "../../store/work-items.js";
import { newId } from "../../util/ids.js";
import { fromJson } from "@bufbuild/protobuf";
import { DefinitionSchema } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import type { NodeRec, RunCause, RunMeta } from "./model.js";
import { planOf, type Plan } from "./plan.js";
import { Step } from "./step.js";
import { RunWatch } from "../run-watch.js";
import { KickLoop } from "../../util/kick-loop.js";
import { enqueueQuota } from "../../queue/enqueue-quota.js";

/** Runs whose plans a daemon keeps in memory. */
const PLAN_CACHE = 1_000;

export interface EngineDeps {
  pool: DatabasePool;
  tables: Tables;
  config: Config;
  clock: Clock;
  log: Logger;
  queue: WorkQueue;
  listener: PgListener;
  audit: AuditLog;
  /** The queue's statements on a transaction (no prepared statements: they run on the pool's connections). */
  itemsOn: (db: DatabaseTransactionConnection) => WorkItemStore;
  metrics: DagEvents;
}

/** Whose runs a call may touch: the caller's, in the tenant it names. */
export interface Scope {
  by: string;
  tenantKey: string;
}

/**
 * What a caller other than DagService adds to a step's transaction (the trigger firings): `guard`
 * runs first, under the run's lock for a change (before it for a start), and may throw to write
 * nothing; `record` runs after the run and its directory row are saved, before the commit.
 */
export interface StepHooks {
  guard?: (tx: DatabaseTransactionConnection) => Promise<void>;
  record?: (tx: DatabaseTransactionConnection, run: { id: string }) => Promise<void>;
}

/** A run as GetRun shows it: its row, its attempts and its live work items' state. */
export interface RunView {
  run: RunRow;
  tasks: readonly TaskRow[];
  items: ReadonlyMap<string, WorkItemRow>;
}

export class DagEngine {
  readonly channel: string;
  readonly runs: DagRunStore;
  readonly #watches: RunWatch;
  readonly #advances: KickLoop;
  /** Plans of runs this daemon touched lately, by run id: a run's plan never changes, and reading it is most of reading a big run. */
  readonly #plans = new Map<string, Plan>();
  #unlisten: (() => void) | undefined;

  constructor(private readonly d: EngineDeps) {
    this.channel = d.tables.channel("dag");
    this.runs = new DagRunStore(d.pool, d.tables);
    this.#watches = new RunWatch(d, "dag");
    this.#advances = new KickLoop(
      () => this.advanceDue(),
      (err) => this.d.log.warn({ err }, "advancing DAG runs failed; the next notification or sweep tries again"),
    );
  }

  async start(): Promise<void> {
    this.#unlisten = await this.d.listener.on(this.channel, (payload) => {
      if (payload.startsWith("e")) this.kick();
    });
    await this.#watches.start();
    this.d.listener.onReconnect(() => this.kick());
    this.kick();
  }

  async stop(): Promise<void> {
    this.#unlisten?.();
    await this.#watches.stop();
    await this.#advances.stop();
  }

  /** Advances every run with due events, once now and again if kicked meanwhile. */
  kick(): void {
    this.#advances.kick();
  }

  /** The sweep: due timeouts, and events whose notification was lost. */
  task(): MaintenanceTask {
    return { name: "dag-advance", run: () => this.advanceDue() };
  }

  /** Advances runs with due events until none is left that another daemon is not advancing; returns how many steps it took. */
  async advanceDue(): Promise<number> {
    let steps = 0;
    for (;;) {
      const nowMs = this.d.clock.nowMs();
      const began = performance.now();
      let applied = 0;
      const step = await this.d.pool.transaction(async (tx) => {
        const runs = new DagRunStore(tx, this.d.tables);
        const run = await this.#withPlan(runs, await runs.lockDueRun(msToNs(nowMs)));
        if (!run) return null;
        const events = await runs.takeEvents(run.id, msToNs(nowMs));
        applied = events.length;
        const s = this.#step(tx, run, `dag:${this.d.config.instanceId}`, nowMs, false);
        await s.apply(events);
        enqueueQuota(this.d.queue).charge(run.meta.tenantKey, s.enqueued.length);
        await this.#save(tx, s, nowMs);
        return s;
      });
      if (!step) return steps;
      steps++;
      await this.#after(step, "update", "advance", began, applied);
    }
  }

  /** The tenant's stored definition `definitionId`, planned; NOT_FOUND when there is none. */
  async storedPlan(tenantKey: string, definitionId: string): Promise<Plan> {
    const body = await this.runs.definition(tenantKey, definitionId);
    if (body === null) throw notFound(`tenant '${tenantKey}' has no stored definition '${definitionId}' (store one with PutDefinition)`);
    return planOf(fromJson(DefinitionSchema, JSON.parse(body)), this.d.config, false);
  }

  /** Starts a run (or finds the caller's run of the idempotency key); `cause` names the trigger firing that started it. */
  async startRun(
    scope: Scope,
    plan: Plan,
    context: Record<string, unknown>,
    idempotencyKey: string | null,
    cause?: RunCause,
    hooks: StepHooks = {},
  ): Promise<{ run: RunRow; existing: boolean }> {
    const nowMs = this.d.clock.nowMs();
    const id = newId(nowMs);
    const nodes: Record<string, NodeRec> = Object.fromEntries(plan.nodes.map((n) => [n.name, { s: "pending", a: 0 } satisfies NodeRec]));
    const meta: RunMeta = {
      tenantKey: scope.tenantKey,
      plan,
      nodes,
      affinityKey: plan.affinity === "run" ? `run:${id}` : null,
      pendingEvents: {},
      workers: {},
      ...(idempotencyKey ? { idempotencyKey } : {}),
      ...(cause ? { cause } : {}),
    };
    const nowNs = msToNs(nowMs);
    const states = [{ state: "running" as const, at: nowNs.toString(), by: scope.by }];
    const began = performance.now();
    const step = await this.d.pool.transaction(async (tx) => {
      await hooks.guard?.(tx);
      const runs = new DagRunStore(tx, this.d.tables);
      const inserted = await runs.insertRun({ id, definitionId: plan.definitionId, context, meta, states, startNs: nowNs, by: scope.by, nowMs });
      if (!inserted) return null;
      this.#keepPlan(id, plan);
      const run = (await this.#withPlan(runs, await runs.get(id, null, true)))!;
      const s = this.#step(tx, run, scope.by, nowMs, true);
      await s.start();
      enqueueQuota(this.d.queue).admit(scope.tenantKey, s.enqueued.length, "the run's start");
      await this.#save(tx, s, nowMs);
      await hooks.record?.(tx, s.run);
      return s;
    });
    if (!step) {
      const existing = await this.#withPlan(this.runs, await this.runs.byIdempotencyKey(scope.by, scope.tenantKey, idempotencyKey!));
      if (!existing) throw new Error(`run idempotency key '${idempotencyKey}' of ${scope.by} conflicted but its run is not there`);
      return { run: existing, existing: true };
    }
    await this.#after(step, "create", "start", began, 0);
    return { run: step.run, existing: false };
  }

  /** A call's step (`kind`) on one of the caller's runs (NOT_FOUND for anyone else's): cancel, signal, resume. */
  async change<T>(kind: DagStepKind, scope: Scope, runId: string, fn: (s: Step) => Promise<T>, hooks: StepHooks = {}): Promise<{ run: RunRow; value: T }> {
    const nowMs = this.d.clock.nowMs();
    const began = performance.now();
    const out = await this.d.pool.transaction(async (tx) => {
      const runs = new DagRunStore(tx, this.d.tables);
      const run = await this.#withPlan(runs, await runs.get(runId, scope, true));
      if (!run) throw notFound(`tenant '${scope.tenantKey}' has no run '${runId}' of yours`);
      await hooks.guard?.(tx);
      const s = this.#step(tx, run, scope.by, nowMs, true);
      const value = await fn(s);
      enqueueQuota(this.d.queue).admit(scope.tenantKey, s.enqueued.length, `the run's ${kind}`);
      await this.#save(tx, s, nowMs);
      await hooks.record?.(tx, s.run);
      return { s, value };
    });
    await this.#after(out.s, "update", kind, began, 0);
    return { run: out.s.run, value: out.value };
  }

  /**
   * The caller's run with its attempts and the live state of its work items (or only its nodes'
   * states), or null. With `anyCaller` (the operators' read), any run of the scope's tenant.
   */
  async view(scope: Scope, runId: string, attempts = true, anyCaller = false): Promise<RunView | null> {
    const run = await this.#withPlan(this.runs, await this.runs.get(runId, anyCaller ? null : scope));
    if (!run || run.meta.tenantKey !== scope.tenantKey) return null;
    if (!attempts) return { run, tasks: [], items: new Map() };
    const [tasks, items] = await Promise.all([this.runs.tasksOfRun(run.id), this.d.queue.store.find(scope.tenantKey, [], run.id)]);
    return { run, tasks, items: new Map(items.map((i) => [i.id, i])) };
  }

  /**
   * Calls `onChange` whenever the run is saved (on any daemon), until the returned function is
   * called. A change missed while the listener reconnected is reported as a change.
   */
  watch(runId: string, onChange: () => void): () => void {
    return this.#watches.watch(runId, onChange);
  }

  /** The run with its plan, from the cache or read once. */
  async #withPlan(runs: DagRunStore, run: RunRow | null): Promise<RunRow | null> {
    if (!run) return null;
    let plan = this.#plans.get(run.id);
    if (!plan) {
      plan = (await runs.planOf(run.id))!;
      this.#keepPlan(run.id, plan);
    }
    run.meta.plan = plan;
    return run;
  }

  #keepPlan(runId: string, plan: Plan): void {
    this.#plans.delete(runId);
    this.#plans.set(runId, plan);
    // Oldest first in a Map: drop the least recently kept.
    if (this.#plans.size > PLAN_CACHE) this.#plans.delete(this.#plans.keys().next().value!);
  }

  #step(tx: DatabaseTransactionConnection, run: RunRow, by: string, nowMs: number, call: boolean): Step {
    const { config } = this.d;
    return new Step(run, { runs: new DagRunStore(tx, this.d.tables), items: this.d.itemsOn(tx), limits: config, instanceId: config.instanceId, nowMs, by, call });
  }

  /** The step's writes, the run row and its directory row: one save. */
  async #save(tx: DatabaseTransactionConnection, s: Step, nowMs: number): Promise<void> {
    await s.flush();
    const runs = new DagRunStore(tx, this.d.tables);
    await runs.saveRun(s.run, s.changes(), s.run.createdBy, nowMs, this.channel);
    const directory = new EngineRunStore(tx, this.d.tables);
    if (s.reopened) await directory.reopen(s.run.meta.tenantKey, s.run.id, s.run.createdBy, nowMs);
    await directory.recordOwn(
      {
        tenantKey: s.run.meta.tenantKey,
        runId: s.run.id,
        engineKind: "dag",
        definitionId: s.run.definitionId,
        parentRunId: null,
        triggeredBy: s.run.meta.cause?.trigger ?? null,
        triggerFiringId: s.run.meta.cause?.firingId ?? null,
        endedOn: s.status === "running" ? null : s.run.endNs,
      },
      nowMs,
      s.run.createdBy,
    );
    await s.enqueue();
  }

  /** After commit: claims woken for the new items, holders of cancelled ones told, the audit written. */
  async #after(s: Step, action: "create" | "update", kind: DagStepKind, began: number, events: number): Promise<void> {
    const { queue, audit, metrics } = this.d;
    metrics.dagStep(kind, (performance.now() - began) / 1000, events, s.enqueued.length);
    if (s.ended) metrics.dagRunEnded(s.status);
    await queue.announce(s.enqueued, s.revoked, "its DAG run was cancelled or its node timed out");
    const at = this.d.clock.nowMs();
    audit.record({ table: "run", action, ids: [s.run.id], fields: ["context", "metadata", "states", "starttime", "endtime", "duration"], by: s.run.createdBy, at });
    audit.record({ table: "task", action: "create", ids: s.createdTasks, fields: ["name", "definitionid", "runid", "metadata", "states", "starttime"], by: s.run.createdBy, at });
    audit.record({ table: "task", action: "update", ids: s.endedTasks, fields: ["workerid", "context", "states", "endtime", "duration"], by: s.run.createdBy, at });
  }
}
