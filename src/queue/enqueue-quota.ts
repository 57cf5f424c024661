/**
 * How many work items a caller may queue: in one call (--max-items-per-call) and, per tenant, in a
 * second (--max-enqueue-rate, a token bucket holding one second's worth). One StartRun with a
 * 100,000-way fan-out queued 100,000 items in 6 s (+414 MB), and nothing held a producer's rate.
 *
 * Calls are QueueService.Enqueue and the engines' calls that queue (a DAG run's start, signal and
 * resume; a graph run's start; a machine's start and signal); an engine's advance has no caller.
 *
 * What must stay true:
 * - A call is admitted whole or refused whole, before anything it queues commits: over the call
 *   cap is RESOURCE_EXHAUSTED as every size cap is; more than a second's worth of the rate is
 *   INVALID_ARGUMENT (it could never be admitted); over what the bucket holds now is
 *   RESOURCE_EXHAUSTED saying how long to wait. Each message names the flag.
 * - An advance is never refused (its items follow from work already admitted): it is charged, and
 *   may take the bucket below zero by at most a second's worth, so the tenant's next calls wait.
 * - Buckets live in this daemon's memory: N daemons admit up to N times the rate, and a restart
 *   starts full. A bucket that has refilled is the same as none, so they are dropped past
 *   MAX_BUCKETS tenants.
 */
import type { Clock } from "../clock.js";
import type { Config } from "../config.js";
import { invalidArgument, resourceExhausted } from "../domain/errors.js";

export type QuotaLimits = Pick<Config, "maxItemsPerCall" | "maxEnqueueRate">;

/** Tenants with a bucket before full ones are dropped. */
const MAX_BUCKETS = 10_000;

export class EnqueueQuota {
  readonly #buckets = new Map<string, { tokens: number; atMs: number }>();

  constructor(
    private readonly limits: QuotaLimits,
    private readonly clock: Clock,
  ) {}

  /** A call's refusal when `n` items are more than one call may queue (`what` names them). */
  checkCall(n: number, what: string): void {
    const cap = this.limits.maxItemsPerCall;
    if (n > cap) throw resourceExhausted(`${what}: ${n} work items in one call; the limit is ${cap} (--max-items-per-call)`);
  }

  /** Admits a call that queues `n` items of `tenant` (`what` names them in a refusal), or throws. */
  admit(tenant: string, n: number, what: string): void {
    this.checkCall(n, what);
    const rate = this.limits.maxEnqueueRate;
    if (rate === 0 || n === 0) return;
    if (n > rate)
      throw invalidArgument(
        what,
        `${n} work items in one call are more than tenant '${tenant}' may queue in a second (--max-enqueue-rate ${rate}): queue at most ${rate} per call`,
      );
    const b = this.#bucket(tenant);
    if (b.tokens < n) {
      const waitMs = Math.ceil(((n - b.tokens) * 1000) / rate);
      throw resourceExhausted(
        `tenant '${tenant}' may queue ${rate} work items a second on this daemon (--max-enqueue-rate); ${n} more now would pass it: try again in ${waitMs} ms`,
      );
    }
    b.tokens -= n;
  }

  /** Charges `n` items an engine queued with no caller to refuse. */
  charge(tenant: string, n: number): void {
    const rate = this.limits.maxEnqueueRate;
    if (rate === 0 || n === 0) return;
    const b = this.#bucket(tenant);
    b.tokens = Math.max(-rate, b.tokens - n);
  }

  /** The tenant's bucket, refilled to now. */
  #bucket(tenant: string): { tokens: number; atMs: number } {
    const rate = this.limits.maxEnqueueRate;
    const now = this.clock.nowMs();
    let b = this.#buckets.get(tenant);
    if (!b) {
      if (this.#buckets.size >= MAX_BUCKETS) this.#dropFull(now);
      this.#buckets.set(tenant, (b = { tokens: rate, atMs: now }));
    }
    b.tokens = Math.min(rate, b.tokens + (Math.max(0, now - b.atMs) * rate) / 1000);
    b.atMs = now;
    return b;
  }

  #dropFull(now: number): void {
    const rate = this.limits.maxEnqueueRate;
    for (const [tenant, b] of this.#buckets) if (b.tokens + ((now - b.atMs) * rate) / 1000 >= rate) this.#buckets.delete(tenant);
    // Every tenant in debt at once: forget the oldest rather than grow.
    if (this.#buckets.size >= MAX_BUCKETS) this.#buckets.delete(this.#buckets.keys().next().value!);
  }
}

/** One quota per daemon, kept with the daemon's work queue (which the queue's service and every engine share). */
const quotas = new WeakMap<object, EnqueueQuota>();

export function enqueueQuota(queue: { config: QuotaLimits; clock: Clock }): EnqueueQuota {
  let q = quotas.get(queue);
  if (!q) quotas.set(queue, (q = new EnqueueQuota(queue.config, queue.clock)));
  return q;
}
