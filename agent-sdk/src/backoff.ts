/** Capped exponential backoff with jitter, and a sleep that an AbortSignal cuts short. */

export interface BackoffOptions {
  /** Delay after the first failure. @default 200 */
  initialDelayMs?: number;
  /** The cap. @default 10000 */
  maxDelayMs?: number;
}

/**
 * The delay before retry `attempt` (0-based): min(max, initial × 2^attempt), then "equal jitter"
 * (a random point in its upper half), so agents that lost the same daemon do not return in step
 * while none retries sooner than half the bound.
 */
export function backoffDelay(attempt: number, opts: Required<BackoffOptions>, random: () => number = Math.random): number {
  const bound = Math.min(opts.maxDelayMs, opts.initialDelayMs * 2 ** Math.min(attempt, 30));
  return Math.round(bound / 2 + random() * (bound / 2));
}

/** Resolves after `ms`, or at once when `signal` aborts (never rejects). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  if (signal?.aborted || ms <= 0) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
