/**
 * The graph engine: runs of graph definitions on the work queue (aiflow_graph_run, with the run's
 * aiflow_engine_run row written on the same save). A graph may cycle, so a run is a position and a
 * bound: each step runs the current node as a work item; when it ends, the node's result goes to the
 * run's state under its name and the first of the node's edges whose condition holds picks the next
 * node. Its transactions and its advances are the substrate's (../engine.ts).
 *
 * What must stay true:
 * - One work item at a time: a run waits on one item (work_item_id), and only that item's end moves
 *   it (an event for any other item, or for a run no longer running, changes nothing).
 * - `steps` counts nodes run (an end node runs nothing) and never passes max_steps; a node never runs
 *   more often than its max_visits; `path` lists the nodes in the order they ran, then the end node:
 *   the latest --run-history-max of them, `pathDropped` counting those dropped from its front.
 */
import { fromJson, toJsonString } from "@bufbuild/protobuf";
import { DefinitionSchema } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { AppError, failedPrecondition, notFound } from "../../domain/errors.js";
import { render } from "../dag/template.js";
import { EngineDefinitionStore } from "../../store/engine-definitions.js";
import { resultOf, type EngineEvent, type RunTable } from "../../store/engine-events.js";
import { GraphRunStore, type GraphRunRow } from "../../store/graph-runs.js";
import { newId } from "../../util/ids.js";
import { holds, parseCondition } from "../condition.js";
import { itemFor } from "../definition-parts.js";
import type { RunWatch } from "../run-watch.js";
import { keepLatest } from "../run-history.js";
import type { Cause, Engine, EngineDeps, RunHooks, Scope } from "../engine.js";
import { inRunTransaction, type RunTx } from "../run-transaction.js";
import { EDGE_ROOTS, graphPlanOf, type GraphPlan } from "./plan.js";

export class GraphEngine implements Engine {
  readonly kind = "graph";
  readonly runTable: RunTable = { table: "graph_run", key: "run_id" };
  readonly runs: GraphRunStore;
  readonly #defs: EngineDefinitionStore;

  constructor(
    private readonly d: EngineDeps,
    /** Its runs' watchers (WatchRun). */
    readonly watches: RunWatch,
  ) {
    this.runs = new GraphRunStore(d.pool, d.tables);
    this.#defs = new EngineDefinitionStore(d.pool, d.tables);
  }

  async startStored(scope: Scope, definitionId: string, context: Record<string, unknown>, cause: Cause, hooks: RunHooks): Promise<string> {
    return (await this.startRun(scope, await this.storedPlan(scope.tenantKey, definitionId), context, cause, hooks)).runId;
  }

  /** A graph run takes no events: it moves on its steps' work items alone. */
  async signal(_scope: Scope, runId: string): Promise<never> {
    throw failedPrecondition(`run '${runId}' is a graph run, and graph runs take no events: signal a DAG run's wait node or a state machine`);
  }

  async putDefinition(scope: Scope, def: Parameters<typeof graphPlanOf>[0]): Promise<{ definitionId: string; created: boolean }> {
    const plan = graphPlanOf(def, this.d.config, false);
    const nowMs = this.d.clock.nowMs();
    const created = await this.#defs.put("graph", scope.tenantKey, plan.definitionId, toJsonString(DefinitionSchema, def), newId(nowMs), scope.by, nowMs);
    return { definitionId: plan.definitionId, created };
  }

  /** The tenant's stored definition, planned; NOT_FOUND when there is none. */
  async storedPlan(tenantKey: string, definitionId: string): Promise<GraphPlan> {
    const body = await this.#defs.get("graph", tenantKey, definitionId);
    if (body === null) throw notFound(`tenant '${tenantKey}' has no stored graph definition '${definitionId}' (store one with PutDefinition)`);
    return graphPlanOf(fromJson(DefinitionSchema, JSON.parse(body)), this.d.config, false);
  }

  /** Starts a run at the plan's start node; `cause` names the trigger firing that started it. */
  startRun(scope: Scope, plan: GraphPlan, state: Record<string, unknown>, cause?: Cause, hooks: RunHooks = {}): Promise<GraphRunRow> {
    return inRunTransaction(this.d, { engine: "graph", kind: "start" }, "its graph run was cancelled", async (w) => {
      await hooks.guard?.(w.tx);
      const nowMs = w.nowMs;
      const run: GraphRunRow = {
        id: newId(nowMs),
        runId: newId(nowMs),
        tenantKey: scope.tenantKey,
        definitionId: plan.definitionId,
        plan,
        task: plan.start,
        steps: 0,
        path: [],
        pathDropped: 0,
        runCounts: {},
        state,
        status: "running",
        reason: null,
        error: null,
        workItemId: null,
        createdBy: scope.by,
        createdOn: nowMs,
        createdUs: BigInt(nowMs) * 1000n,
      };
      this.#run(run, plan.start, w);
      if (run.status !== "running") w.ended = run.status;
      await new GraphRunStore(w.tx, this.d.tables).insert(run, nowMs);
      await this.#record(w, run, cause);
      await hooks.record?.(w.tx, { id: run.runId });
      return run;
    });
  }

