/**
 * Rate limits: dispatches of one tenant's items that share a rate limit key
 * (worker_params.rate_limit_key) are spaced fleet-wide, whichever daemons and agents dispatch them.
 *
 * A limit is `count` dispatches per `interval`, `burst` at once (OpsService.SetRateLimit, on a key or
 * a key prefix; the key's own limit stands over its longest prefix's, and a key with neither is not
 * limited). It is kept by the generic cell rate algorithm: dispatches are due one emission interval
 * (interval / count) apart, and up to burst − 1 may go early, so
 *   - the sustained rate is `count` per `interval`;
 *   - in any window of one `interval`, at most count + burst − 1 items of the key are dispatched:
 *     exactly `count` with the default burst of 1.
 * Items over the limit stay pending and are taken at the key's next slot; a claim passes over them,
 * so they never hold back other work behind them. ../store/work-items/rate-limits.ts says how a
 * claim keeps the limit across daemons.
 */
export const MAX_RATE_COUNT = 1_000_000;
export const MAX_RATE_BURST = 100_000;
/** Bounds of a limit's interval. */
export const MIN_RATE_INTERVAL_MS = 1;
export const MAX_RATE_INTERVAL_MS = 7 * 24 * 3600 * 1000;

export interface RateLimit {
  count: number;
  intervalMs: number;
  burst: number;
}

/** Most dispatches of a key any window of one interval can hold under `limit` (the bound above). */
export const windowBound = (limit: RateLimit): number => limit.count + limit.burst - 1;
