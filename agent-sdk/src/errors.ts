/**
 * Errors a handler throws to say how its item failed, and the reasons an item's signal aborts.
 *
 * Any error a handler throws fails the item retryably: the daemon puts it back with backoff until
 * the item's max_retries are spent, then dead-letters it. Throw `NonRetryableError` for a failure no
 * retry can fix (bad input), and `RetryableError` to choose the delay before the next attempt.
 */

/** Fails the item for good: no retry, it becomes a dead letter at once. */
export class NonRetryableError extends Error {
  override readonly name = "NonRetryableError";
}

/** Fails the item retryably, not before `retryDelayMs` (instead of the daemon's backoff). */
export class RetryableError extends Error {
  override readonly name = "RetryableError";
  readonly retryDelayMs: number | undefined;

  constructor(message: string, options: { retryDelayMs?: number; cause?: unknown } = {}) {
    super(message, { cause: options.cause });
    this.retryDelayMs = options.retryDelayMs;
  }
}

/**
 * Why a handler's `ctx.signal` aborted; it is the signal's `reason`.
 * - `lease-lost`: a renewal found the lease gone (expired and swept, or re-dispatched). Nothing is
 *   reported for the item: it belongs to someone else now.
 * - `cancelled`: the daemon sent a cancel directive (the producer cancelled the item, or the daemon
 *   revoked the lease). Nothing is reported.
 * - `drain-deadline`: the agent is draining and its deadline passed. The item was given back to the
 *   queue without spending an attempt; the handler's result is ignored.
 * - `agent-failed`: the agent stopped on an unrecoverable error. Nothing is reported.
 */
export type AbortKind = "lease-lost" | "cancelled" | "drain-deadline" | "agent-failed";

export class WorkAbortedError extends Error {
  override readonly name = "WorkAbortedError";

  constructor(
    readonly kind: AbortKind,
    message: string,
  ) {
    super(message);
  }
}

/** The agent cannot go on: the daemon refused it in a way no retry fixes (a bad token, a bad name). */
export class AgentFailedError extends Error {
  override readonly name = "AgentFailedError";
}
