/**
 * The DAG engine: runs of DAG definitions on the work queue (aiflow_run, aiflow_task,
 * aiflow_checkpoint), on the engines' one substrate (../engine.ts): every change to a run is one run
 * transaction (../run-transaction.ts) under the run row's lock — a call's (start, cancel, signal,
 * resume) or an advance's (../advancer.ts) — driven by a Step (./step.ts). An advance gets all of the
 * run's due events at once (its nodes' work items ended; timeouts came due, which the Step writes as
 * events due at the attempt's deadline) and applies them in the transaction that deletes them: a
 * daemon killed in between loses nothing and doubles nothing.
 *
 * What is the DAG's own: a daemon keeps the plans of runs it touched lately (a run's plan never
 * changes, and reading it is most of reading a big run), and writes an audit record of each step
 * after it commits.
 */
import { fromJson, toJsonString } from "@bufbuild/protobuf";
import { DefinitionSchema, type Definition } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { notFound } from "../../domain/errors.js";
import type { EngineStepKind } from "../../observability/metrics.js";
import { DagRunStore, type RunRow, type TaskRow } from "../../store/dag-runs.js";
import { EngineDefinitionStore } from "../../store/engine-definitions.js";
import { EngineEventStore, type EngineEvent, type RunTable } from "../../store/engine-events.js";
import type { WorkItemRow } from "../../store/work-items.js";
import { newId } from "../../util/ids.js";
import type { Cause, Engine, EngineDeps, RunHooks, Scope } from "../engine.js";
import { inRunTransaction, type RunTx } from "../run-transaction.js";
import type { RunWatch } from "../run-watch.js";
import type { NodeRec, RunMeta } from "./model.js";
import { planOf, type Plan } from "./plan.js";
import { Step } from "./step.js";

/** Runs whose plans a daemon keeps in memory. */
const PLAN_CACHE = 1_000;

/** What holders of the items a step cancels are told. */
const REVOKED = "its DAG run was cancelled or its node timed out";

export type { Scope };

/** A run as GetRun shows it: its row, its attempts and its live work items' state. */
export interface RunView {
  run: RunRow;
  tasks: readonly TaskRow[];
  items: ReadonlyMap<string, WorkItemRow>;
}

export class DagEngine implements Engine {
  readonly kind = "dag";
  readonly runTable: RunTable = { table: "run", key: "id" };
  readonly runs: DagRunStore;
  readonly #defs: EngineDefinitionStore;
  /** Plans of runs this daemon touched lately, by run id: a run's plan never changes, and reading it is most of reading a big run. */
  readonly #plans = new Map<string, Plan>();

  constructor(
    private readonly d: EngineDeps,
    /** Its runs' watchers (WatchRun). */
    readonly watches: RunWatch,
  ) {
    this.runs = new DagRunStore(d.pool, d.tables);
    this.#defs = new EngineDefinitionStore(d.pool, d.tables);
  }

  /** Checks and stores a definition under its id (replacing the tenant's of that id). */
  async putDefinition(scope: Scope, def: Definition): Promise<{ definitionId: string; created: boolean }> {
    const plan = planOf(def, this.d.config, false);
    const nowMs = this.d.clock.nowMs();
    const created = await this.#defs.put("dag", scope.tenantKey, plan.definitionId, toJsonString(DefinitionSchema, def), newId(nowMs), scope.by, nowMs);
    return { definitionId: plan.definitionId, created };
  }

  /** The tenant's stored definition `definitionId`, planned; NOT_FOUND when there is none. */
  async storedPlan(tenantKey: string, definitionId: string): Promise<Plan> {
    const body = await this.#defs.get("dag", tenantKey, definitionId);
    if (body === null) throw notFound(`tenant '${tenantKey}' has no stored definition '${definitionId}' (store one with PutDefinition)`);
    return planOf(fromJson(DefinitionSchema, JSON.parse(body)), this.d.config, false);
  }

  async startStored(scope: Scope, definitionId: string, context: Record<string, unknown>, cause: Cause, hooks: RunHooks): Promise<string> {
    return (await this.startRun(scope, await this.storedPlan(scope.tenantKey, definitionId), context, null, cause, hooks)).run.id;
  }

  async signal(scope: Scope, runId: string, event: string, payload: unknown, hooks: RunHooks): Promise<void> {
    await this.change("signal", scope, runId, (s) => s.signal(event, payload), hooks);
  }

