/**
 * Capped exponential backoff with jitter, the daemon's own word on when to retry, and a sleep that
 * an AbortSignal cuts short.
 */
import { ConnectError } from "@connectrpc/connect";

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

/** The most a daemon's pushback is followed for: beyond it, the backoff's growth takes over again. */
const PUSHBACK_CAP_MS = 2_000;

/**
 * The retry pushback a daemon answered with (gRPC's `grpc-retry-pushback-ms` trailer), in ms: the
 * daemon is up and says when to try again (its database is away, say). Undefined when there was
 * none — the call did not reach a daemon, or the daemon gave no advice.
 */
export function pushbackMs(err: unknown): number | undefined {
  const raw = ConnectError.from(err).metadata.get("grpc-retry-pushback-ms");
  if (raw === null || !/^\d{1,9}$/.test(raw)) return undefined;
  return Number(raw);
}

/**
 * How long to wait before retry `attempt` (0-based) after `err`: the daemon's pushback when it gave
 * one (a short, flat schedule with a little jitter, capped, so an agent is back within moments of
 * the daemon's database), else the capped exponential backoff.
 */
export function retryDelay(err: unknown, attempt: number, opts: Required<BackoffOptions>, random: () => number = Math.random): number {
  const pushback = pushbackMs(err);
  if (pushback === undefined) return backoffDelay(attempt, opts, random);
  const base = Math.min(pushback, PUSHBACK_CAP_MS, opts.maxDelayMs);
  return Math.round(base + random() * (base / 4));
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
