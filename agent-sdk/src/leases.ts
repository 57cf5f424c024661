/**
 * Lease renewal: every third of the lease TTL, one ExtendLease call for every lease the agent holds
 * (items running or whose report is on its way), so a lease is renewed at least twice before it
 * could expire. The TTL is the daemon's (from registration); the ticks are local time, so the
 * daemon's clock is never compared with ours.
 *
 * A renewal the daemon refuses means the lease is gone (it expired and was swept, or the item was
 * cancelled or re-dispatched): the keeper says so and the agent aborts that item. A renewal that
 * fails in transit is retried on the next tick after the link recovers; the leases keep running on
 * the daemon meanwhile.
 */
import type { Logger } from "pino";
import { errorText, type Link } from "./link.js";
import type { ResolvedOptions } from "./options.js";
import type { Run } from "./run.js";

/** The daemon's batch limit. */
const MAX_BATCH = 10_000;

export class LeaseKeeper {
  #timer: NodeJS.Timeout | undefined;
  #ticking = false;

  constructor(
    private readonly link: Link,
    private readonly opts: ResolvedOptions,
    /** The runs whose leases to keep. */
    private readonly held: () => Run[],
    /** The daemon said this lease is no longer held. */
    private readonly onLost: (run: Run, message: string) => void,
    private readonly log: Logger,
  ) {}

  /** Starts the ticks for a lease TTL. */
  start(leaseTtlMs: number): void {
    clearInterval(this.#timer);
    this.#timer = setInterval(() => void this.renew(), Math.max(Math.floor(leaseTtlMs / 3), 10));
  }

  /** Re-times running ticks (a new registration may bring a new TTL); no-op when stopped. */
  retime(leaseTtlMs: number): void {
    if (this.#timer) this.start(leaseTtlMs);
  }

  stop(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }

  /** One renewal round (ticks call it; a round still running makes the next tick a no-op). */
  async renew(): Promise<void> {
    if (this.#ticking) return;
    this.#ticking = true;
    try {
      const runs = this.held();
      for (let i = 0; i < runs.length; i += MAX_BATCH) {
        const chunk = runs.slice(i, i + MAX_BATCH);
        const generation = this.link.generation;
        let outcomes;
        try {
          const leases = chunk.map((r) => ({ workItemId: r.item.id, leaseToken: r.token }));
          outcomes = (await this.link.client.extendLease({ name: this.opts.name, leases }, { timeoutMs: this.opts.rpcTimeoutMs })).outcomes;
        } catch (err) {
          this.log.debug({ err: errorText(err), leases: chunk.length }, "lease renewal not delivered: retrying next tick");
          this.link.recover(generation, err).catch(() => undefined);
          return;
        }
        const byId = new Map(chunk.map((r) => [r.item.id, r]));
        for (const o of outcomes) {
          const run = byId.get(o.workItemId);
          if (!o.ok && run) this.onLost(run, o.message);
        }
      }
    } finally {
      this.#ticking = false;
    }
  }
}
