/**
 * One claimed item on this agent, from claim to its final outcome, and what its handler's
 * settlement turns into.
 *
 * Phases: `waiting` (claimed ahead, for a slot to come free) → `running` (the handler runs and
 * holds a slot) → `reporting` (the result is on its way) → `finished`. A drain deadline moves a
 * running item to `releasing` (given back while its handler may still run), and a drain's start
 * moves a waiting one there. A lost lease or a cancel directive finishes it at once without a
 * report; its handler keeps its slot until it settles, but whatever it returns is dropped.
 */
import type { Logger } from "pino";
import { NonRetryableError, RetryableError, WorkAbortedError, type AbortKind } from "./errors.js";
import type { Report } from "./report.js";
import type { ItemSpans } from "./tracing.js";
import type { AnyHandler, HandlerContext, WorkItem } from "./types.js";

export type RunPhase = "waiting" | "running" | "reporting" | "releasing" | "finished";

export class Run {
  phase: RunPhase = "running";
  /**
   * Made when the handler first reads its signal (or the run is aborted first): most handlers of
   * short items never read it, and an AbortController per item was a visible share of an agent's
   * time in a drain.
   */
  #controller: AbortController | undefined;
  #abortedBeforeRead: WorkAbortedError | undefined;

  constructor(
    readonly item: WorkItem,
    /** The fencing token of this dispatch. */
    readonly token: string,
    /** This attempt's spans (./tracing.ts); undefined when the agent does not trace. */
    readonly spans?: ItemSpans,
  ) {}

  get signal(): AbortSignal {
    if (!this.#controller) {
      this.#controller = new AbortController();
      if (this.#abortedBeforeRead) this.#controller.abort(this.#abortedBeforeRead);
    }
    return this.#controller.signal;
  }

  get aborted(): boolean {
    return this.#controller ? this.#controller.signal.aborted : this.#abortedBeforeRead !== undefined;
  }

  /** Whether renewals should keep its lease. */
  get holdsLease(): boolean {
    return this.phase === "waiting" || this.phase === "running" || this.phase === "reporting";
  }

  abort(kind: AbortKind, message: string): void {
    if (this.aborted) return;
    const reason = new WorkAbortedError(kind, message);
    if (this.#controller) this.#controller.abort(reason);
    else this.#abortedBeforeRead = reason;
  }
}

/**
 * What a handler gets. Its signal and its logger (the agent's, with the item bound) are made when
 * first read: most short items need neither. A class, not an object literal with getters: V8 builds
 * such a literal through a runtime call per accessor, ~1.2 µs an item against ~20 ns for this.
 */
export class ItemContext implements HandlerContext {
  // Private: handlers get this object, and the run (which can abort it) is not theirs to hold.
  readonly #run: Run;
  readonly #agentLog: Logger;
  #log: Logger | undefined;

  constructor(
    run: Run,
    agentLog: Logger,
    readonly agent: string,
  ) {
    this.#run = run;
    this.#agentLog = agentLog;
  }

  get signal(): AbortSignal {
    return this.#run.signal;
  }

  get log(): Logger {
    const { item } = this.#run;
    return (this.#log ??= this.#agentLog.child({
      item: item.id,
      tenant: item.tenant,
      engineKind: item.engineKind,
      task: item.taskName,
      attempt: item.attempt,
    }));
  }
}

/** The daemon keeps at most 8192 characters of an error. */
const ERROR_MAX = 8000;

export function errorMessage(err: unknown): string {
  const text = err instanceof Error ? `${err.name}: ${err.message}` : `thrown value: ${String(err)}`;
  return text.length > ERROR_MAX ? `${text.slice(0, ERROR_MAX)}… (truncated)` : text;
}

export const failure = (run: Run, error: string, retryable: boolean, retryDelayMs?: number): Report => ({
  kind: "fail",
  id: run.item.id,
  token: run.token,
  error,
  retryable,
  retryDelayMs,
});

/** Runs the handler (in its span when the agent traces) and turns how it settled into a report; never throws. */
export async function settle(run: Run, handler: AnyHandler, ctx: HandlerContext): Promise<Report> {
  if (!run.spans) return settleHandler(run, handler, ctx);
  const spans = run.spans;
  const report = await spans.handler(() => settleHandler(run, handler, ctx));
  spans.handled(report, run.aborted);
  return report;
}

async function settleHandler(run: Run, handler: AnyHandler, ctx: HandlerContext): Promise<Report> {
  let result: unknown;
  try {
    result = await handler(run.item, ctx);
  } catch (err) {
    if (!run.aborted) ctx.log.warn({ err }, "handler failed");
    if (err instanceof NonRetryableError) return failure(run, errorMessage(err), false);
    if (err instanceof RetryableError) return failure(run, errorMessage(err), true, err.retryDelayMs);
    return failure(run, errorMessage(err), true);
  }
  if (result === undefined) return { kind: "complete", id: run.item.id, token: run.token, resultJson: "" };
  try {
    // undefined for a function or a symbol: no result, as for undefined itself.
    const json = JSON.stringify(result) as string | undefined;
    return { kind: "complete", id: run.item.id, token: run.token, resultJson: json ?? "" };
  } catch (err) {
    return failure(run, `the handler's result is not JSON-serialisable: ${errorMessage(err)}`, false);
  }
}
