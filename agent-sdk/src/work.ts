/**
 * The items on this agent: starting their handlers, the slots they hold, their outcomes. Each item
 * is a Run (run.ts documents its phases). A handler holds its slot until it settles, even after an
 * abort, since its code may still be using the machine; whatever it returns after an abort is
 * dropped, because the item's outcome was settled at the abort (lost, cancelled, or given back).
 * Items claimed ahead (claim-ahead.ts) wait, in the order claimed, for a slot; a drain gives them
 * back at once.
 */
import { Code } from "@connectrpc/connect";
import type { Logger } from "pino";
import type { ClaimAhead } from "./claim-ahead.js";
import type { AbortKind } from "./errors.js";
import type { WorkItem as WireItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { describeHandlers, resolveHandler } from "./handlers.js";
import { errorText } from "./link.js";
import type { ResolvedOptions } from "./options.js";
import type { Reporter, ReportResult } from "./reporter.js";
import type { Report } from "./report.js";
import { failure, ItemContext, Run, settle } from "./run.js";
import { itemTracer } from "./tracing.js";
import type { ItemOutcome, WorkItem } from "./types.js";
import { itemFromWire } from "./wire.js";

export interface WorkHooks {
  itemStarted(item: WorkItem): void;
  itemFinished(item: WorkItem, outcome: ItemOutcome): void;
  /** The item's handler settled (returned, threw, or ended after an abort) after `ms`. */
  handlerSettled(item: WorkItem, ms: number): void;
  /** A handler settled: a slot is free, and the count of running handlers changed. */
  slotFreed(busy: number): void;
  /** A handler started. */
  slotTaken(busy: number): void;
  /** Items claimed hold these leases now; called before any of their handlers starts. */
  leasesTaken(runs: readonly Run[]): void;
  /** This lease is held no more (its run was given back or finished); may come twice for one run. */
  leaseDropped(run: Run): void;
}

export class Work {
  /** Claimed items not yet finished, by id. */
  readonly #runs = new Map<string, Run>();
  /** Claimed ahead, waiting for a slot, oldest first. */
  #waiting: Run[] = [];
  #busy = 0;
  #idleWaiters: (() => void)[] = [];

  constructor(
    private readonly opts: ResolvedOptions,
    private readonly reporter: Reporter,
    private readonly log: Logger,
    private readonly hooks: WorkHooks,
    private readonly ahead: ClaimAhead,
  ) {}

  /** Handlers executing now. */
  get busy(): number {
    return this.#busy;
  }

  /** How many items a claim may ask for now: the free slots, and what may be claimed ahead. */
  get room(): number {
    return Math.max(0, this.opts.slots + this.ahead.allowance - this.#busy - this.#waiting.length);
  }

  /** The runs whose leases the agent must keep. */
  held(): Run[] {
    return [...this.#runs.values()].filter((r) => r.holdsLease);
  }

  /** Starts the claimed items, or gives them back at once when `accepting` is false. */
  accept(items: readonly WireItem[], accepting: boolean): void {
    const taken: Run[] = [];
    for (const w of items) {
      if (!accepting) {
        this.log.info({ item: w.id }, "claimed while shutting down: giving it back");
        void this.reporter.submit({ kind: "release", id: w.id, token: w.leaseToken });
        continue;
      }
      let item: WorkItem;
      try {
        item = itemFromWire(w);
      } catch (err) {
        const error = `the payload is not valid JSON: ${errorText(err)}`;
        this.log.error({ item: w.id, err: error }, "unreadable item: failing it for good");
        void this.reporter.submit({ kind: "fail", id: w.id, token: w.leaseToken, error, retryable: false, retryDelayMs: undefined });
        continue;
      }
      const run = new Run(item, w.leaseToken, itemTracer()?.begin(w, this.opts.name));
      this.#runs.set(item.id, run);
      taken.push(run);
    }
    if (taken.length === 0) return;
    // Before any handler starts: one that blocks the event loop at once must find its lease kept.
    this.hooks.leasesTaken(taken);
    for (const run of taken) {
      if (this.#busy < this.opts.slots) void this.#execute(run);
      else {
        run.phase = "waiting";
        this.#waiting.push(run);
      }
    }
  }

  /**
   * Gives back the items waiting for a slot (a drain began: they would not start before it ends).
   * `atDeadline`: the drain's deadline passed first; the release says so, as the daemon's own
   * release at the deadline would have counted them.
   */
  releaseWaiting(atDeadline = false): void {
    for (const run of this.#waiting.splice(0)) this.#release(run, "the agent is draining: the item was given back before it started", atDeadline);
  }

  /** The daemon says the lease is gone: a running item is aborted and finished without a report. */
  leaseLost(run: Run, message: string): void {
    this.#abort(run, "lease-lost", message);
  }

  /** A cancel directive. One naming an earlier dispatch of the same item is not about this one. */
  cancel(id: string, token: string, reason: string): void {
    const run = this.#runs.get(id);
    if (run && (token === "" || token === run.token)) this.#abort(run, "cancelled", reason);
  }

  /** The drain deadline passed: aborts what still runs and gives it back without spending an attempt. */
  releaseRunning(): void {
    this.releaseWaiting(true);
    for (const run of this.#running()) this.#release(run, "the drain deadline passed: the item was given back to the queue", true);
    this.#checkIdle();
  }

  /**
   * `atDeadline`: a drain deadline made the agent give the item back, which the release says, so the
   * drain's result counts it even when the daemon's clock is behind ours.
   */
  #release(run: Run, message: string, atDeadline = false): void {
    run.phase = "releasing";
    this.hooks.leaseDropped(run);
    run.abort("drain-deadline", message);
    const release: Report = { kind: "release", id: run.item.id, token: run.token, drainDeadline: atDeadline };
    void this.reporter.submit(release).then((r) => this.#finish(run, outcomeOf(release, r)));
  }

  /** The agent failed: every item is aborted and finished unreported. */
  abandonAll(message: string): void {
    this.#waiting = [];
    for (const run of [...this.#runs.values()]) {
      run.abort("agent-failed", message);
      this.#finish(run, { kind: "unreported", reason: message });
    }
  }

  /** Resolves when no handler runs any more (aborted ones aside: their outcome is settled). */
  nothingRunning(): Promise<void> {
    if (this.#running().length === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  async #execute(run: Run): Promise<void> {
    const { item } = run;
    run.phase = "running";
    this.hooks.slotTaken(++this.#busy);
    this.hooks.itemStarted(item);
    const ctx = new ItemContext(run, this.log, this.opts.name);
    const handler = resolveHandler(this.opts.handlers, item.engineKind, item.taskName);
    let report: Report;
    const started = performance.now();
    if (handler) {
      report = await settle(run, handler, ctx);
      this.hooks.handlerSettled(item, performance.now() - started);
    } else {
      const task = item.taskName === undefined ? "" : ` and task '${item.taskName}'`;
      report = failure(
        run,
        `no handler for engine kind '${item.engineKind}'${task} on agent '${this.opts.name}' (it handles: ${describeHandlers(this.opts.handlers)})`,
        false,
      );
      ctx.log.error({ err: report.kind === "fail" ? report.error : "" }, "no handler: failing the item for good");
    }
    this.ahead.handlerTook(performance.now() - started);
    this.#busy--;
    if (run.phase !== "running") {
      ctx.log.debug({ phase: run.phase }, "result of an aborted item dropped");
      this.#slotFreed();
      return;
    }
    run.phase = "reporting";
    // Queued before the slot is announced free, so a drain waiting for idleness finds it queued.
    const reported = this.reporter.submit(report);
    this.#slotFreed();
    let result = await reported;
    if (!result.ok && result.code === Code.InvalidArgument && report.kind === "complete") {
      // The daemon refused the result itself (too large, say): the item cannot succeed like this.
      report = failure(run, `the daemon refused the result: ${result.message}`, false);
      result = await this.reporter.submit(report);
    }
    this.#finish(run, outcomeOf(report, result));
  }

  #abort(run: Run, kind: AbortKind & ("lease-lost" | "cancelled"), reason: string): void {
    if (run.phase === "waiting") this.#waiting.splice(this.#waiting.indexOf(run), 1);
    else if (run.phase !== "running") return;
    run.abort(kind, reason);
    this.#finish(run, { kind, reason });
  }

  #slotFreed(): void {
    // A waiting item takes the slot before it is announced free, so a claim counts it as taken.
    while (this.#busy < this.opts.slots && this.#waiting.length > 0) void this.#execute(this.#waiting.shift()!);
    this.hooks.slotFreed(this.#busy);
    this.#checkIdle();
  }

  #finish(run: Run, outcome: ItemOutcome): void {
    if (run.phase === "finished") return;
    run.phase = "finished";
    this.#runs.delete(run.item.id);
    this.hooks.leaseDropped(run);
    run.spans?.finished(outcome);
    const fields = { item: run.item.id, outcome };
    if (outcome.kind === "completed") this.log.debug(fields, "item completed");
    else if (outcome.kind === "failed" || outcome.kind === "released") this.log.info(fields, `item ${outcome.kind}`);
    else this.log.warn(fields, `item ${outcome.kind}: nothing reported`);
    this.#checkIdle();
    this.hooks.itemFinished(run.item, outcome);
  }

  #running(): Run[] {
    return [...this.#runs.values()].filter((r) => r.phase === "running");
  }

  #checkIdle(): void {
    if (this.#idleWaiters.length === 0 || this.#running().length > 0) return;
    const waiters = this.#idleWaiters;
    this.#idleWaiters = [];
    for (const w of waiters) w();
  }
}

function outcomeOf(report: Report, r: ReportResult): ItemOutcome {
  if (!r.ok) return r.code === Code.FailedPrecondition ? { kind: "lease-lost", reason: r.message } : { kind: "unreported", reason: r.message };
  if (report.kind === "complete") return { kind: "completed" };
  if (report.kind === "fail") return { kind: "failed", retryable: report.retryable, error: report.error };
  return { kind: "released" };
}
