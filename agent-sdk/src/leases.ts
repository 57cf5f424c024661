/**
 * Lease renewal: every third of the lease TTL, one ExtendLease call for every lease the agent holds
 * (items waiting, running, or whose report is on its way), so a lease is renewed at least twice
 * before it could expire. The TTL is the daemon's (from registration); the ticks are local time, so
 * the daemon's clock is never compared with ours.
 *
 * One renewer at a time. The heartbeat thread renews (liveness/renewals.js) whenever it is ready,
 * so a handler that blocks the event loop keeps its lease: only losing the process or the network
 * loses it. The keeper hands the thread each lease as it is taken, before its handler starts, and
 * each one it no longer holds. While no thread is ready (one died and another is starting) the main
 * thread renews from here, at once and then on its own ticks, and hands renewal back once the new
 * thread, given every lease held, says it is ready; a handover leaves at most two ticks between
 * renewals. Should the thread die while a handler blocks the loop, nothing renews until the loop is
 * free again: the main thread learns of the death only then.
 *
 * A renewal the daemon refuses means the lease is gone (it expired and was swept, or the item was
 * cancelled or re-dispatched): the keeper says so and the agent aborts that item, whichever thread
 * renewed. A renewal that fails in transit is retried on the next tick; the leases keep running on
 * the daemon meanwhile.
 */
import type { Logger } from "pino";
import { errorText, type Link } from "./link.js";
import type { Lease, LostLease } from "./liveness/protocol.js";
import type { ResolvedOptions } from "./options.js";
import type { Run } from "./run.js";

/** The daemon's batch limit. */
const MAX_BATCH = 10_000;

/** What the keeper needs of the heartbeat thread (liveness/heartbeat.ts). */
export interface LeaseThread {
  hold(leases: Lease[]): void;
  drop(lease: Lease): void;
  /** Renew what it holds every third of `ttlMs`, first at the daemon at `addressIndex`; 0 stops. */
  renew(ttlMs: number, addressIndex: number): void;
}

const leaseOf = (run: Run): Lease => ({ id: run.item.id, token: run.token });

export class LeaseKeeper {
  #timer: NodeJS.Timeout | undefined;
  #ticking = false;
  /** The daemon's TTL while the agent keeps leases: from start() to stop(). */
  #ttlMs: number | undefined;
  /** A heartbeat thread is ready: it renews, and this thread does not. */
  #threadReady = false;

  constructor(
    private readonly link: Link,
    private readonly opts: ResolvedOptions,
    private readonly thread: LeaseThread,
    /** The runs whose leases to keep. */
    private readonly held: () => Run[],
    /** The daemon said this lease is no longer held. */
    private readonly onLost: (run: Run, message: string) => void,
    private readonly log: Logger,
  ) {}

  /** Keeps leases renewed for a lease TTL. */
  start(leaseTtlMs: number): void {
    this.#ttlMs = leaseTtlMs;
    this.#assign();
  }

  /** Re-times renewals (a new registration may bring a new TTL); no-op when stopped. */
  retime(leaseTtlMs: number): void {
    if (this.#ttlMs !== undefined) this.start(leaseTtlMs);
  }

  stop(): void {
    this.#ttlMs = undefined;
    this.#assign();
  }

  /** Leases claimed: the thread gets them before any of their handlers starts. */
  taken(runs: readonly Run[]): void {
    this.thread.hold(runs.map(leaseOf));
  }

  /** A lease no longer held (its item finished or was given back). */
  dropped(run: Run): void {
    this.thread.drop(leaseOf(run));
  }

  /** Every lease held now, for a heartbeat thread started again. */
  leases(): Lease[] {
    return this.held().map(leaseOf);
  }

  /** The thread found these leases lost; one naming an earlier dispatch of an item is not about the current one. */
  lost(leases: readonly LostLease[]): void {
    const runs = new Map(this.held().map((r) => [r.item.id, r]));
    for (const l of leases) {
      const run = runs.get(l.id);
      if (run && run.token === l.token) this.onLost(run, l.message);
    }
  }

  /** A heartbeat thread is ready: renewal is its own from now on. */
  threadReady(): void {
    if (this.#threadReady) return;
    this.#threadReady = true;
    this.#assign();
    if (this.#ttlMs !== undefined) this.log.info("the heartbeat thread is back: it renews the leases again");
  }

  /** The heartbeat thread died: renewal is this thread's until another is ready. */
  threadDown(): void {
    if (!this.#threadReady) return;
    this.#threadReady = false;
    if (this.#ttlMs !== undefined) this.log.warn("the heartbeat thread died: the main thread renews the leases until another is ready");
    this.#assign();
  }

  /** Gives renewal to whichever thread should have it now. */
  #assign(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
    const ttl = this.#ttlMs;
    this.thread.renew(ttl !== undefined && this.#threadReady ? ttl : 0, this.link.index);
    if (ttl === undefined || this.#threadReady) return;
    this.#timer = setInterval(() => void this.renew(), Math.max(Math.floor(ttl / 3), 10));
    // The thread may have died just before its tick was due.
    void this.renew();
  }

  /** One renewal round on this thread (ticks call it; a round still running makes the next tick a no-op). */
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
