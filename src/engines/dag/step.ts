/**
 * One step of a run: everything that changes it in one transaction, under its row's lock — events
 * applied (its nodes' work items ended, timeouts), nodes that became ready queued, a start, a
 * cancel, a signal or a resume — and then written together by `flush`. The engine (./engine.ts)
 * opens the transaction, locks the run, drives a Step and commits; the step's writes and the
 * deletion of the events it applied commit together or not at all, which is what makes an advance
 * exactly-once across daemons and crashes.
 *
 * What must stay true:
 *  - A node is queued only while the run is running and every node it depends on is completed or
 *    skipped; its result goes to context[node] (a fan-out node's, the list of results by index).
 *  - An attempt ends once: an event for an attempt already ended (a timeout that lost to the
 *    completion, a cancelled item of an attempt the timeout ended) changes nothing.
 *  - Iterations that completed stay completed (the checkpoint's cursor): a resume re-runs only the
 *    others, and never one still in flight.
 *  - A fan-out queues at most --max-items-per-call iterations in one step: a caller's step wider than
 *    that is refused whole (the call writes nothing), an advance's fails the node.
 */
import { msToNs } from "../../clock.js";
import { AppError, failedPrecondition, invalidArgument, resourceExhausted } from "../../domain/errors.js";
import { newId } from "../../util/ids.js";
import type { WorkItemStore } from "../../store/work-items.js";
import type { DagRunStore, NewTask, RunChanges, RunRow, TaskEnd } from "../../store/dag-runs.js";
import type { EngineEvent, EngineEventStore } from "../../store/engine-events.js";
import type { RunTx } from "../run-transaction.js";
import { NODE_DONE, TASK_ENDED, taskName, type NodeRec, type RunStatus, type TaskMeta, type TaskState, type TaskStateEntry } from "./model.js";
import { FanOutProgress } from "./fan-out-progress.js";
import { itemOf, type PlanLimits, type PlanNode } from "./plan.js";
import { RunChangeLog } from "./run-changes.js";
import { parsePath, render, resolve } from "./template.js";

export interface StepDeps {
  runs: DagRunStore;
  /** Its attempts' timeouts. */
  events: EngineEventStore;
  items: WorkItemStore;
  limits: PlanLimits & { dagMaxFanOut: number; maxItemsPerCall: number };
  /** A caller's step (start, signal, resume), refused whole when a fan-out is wider than one call may queue; an advance's fails the node instead. */
  call: boolean;
  nowMs: number;
  /** Who writes: the caller for a call's step, the engine for an advance. */
  by: string;
  /** The run transaction's items: those the step queues (inserted last, announced after commit) and cancels (holders told after commit). */
  out: Pick<RunTx, "enqueue" | "revoked">;
}

export class Step {
  readonly createdTasks: string[] = [];
  readonly endedTasks: string[] = [];
  readonly #newTasks: NewTask[] = [];
  #ends: TaskEnd[] = [];
  readonly #timers: { taskId: string; dueNs: bigint }[] = [];
  readonly #cancelIds: string[] = [];
  readonly #progress: FanOutProgress;
  /** Fan-out nodes whose last iteration completed in this step: their results are gathered after the ends are written. */
  readonly #gather = new Set<string>();
  readonly #ended = new Set<string>();
  readonly #nodes: Map<string, PlanNode>;
  readonly #nowNs: bigint;
  #reopened = false;

  readonly #changes: RunChangeLog;

  constructor(
    readonly run: RunRow,
    private readonly d: StepDeps,
  ) {
    this.#nodes = new Map(run.meta.plan.nodes.map((n) => [n.name, n]));
    this.#nowNs = msToNs(d.nowMs);
    this.#progress = new FanOutProgress(d.runs, run.id, (node) => run.meta.nodes[node]!.n ?? 0);
    this.#changes = new RunChangeLog(run);
    this.#startedRunning = run.states.at(-1)!.state === "running";
  }

  readonly #startedRunning: boolean;

  /** What the step changed in the run's row, for the engine to write back (./run-changes.ts). */
  changes(): RunChanges {
    return this.#changes.changes();
  }

  get status(): RunStatus {
    return this.run.states.at(-1)!.state;
  }

