/**
 * The state-machine engine (aiflow_machine_run, with the run's aiflow_engine_run row written on the
 * same save). A machine rests in a state until an event moves it along a transition whose guard
 * holds; a transition with an action runs it on an agent first (the machine is suspended meanwhile)
 * and moves when the action's work item completes. Its transactions and its advances are the
 * substrate's (../engine.ts).
 *
 * What must stay true:
 * - Events for one machine apply one at a time, in the order their transactions took the run row's
 *   lock (FOR UPDATE), on any daemon: each reads the state the one before it left.
 * - An event no transition accepts changes nothing (its refusal is the caller's error, or the
 *   trigger's refused firing); nor does an event while the machine is suspended or has ended.
 * - Only the action's own work item moves a suspended machine, once.
 * - `history` keeps the latest --run-history-max states; `historyDropped` counts the rest, so their
 *   sum numbers the transitions (an action's work item is machine:<that number>).
 */
import { fromJson, toJsonString } from "@bufbuild/protobuf";
import { DefinitionSchema } from "@aiflow/wire/gen/aiflow/machine/v1/machine_pb.js";
import { AppError, failedPrecondition, invalidArgument, notFound } from "../../domain/errors.js";
import { render } from "../dag/template.js";
import { EngineDefinitionStore } from "../../store/engine-definitions.js";
import { resultOf, type EngineEvent, type RunTable } from "../../store/engine-events.js";
import { MachineRunStore, type MachineRunRow } from "../../store/machine-runs.js";
import { newId } from "../../util/ids.js";
import { holds, parseCondition } from "../condition.js";
import { itemFor } from "../definition-parts.js";
import type { RunWatch } from "../run-watch.js";
import { keepLatest } from "../run-history.js";
import type { Cause, Engine, EngineDeps, RunHooks, Scope } from "../engine.js";
import { inRunTransaction, type RunTx } from "../run-transaction.js";
import { GUARD_ROOTS, machinePlanOf, type MachinePlan } from "./plan.js";

export interface Signalled {
  run: MachineRunRow;
  to: string;
  actionStarted: boolean;
}

export class MachineEngine implements Engine {
  readonly kind = "statemachine";
  readonly runTable: RunTable = { table: "machine_run", key: "run_id" };
  readonly runs: MachineRunStore;
  readonly #defs: EngineDefinitionStore;

  constructor(
    private readonly d: EngineDeps,
    /** Its runs' watchers (WatchRun). */
    readonly watches: RunWatch,
  ) {
    this.runs = new MachineRunStore(d.pool, d.tables);
    this.#defs = new EngineDefinitionStore(d.pool, d.tables);
  }

  async startStored(scope: Scope, definitionId: string, context: Record<string, unknown>, cause: Cause, hooks: RunHooks): Promise<string> {
    return (await this.startRun(scope, await this.storedPlan(scope.tenantKey, definitionId), context, cause, hooks)).runId;
  }