  /** Starts a run (or finds the caller's run of the idempotency key); `cause` names the trigger firing that started it. */
  async startRun(
    scope: Scope,
    plan: Plan,
    context: Record<string, unknown>,
    idempotencyKey: string | null,
    cause?: Cause,
    hooks: RunHooks = {},
  ): Promise<{ run: RunRow; existing: boolean }> {
    const started = await inRunTransaction(this.d, { engine: "dag", kind: "start", counted: (run: RunRow | null) => run !== null }, REVOKED, async (w) => {
      await hooks.guard?.(w.tx);
      const id = newId(w.nowMs);
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
      const states = [{ state: "running" as const, at: w.nowNs.toString(), by: scope.by }];
      const runs = new DagRunStore(w.tx, this.d.tables);
      const inserted = await runs.insertRun({ id, definitionId: plan.definitionId, context, meta, states, startNs: w.nowNs, by: scope.by, nowMs: w.nowMs });
      if (!inserted) return null;
      this.#keepPlan(id, plan);
      const run = (await this.#withPlan(runs, await runs.get(id, null, true)))!;
      const s = this.#step(w, run, scope.by, true);
      await s.start();
      await this.#save(w, s, "create");
      await hooks.record?.(w.tx, s.run);
      return s.run;
    });
    if (started) return { run: started, existing: false };
    const existing = await this.#withPlan(this.runs, await this.runs.byIdempotencyKey(scope.by, scope.tenantKey, idempotencyKey!));
    if (!existing) throw new Error(`run idempotency key '${idempotencyKey}' of ${scope.by} conflicted but its run is not there`);
    return { run: existing, existing: true };
  }

  /** A call's step (`kind`) on one of the caller's runs (NOT_FOUND for anyone else's): cancel, signal, resume. */
  change<T>(kind: EngineStepKind, scope: Scope, runId: string, fn: (s: Step) => Promise<T>, hooks: RunHooks = {}): Promise<{ run: RunRow; value: T }> {
    return inRunTransaction(this.d, { engine: "dag", kind }, REVOKED, async (w) => {
      const runs = new DagRunStore(w.tx, this.d.tables);
      const run = await this.#withPlan(runs, await runs.get(runId, scope, true));
      if (!run) throw notFound(`tenant '${scope.tenantKey}' has no run '${runId}' of yours`);
      await hooks.guard?.(w.tx);
      const s = this.#step(w, run, scope.by, true);
      const value = await fn(s);
      await this.#save(w, s, "update");
      await hooks.record?.(w.tx, s.run);
      return { run: s.run, value };
    });
  }

  /** An advance's step: the run is locked (../advancer.ts), its due events taken. */
  async advance(w: RunTx, runId: string, events: readonly EngineEvent[]): Promise<void> {
    const runs = new DagRunStore(w.tx, this.d.tables);
    const run = (await this.#withPlan(runs, await runs.get(runId, null)))!;
    const s = this.#step(w, run, `dag:${this.d.config.instanceId}`, false);
    await s.apply(events);
    await this.#save(w, s, "update");
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

  #step(w: RunTx, run: RunRow, by: string, call: boolean): Step {
    return new Step(run, {
      runs: new DagRunStore(w.tx, this.d.tables),
      events: new EngineEventStore(w.tx, this.d.tables),
      items: this.d.itemsOn(w.tx),
      limits: this.d.config,
      nowMs: w.nowMs,
      by,
      call,
      out: w,
    });
  }

  /** The step's writes, the run row and its directory row: one save; the audit records after the commit. */
  async #save(w: RunTx, s: Step, action: "create" | "update"): Promise<void> {
    await s.flush();
    await new DagRunStore(w.tx, this.d.tables).saveRun(s.run, s.changes(), s.run.createdBy, w.nowMs);
    const ended = s.status !== "running";
    await w.record("dag", {
      tenantKey: s.run.meta.tenantKey,
      runId: s.run.id,
      definitionId: s.run.definitionId,
      by: s.run.createdBy,
      ended,
      endNs: s.run.endNs,
      reopened: s.reopened,
      cause: s.run.meta.cause,
    });
    if (s.ended) w.ended = s.status;
    const { audit, clock } = this.d;
    const run = s.run.id;
    const by = s.run.createdBy;
    const [created, endedTasks] = [s.createdTasks, s.endedTasks];
    w.afterCommit(() => {
      const at = clock.nowMs();
      audit.record({ table: "run", action, ids: [run], fields: ["context", "metadata", "states", "starttime", "endtime", "duration"], by, at });
      audit.record({ table: "task", action: "create", ids: created, fields: ["name", "definitionid", "runid", "metadata", "states", "starttime"], by, at });
      audit.record({ table: "task", action: "update", ids: endedTasks, fields: ["workerid", "context", "states", "endtime", "duration"], by, at });
    });
  }
}