  /** The run ended in this step (it was running when the step began and is not now). */
  get ended(): boolean {
    return this.#startedRunning && this.status !== "running";
  }

  /** The directory's ended_on must go back to null (a resume). */
  get reopened(): boolean {
    return this.#reopened;
  }

  // ---- events ---------------------------------------------------------------------------------

  /** Applies a run's events in order: each ends the attempt it names, once. */
  async apply(events: readonly EngineEvent[]): Promise<void> {
    const tasks = new Map((await this.d.runs.tasksByIds([...new Set(events.flatMap((e) => (e.task_id === null ? [] : [e.task_id])))])).map((t) => [t.id, t]));
    for (const e of events) {
      const t = e.task_id === null ? undefined : tasks.get(e.task_id);
      if (!t || this.#ended.has(t.id) || TASK_ENDED.has(t.states.at(-1)!.state)) continue;
      if (e.kind === "timeout") {
        const node = this.#nodes.get(t.meta.node)!;
        if (t.meta.workItemId) this.#cancelIds.push(t.meta.workItemId);
        this.#end(t.id, t.meta, "failed", { error: `timed out after ${node.timeoutMs} ms` });
        continue;
      }
      const outcome: TaskState = e.status === "completed" ? "completed" : e.status === "cancelled" ? "cancelled" : "failed";
      const ranAt = e.dispatched_at ?? null;
      this.#end(t.id, t.meta, outcome, {
        agent: e.agent ?? undefined,
        result: outcome === "completed" ? (e.result ?? "null") : null,
        error: outcome === "completed" ? undefined : (e.error ?? (outcome === "cancelled" ? "its work item was cancelled" : "failed")),
        ranAt: ranAt ?? undefined,
        endNs: e.ended_at ?? undefined,
      });
    }
    await this.#settle();
  }

  /** Ends an attempt and carries what that means to its node. */
  #end(
    taskId: string,
    meta: TaskMeta,
    outcome: TaskState,
    o: { agent?: string; result?: string | null; error?: string; ranAt?: bigint; endNs?: bigint },
  ): void {
    this.#ended.add(taskId);
    this.endedTasks.push(taskId);
    const endNs = o.endNs ?? this.#nowNs;
    const entries: TaskStateEntry[] = [];
    if (o.agent && o.ranAt !== undefined) entries.push({ state: "running", at: o.ranAt.toString(), agent: o.agent });
    entries.push({ state: outcome, at: endNs.toString(), ...(o.agent ? { agent: o.agent } : {}), ...(o.error ? { error: o.error } : {}) });
    this.#ends.push({ id: taskId, worker: o.agent ?? null, result: o.result ?? null, entries, endNs });
    this.#nodeEnded(meta, outcome, o.result ?? null, o.error ?? outcome, o.agent);
  }

  #nodeEnded(meta: TaskMeta, outcome: TaskState, result: string | null, error: string, agent: string | undefined): void {
    const rec = this.run.meta.nodes[meta.node]!;
    const node = this.#nodes.get(meta.node)!;
    rec.fl = Math.max(0, (rec.fl ?? 1) - 1);
    if (agent) this.#changes.setWorker(meta.node, agent);
    if (meta.iteration >= 0) {
      if (outcome === "completed") {
        rec.d = (rec.d ?? 0) + 1;
        this.#progress.markDone(meta.node, meta.iteration);
      } else rec.f = (rec.f ?? 0) + 1;
      if (rec.s !== "running") return;
      if (outcome !== "completed" && node.onFailure === "fail") return this.#nodeFailed(node, rec, `iteration ${meta.iteration}: ${error}`);
      if (rec.fl === 0 || rec.d === rec.n) {
        if (rec.d === rec.n) this.#gather.add(node.name);
        else if (rec.fl === 0) this.#nodeFailed(node, rec, `${rec.f} of ${rec.n} iterations failed`);
      }
      return;
    }
    if (rec.s !== "running" && rec.s !== "waiting") return;
    if (outcome === "completed") {
      rec.s = "completed";
      this.#changes.setContext(node.name, result === null ? null : JSON.parse(result));
    } else this.#nodeFailed(node, rec, error);
  }

  #nodeFailed(node: PlanNode, rec: NodeRec, error: string): void {
    rec.err = error;
    if (node.onFailure === "skip") {
      // A fan-out node settles once no iteration is in flight; until then it stays running.
      if ((rec.fl ?? 0) > 0 && node.fanOut) return;
      rec.s = "skipped";
      return;
    }
    rec.s = "failed";
    if (this.status === "running") this.#setStatus("failed", `node '${node.name}' failed: ${error}`);
  }

  /** Gathers finished fan-outs, queues what became ready, and ends the run when nothing is left. */
  async #settle(): Promise<void> {
    for (;;) {
      if (this.#gather.size > 0) {
        await this.#writeEnds();
        for (const name of [...this.#gather]) {
          this.#gather.delete(name);
          const rec = this.run.meta.nodes[name]!;
          if (rec.s !== "running") continue;
          const results = await this.d.runs.iterationResults(this.run.id, name);
          this.#changes.setContext(
            name,
            Array.from({ length: rec.n ?? 0 }, (_, i) => {
              const r = results.get(i);
              return r === undefined || r === null ? null : JSON.parse(r);
            }),
          );
          rec.s = "completed";
        }
      }
      const progressed = await this.#queueReady();
      if (!progressed && this.#gather.size === 0) break;
    }
    if (this.status === "running" && this.run.meta.plan.nodes.every((n) => NODE_DONE.has(this.run.meta.nodes[n.name]!.s))) this.#setStatus("completed");
  }

  // ---- queueing ---------------------------------------------------------------------------------

  /** Makes every pending node whose dependencies are done ready; true when any was. */
  async #queueReady(): Promise<boolean> {
    if (this.status !== "running") return false;
    let any = false;
    for (const node of this.run.meta.plan.nodes) {
      const rec = this.run.meta.nodes[node.name]!;
      if (rec.s !== "pending" || !node.deps.every((d) => NODE_DONE.has(this.run.meta.nodes[d]!.s))) continue;
      any = true;
      await this.#ready(node, rec);
      if (this.status !== "running") break;
    }
    return any;
  }

  async #ready(node: PlanNode, rec: NodeRec): Promise<void> {
    rec.a += 1;
    rec.err = undefined;
    if (node.kind === "wait") return this.#wait(node, rec);
    if (!node.fanOut) {
      rec.s = "running";
      rec.fl = 0;
      this.#attempt(node, rec, -1, undefined);
      return;
    }
    const list = resolve(parsePath(node.fanOut), this.#scope());
    if (!Array.isArray(list))
      return this.#nodeFailed(
        node,
        rec,
        `fan_out '${node.fanOut}' is ${list === null ? "not in the run context" : `a${typeof list === "object" ? "n object" : ` ${typeof list}`}`}, not a list`,
      );
    if (list.length > this.d.limits.dagMaxFanOut)
      return this.#nodeFailed(node, rec, `fan_out '${node.fanOut}' has ${list.length} elements; the limit is ${this.d.limits.dagMaxFanOut}`);
    const perCall = this.d.limits.maxItemsPerCall;
    if (list.length > perCall) {
      const why = `fan_out '${node.fanOut}' has ${list.length} elements; one call or step queues at most ${perCall} work items (--max-items-per-call)`;
      if (this.d.call) throw resourceExhausted(`node '${node.name}': ${why}`);
      return this.#nodeFailed(node, rec, why);
    }
    rec.s = "running";
    Object.assign(rec, { n: list.length, d: 0, f: 0, fl: 0 });
    await this.#progress.load();
    this.#progress.restart(node.name, list.length);
    if (list.length === 0) {
      rec.s = "completed";
      this.#changes.setContext(node.name, []);
      return;
    }
    for (let i = 0; i < list.length; i++) this.#attempt(node, rec, i, list[i]);
  }

  #wait(node: PlanNode, rec: NodeRec): void {
    const taskId = newId(this.d.nowMs);
    rec.t = taskId;
    rec.s = "waiting";
    rec.fl = 1;
    this.#addTask(taskId, node, -1, rec.a, "waiting", undefined);
    const pending = this.run.meta.pendingEvents;
    if (Object.hasOwn(pending, node.event!)) {
      const payload = pending[node.event!];
      delete pending[node.event!];
      this.#end(taskId, { node: node.name, iteration: -1, attempt: rec.a, kind: "wait" }, "completed", { result: JSON.stringify(payload ?? null) });
    } else if (node.timeoutMs !== null) this.#timers.push({ taskId, dueNs: this.#nowNs + msToNs(node.timeoutMs) });
  }

  /** One attempt of a task node (an iteration when `index` ≥ 0): its row and its work item. */
  #attempt(node: PlanNode, rec: NodeRec, index: number, element: unknown): void {
    const taskId = newId(this.d.nowMs);
    if (index < 0) rec.t = taskId;
    rec.fl = (rec.fl ?? 0) + 1;
    const name = taskName(node.name, index);
    let payloadJson: string | null = null;
    let item;
    try {
      if (node.payload !== null) payloadJson = JSON.stringify(render(node.payload, this.#scope(index < 0 ? undefined : { item: element, index })));
      item = itemOf(node, payloadJson, this.d.limits, `node '${name}'`, this.d.nowMs);
    } catch (err) {
      // The node's payload, rendered from this run's context, is not one the queue takes (too large).
      if (!(err instanceof AppError)) throw err;
      this.#addTask(taskId, node, index, rec.a, "queued", undefined);
      this.#end(taskId, { node: node.name, iteration: index, attempt: rec.a, kind: "task" }, "failed", { error: err.message });
      return;
    }
    const affinityKey = this.run.meta.affinityKey;
    // The item is the run's caller's, whoever queues it (the engine, as the run advances).
    const workItemId = this.d.out.enqueue(
      this.run.meta.tenantKey,
      this.run.createdBy,
      this.run.id,
      taskId,
      name,
      affinityKey ? { ...item, affinityKey, workerParams: { ...(item.workerParams ?? {}), affinityKey } } : item,
    );
    this.#addTask(taskId, node, index, rec.a, "queued", workItemId);
    if (node.timeoutMs !== null) this.#timers.push({ taskId, dueNs: this.#nowNs + msToNs(node.timeoutMs) });
  }

  #addTask(id: string, node: PlanNode, iteration: number, attempt: number, state: TaskState, workItemId: string | undefined): void {
    const meta: TaskMeta = { node: node.name, iteration, attempt, kind: node.kind, ...(workItemId ? { workItemId } : {}) };
    this.#newTasks.push({ id, name: taskName(node.name, iteration), meta, state: { state, at: this.#nowNs.toString() }, startNs: this.#nowNs });
    this.createdTasks.push(id);
  }

  #scope(it?: { item: unknown; index: number }) {
    return { context: this.run.context, run_id: this.run.id, ...(it ? { item: it.item, index: it.index } : {}) };
  }

  // ---- calls -------------------------------------------------------------------------------------

  /** A new run's first step: its roots are queued. */
  async start(): Promise<void> {
    await this.#settle();
  }

  async cancel(reason: string): Promise<void> {
    if (this.status !== "running") throw failedPrecondition(`run '${this.run.id}' is ${this.status}; only a running run can be cancelled`);
    this.#setStatus("cancelled", reason);
    for (const rec of Object.values(this.run.meta.nodes)) if (rec.s === "pending" || rec.s === "running" || rec.s === "waiting") rec.s = "cancelled";
    for (const t of await this.d.runs.tasksOfRun(this.run.id)) {
      if (TASK_ENDED.has(t.states.at(-1)!.state)) continue;
      this.#ended.add(t.id);
      this.endedTasks.push(t.id);
      this.#ends.push({
        id: t.id,
        worker: null,
        result: null,
        entries: [{ state: "cancelled", at: this.#nowNs.toString(), error: reason }],
        endNs: this.#nowNs,
      });
    }
    this.d.out.revoked.push(
      ...(await this.d.items.cancel(this.run.meta.tenantKey, { ids: [], runId: this.run.id, parentIds: [] }, reason, this.d.nowMs, this.d.by)),
    );
  }

  /** Delivers an event to the wait node that names it; false when it was kept for a node not reached yet. */
  async signal(event: string, payload: unknown): Promise<boolean> {
    const node = this.run.meta.plan.nodes.find((n) => n.kind === "wait" && n.event === event);
    if (!node) throw invalidArgument("event", `no wait node of run '${this.run.id}' waits for '${event}'`);
    if (this.status !== "running") throw failedPrecondition(`run '${this.run.id}' is ${this.status}; events go to running runs`);
    const rec = this.run.meta.nodes[node.name]!;
    if (rec.s === "pending") {
      this.run.meta.pendingEvents[event] = payload;
      return false;
    }
    if (rec.s !== "waiting" || !rec.t) throw failedPrecondition(`wait node '${node.name}' is ${rec.s}; it takes its event once`);
    this.#end(rec.t, { node: node.name, iteration: -1, attempt: rec.a, kind: "wait" }, "completed", { result: JSON.stringify(payload ?? null) });
    await this.#settle();
    return true;
  }

  /** A failed run runs its failed nodes (a fan-out node, its iterations not completed nor in flight) again. */
  async resume(): Promise<void> {
    if (this.status !== "failed") throw failedPrecondition(`run '${this.run.id}' is ${this.status}; only a failed run resumes`);
    this.#setStatus("running");
    this.run.meta.reason = undefined;
    this.run.endNs = null;
    this.run.durationNs = null;
    this.#reopened = true;
    await this.#progress.load();
    for (const node of this.run.meta.plan.nodes) {
      const rec = this.run.meta.nodes[node.name]!;
      if (rec.s !== "failed") continue;
      if (!node.fanOut || rec.n === undefined) {
        rec.s = "pending";
        continue;
      }
      const done = this.#progress.doneOf(node.name);
      const live = await this.d.runs.liveIterations(this.run.id, node.name);
      const list = resolve(parsePath(node.fanOut), this.#scope());
      rec.a += 1;
      rec.f = 0;
      rec.err = undefined;
      rec.s = "running";
      for (let i = 0; i < rec.n; i++) if (!done.has(i) && !live.has(i)) this.#attempt(node, rec, i, Array.isArray(list) ? list[i] : null);
      if (done.size === rec.n) this.#gather.add(node.name);
    }
    await this.#settle();
  }

  #setStatus(state: RunStatus, reason?: string): void {
    this.run.states.push({ state, at: this.#nowNs.toString(), by: this.d.by, ...(reason ? { reason } : {}) });
    if (reason) this.run.meta.reason = reason;
    if (state !== "running") {
      this.run.endNs = this.#nowNs;
      this.run.durationNs = this.run.startNs === null ? null : this.#nowNs - this.run.startNs;
    }
  }

  // ---- writing ----------------------------------------------------------------------------------

  async #writeEnds(): Promise<void> {
    // Created by the run's caller, whoever advances the run (the engine, on an agent's completion).
    await this.d.runs.insertTasks(this.run.id, this.run.definitionId, this.#newTasks.splice(0), this.run.createdBy, this.d.by, this.d.nowMs);
    await this.d.runs.endTasks(this.#ends, this.d.by, this.d.nowMs);
    this.#ends = [];
  }

  /** Writes the step but its items (the run row itself is the engine's to save, with the directory; the run transaction inserts the items last). */
  async flush(): Promise<void> {
    await this.#progress.load();
    await this.#writeEnds();
    await this.d.runs.saveCheckpoints(
      this.run.id,
      this.run.definitionId,
      this.#progress.writes(),
      this.#nowNs,
      this.run.createdBy,
      this.d.by,
      this.d.nowMs,
      () => newId(this.d.nowMs),
    );
    // Timeouts of attempts that ended need not come due (each would cost an advance that changes nothing).
    await this.d.events.dropTimers("dag", this.run.id, this.endedTasks);
    await this.d.events.addTimers("dag", this.run.id, this.#timers);
    if (this.#cancelIds.length > 0)
      this.d.out.revoked.push(
        ...(await this.d.items.cancel(
          this.run.meta.tenantKey,
          { ids: this.#cancelIds, runId: null, parentIds: [] },
          "the node timed out",
          this.d.nowMs,
          this.d.by,
        )),
      );
  }
}