  async putDefinition(scope: Scope, def: Parameters<typeof machinePlanOf>[0]): Promise<{ definitionId: string; created: boolean }> {
    const plan = machinePlanOf(def, this.d.config, false);
    const nowMs = this.d.clock.nowMs();
    const created = await this.#defs.put(
      "statemachine",
      scope.tenantKey,
      plan.definitionId,
      toJsonString(DefinitionSchema, def),
      newId(nowMs),
      scope.by,
      nowMs,
    );
    return { definitionId: plan.definitionId, created };
  }

  async storedPlan(tenantKey: string, definitionId: string): Promise<MachinePlan> {
    const body = await this.#defs.get("statemachine", tenantKey, definitionId);
    if (body === null) throw notFound(`tenant '${tenantKey}' has no stored machine definition '${definitionId}' (store one with PutDefinition)`);
    return machinePlanOf(fromJson(DefinitionSchema, JSON.parse(body)), this.d.config, false);
  }

  /** Starts a machine in its initial state; `cause` names the trigger firing that started it. */
  startRun(scope: Scope, plan: MachinePlan, context: Record<string, unknown>, cause?: Cause, hooks: RunHooks = {}): Promise<MachineRunRow> {
    return inRunTransaction(this.d, { engine: "statemachine", kind: "start" }, "its machine was cancelled", async (w) => {
      await hooks.guard?.(w.tx);
      const nowMs = w.nowMs;
      const run: MachineRunRow = {
        id: newId(nowMs),
        runId: newId(nowMs),
        tenantKey: scope.tenantKey,
        definitionId: plan.definitionId,
        plan,
        state: plan.initial,
        context,
        history: [plan.initial],
        historyDropped: 0,
        live: true,
        suspended: false,
        failure: null,
        reason: null,
        pending: null,
        workItemId: null,
        createdBy: scope.by,
        createdOn: nowMs,
        createdUs: BigInt(nowMs) * 1000n,
      };
      await new MachineRunStore(w.tx, this.d.tables).insert(run, nowMs);
      await this.#record(w, run, cause);
      await hooks.record?.(w.tx, { id: run.runId });
      return run;
    });
  }

  /** Applies an event to the caller's machine (see the module's comment); refusals change nothing. */
  signal(scope: Scope, runId: string, event: string, payload: unknown, hooks: RunHooks = {}): Promise<Signalled> {
    return inRunTransaction(this.d, { engine: "statemachine", kind: "signal" }, "its machine was cancelled", async (w) => {
      const run = await this.#locked(w, scope, runId);
      await hooks.guard?.(w.tx);
      if (!run.live)
        throw failedPrecondition(`machine '${runId}' has ended in state '${run.state}' (${run.reason ?? run.failure ?? "ended"}): it takes no more events`);
      if (run.suspended && run.pending)
        throw failedPrecondition(
          `machine '${runId}' is running the action of '${run.pending.from}' --${run.pending.event}--> '${run.pending.to}': signal again once it completes`,
        );
      const state = run.plan.states.find((s) => s.name === run.state)!;
      const candidates = state.transitions.filter((t) => t.event === event);
      if (candidates.length === 0) {
        const takes = [...new Set(state.transitions.map((t) => t.event))].join(", ");
        throw invalidArgument("event", `state '${run.state}' has no transition for event '${event}' (it takes: ${takes})`);
      }
      const scopeOf = { event: payload, context: run.context };
      const t = candidates.find((c) => c.guard === "" || holds(parseCondition(c.guard, GUARD_ROOTS), scopeOf));
      if (!t)
        throw invalidArgument(
          "event",
          `no guard of state '${run.state}''s transitions for '${event}' holds: ${candidates.map((c) => `'${c.guard}'`).join(", ")}`,
        );
      run.context[event] = payload;
      if (t.action) {
        const rendered = t.action.payload === null ? null : JSON.stringify(render(t.action.payload, { context: run.context, run_id: run.runId }));
        const item = itemFor(t.action, rendered, this.d.config, `the action of '${run.state}' --${event}--> '${t.to}'`, w.nowMs);
        if (item instanceof AppError) throw item;
        run.suspended = true;
        run.pending = { from: run.state, event, to: t.to };
        run.workItemId = w.enqueue(
          run.tenantKey,
          run.createdBy,
          run.runId,
          `machine:${run.historyDropped + run.history.length}`,
          `${run.state}--${event}-->${t.to}`,
          item,
        );
      } else this.#move(run, t.to, w);
      await this.#save(w, run, scope.by);
      await hooks.record?.(w.tx, { id: run.runId });
      return { run, to: t.to, actionStarted: t.action !== null };
    });
  }

  /** Stops the caller's live machine (and its action's work item). */
  cancel(scope: Scope, runId: string, reason: string): Promise<MachineRunRow> {
    return inRunTransaction(this.d, { engine: "statemachine", kind: "cancel" }, "its machine was cancelled", async (w) => {
      const run = await this.#locked(w, scope, runId);
      if (!run.live) throw failedPrecondition(`machine '${runId}' has already ended in state '${run.state}'`);
      if (run.workItemId) await w.cancel(run.tenantKey, run.workItemId, reason, scope.by);
      Object.assign(run, { live: false, suspended: false, pending: null, workItemId: null, reason });
      w.ended = "cancelled";
      await this.#save(w, run, scope.by);
      return run;
    });
  }

  async get(scope: Scope, runId: string): Promise<MachineRunRow | null> {
    return this.runs.get(runId, scope);
  }

  async #locked(w: RunTx, scope: Scope, runId: string): Promise<MachineRunRow> {
    const run = await new MachineRunStore(w.tx, this.d.tables).get(runId, scope, true);
    if (!run) throw notFound(`tenant '${scope.tenantKey}' has no machine run '${runId}' of yours`);
    return run;
  }

  /** An advance: the run is locked (../advancer.ts), its events taken. */
  async advance(w: RunTx, runId: string, events: readonly EngineEvent[]): Promise<void> {
    const run = (await new MachineRunStore(w.tx, this.d.tables).get(runId, null, true))!;
    for (const e of events) {
      const p = run.pending;
      if (!run.live || !run.suspended || !p || e.work_item_id !== run.workItemId) continue;
      Object.assign(run, { suspended: false, pending: null, workItemId: null });
      if (e.status === "completed") {
        run.context[p.to] = resultOf(e);
        this.#move(run, p.to, w);
      } else {
        run.live = false;
        w.ended = e.status === "failed" ? "failed" : "cancelled";
        run.failure = e.status === "failed" ? (e.error ?? "its work item failed") : "its work item was cancelled";
        run.reason = `the action of '${p.from}' --${p.event}--> '${p.to}' ${e.status === "failed" ? "failed" : "was cancelled"}`;
      }
    }
    await this.#save(w, run, `statemachine:${this.d.config.instanceId}`);
  }

  #move(run: MachineRunRow, to: string, w: RunTx): void {
    run.state = to;
    run.history.push(to);
    run.historyDropped += keepLatest(run.history, this.d.config.runHistoryMax);
    if (run.plan.states.find((s) => s.name === to)!.terminal) {
      run.live = false;
      w.ended = "terminal";
      run.reason = `reached terminal state '${to}'`;
    }
  }

  async #save(w: RunTx, run: MachineRunRow, by: string): Promise<void> {
    await new MachineRunStore(w.tx, this.d.tables).save(run, by, w.nowMs);
    await this.#record(w, run);
  }

  #record(w: RunTx, run: MachineRunRow, cause?: Cause): Promise<void> {
    return w.record("statemachine", { tenantKey: run.tenantKey, runId: run.runId, definitionId: run.definitionId, by: run.createdBy, ended: !run.live, cause });
  }
}