  /** Cancels a running run of the caller's, and its work item. */
  cancel(scope: Scope, runId: string, reason: string): Promise<GraphRunRow> {
    return inRunTransaction(this.d, { engine: "graph", kind: "cancel" }, "its graph run was cancelled", async (w) => {
      const runs = new GraphRunStore(w.tx, this.d.tables);
      const run = await runs.get(runId, scope, true);
      if (!run) throw notFound(`tenant '${scope.tenantKey}' has no graph run '${runId}' of yours`);
      if (run.status !== "running") throw failedPrecondition(`graph run '${runId}' has already ended (${run.status})`);
      run.status = "cancelled";
      run.reason = reason;
      if (run.workItemId) await w.cancel(run.tenantKey, run.workItemId, reason, scope.by);
      await this.#save(w, run, scope.by, "running");
      return run;
    });
  }

  /** The caller's run in the scope's tenant, or null. */
  async get(scope: Scope, runId: string): Promise<GraphRunRow | null> {
    return this.runs.get(runId, scope);
  }

  /** An advance: the run is locked (../advancer.ts), its events taken. */
  async advance(w: RunTx, runId: string, events: readonly EngineEvent[]): Promise<void> {
    const run = (await new GraphRunStore(w.tx, this.d.tables).get(runId, null, true))!;
    const before = run.status;
    for (const e of events) {
      if (run.status !== "running" || e.work_item_id !== run.workItemId) continue;
      run.workItemId = null;
      if (e.status === "completed") this.#next(run, resultOf(e), w);
      else if (e.status === "failed") this.#end(run, "failed", null, `node '${run.task}' failed: ${e.error ?? "its work item failed"}`);
      else this.#end(run, "cancelled", `node '${run.task}''s work item was cancelled`, null);
    }
    await this.#save(w, run, `graph:${this.d.config.instanceId}`, before);
  }

  /** The current node completed with `result`: the first edge whose condition holds picks the next node. */
  #next(run: GraphRunRow, result: unknown, w: RunTx): void {
    const from = run.task;
    run.state[from] = result;
    const scope = { result, state: run.state, steps: run.steps, visits: run.runCounts };
    const edge = run.plan.edges.find((e) => e.from === from && (e.when === "" || holds(parseCondition(e.when, EDGE_ROOTS), scope)));
    if (!edge) return this.#end(run, "failed", null, `no edge from node '${from}' holds for its result`);
    const to = run.plan.nodes.find((n) => n.name === edge.to)!;
    if (to.kind === "end") {
      this.#walked(run, to.name);
      run.task = to.name;
      return this.#end(run, "completed", `reached end node '${to.name}'`, null);
    }
    if (run.steps >= run.plan.maxSteps)
      return this.#end(run, "stopped", `max_steps reached: ${run.steps} steps taken, the most the definition allows (next was '${to.name}')`, null);
    const visits = run.runCounts[to.name] ?? 0;
    if (to.maxVisits > 0 && visits >= to.maxVisits)
      return this.#end(run, "stopped", `max_visits reached: node '${to.name}' ran ${visits} times, the most it may`, null);
    this.#run(run, to.name, w);
  }

  /** Runs `name` as the run's next step: its work item, the step counted. */
  #run(run: GraphRunRow, name: string, w: RunTx): void {
    const node = run.plan.nodes.find((n) => n.name === name)!;
    const work = node.work!;
    const payload = work.payload === null ? null : JSON.stringify(render(work.payload, { context: run.state, run_id: run.runId }));
    const item = itemFor(work, payload, this.d.config, `node '${name}'`, w.nowMs);
    run.task = name;
    if (item instanceof AppError) return this.#end(run, "failed", null, `node '${name}' could not be queued: ${item.message}`);
    run.steps++;
    this.#walked(run, name);
    run.runCounts[name] = (run.runCounts[name] ?? 0) + 1;
    run.workItemId = w.enqueue(run.tenantKey, run.createdBy, run.runId, `graph:${run.steps}`, name, item);
  }

  /** Appends a node to the path, which keeps the latest --run-history-max. */
  #walked(run: GraphRunRow, name: string): void {
    run.path.push(name);
    run.pathDropped += keepLatest(run.path, this.d.config.runHistoryMax);
  }

  #end(run: GraphRunRow, status: GraphRunRow["status"], reason: string | null, error: string | null): void {
    run.status = status;
    run.reason = reason;
    run.error = error;
    run.workItemId = null;
  }

  /** RunTx the run and its directory row; `before` is its status when the transaction began. */
  async #save(w: RunTx, run: GraphRunRow, by: string, before: GraphRunRow["status"]): Promise<void> {
    if (before === "running" && run.status !== "running") w.ended = run.status;
    await new GraphRunStore(w.tx, this.d.tables).save(run, by, w.nowMs);
    await this.#record(w, run);
  }

  #record(w: RunTx, run: GraphRunRow, cause?: Cause): Promise<void> {
    return w.record("graph", {
      tenantKey: run.tenantKey,
      runId: run.runId,
      definitionId: run.definitionId,
      by: run.createdBy,
      ended: run.status !== "running",
      cause,
    });
  }
}
