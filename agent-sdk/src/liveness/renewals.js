// @ts-check
/**
 * Lease renewal in the heartbeat thread, so that a handler blocking the agent's event loop does not
 * cost it its lease. The agent hands over the leases it holds as it claims and finishes items, and
 * this renews all of them every third of the lease TTL, in one ExtendLease call per 10,000 leases:
 * a lease is renewed at least twice before it could expire. What must stay true:
 * - only the fencing token the agent handed over is ever sent for an item;
 * - a lease the daemon says is lost is renewed no more and reported to the agent, which aborts the
 *   item; a drop or a loss naming an older token leaves a newer dispatch of the same item held;
 * - one round at a time: a slow round delays the next tick rather than overlapping it;
 * - the ticks are local time, so the daemon's clock is never compared with ours.
 * A round that fails is retried on the next tick, at the next daemon when the failure is transient
 * (the daemons share one database: any of them renews).
 *
 * Plain JavaScript (type-checked from JSDoc, declared in renewals.d.ts), as thread.js is.
 */
import { Code, ConnectError } from "@connectrpc/connect";

/** Codes after which the same call can succeed later, or elsewhere. */
export const TRANSIENT = new Set([Code.Unavailable, Code.Unknown, Code.Internal, Code.DeadlineExceeded, Code.Aborted, Code.ResourceExhausted, Code.Canceled]);

/** The daemon's batch limit. */
export const MAX_BATCH = 10_000;

/** @typedef {import("./protocol.js").Lease} Lease */
/** @typedef {import("./protocol.js").LostLease} LostLease */
/** @typedef {import("./protocol.js").FromThread} FromThread */
/** @typedef {{ workItemId: string, ok: boolean, message: string }} Outcome */
/**
 * One daemon: its address (for reports) and its AgentService.ExtendLease.
 * @typedef {{ address: string, extendLease(leases: { workItemId: string, leaseToken: string }[], timeoutMs: number): Promise<Outcome[]> }} Daemon
 */

export class Renewals {
  /** @type {readonly Daemon[]} */
  #daemons;
  #rpcTimeoutMs;
  /** @type {(message: FromThread) => void} */
  #post;
  /** @type {Map<string, string>} The token each held lease is renewed with, by item id. */
  #held = new Map();
  /** 0 while not renewing. */
  #tickMs = 0;
  #current = 0;
  /** @type {NodeJS.Timeout | undefined} */
  #timer;
  /** A round is out; it schedules the next one itself when done. */
  #renewing = false;

  /**
   * @param {readonly Daemon[]} daemons in failover order
   * @param {number} rpcTimeoutMs the longest a call may take (a tick bounds it too)
   * @param {(message: FromThread) => void} post where `renewed`, `lost` and `renewalFailed` go
   */
  constructor(daemons, rpcTimeoutMs, post) {
    this.#daemons = daemons;
    this.#rpcTimeoutMs = rpcTimeoutMs;
    this.#post = post;
  }

  /** @param {readonly Lease[]} leases */
  hold(leases) {
    for (const l of leases) this.#held.set(l.id, l.token);
  }

  /** @param {readonly Lease[]} leases */
  drop(leases) {
    for (const l of leases) if (this.#held.get(l.id) === l.token) this.#held.delete(l.id);
  }

  /**
   * Renews every third of `ttlMs`, the first round a tick from now; when not renewing yet, first at
   * the daemon at `addressIndex`. 0 stops. The same tick again changes nothing, so a registration
   * that brings the same TTL does not put the next round off.
   * @param {number} ttlMs
   * @param {number} addressIndex
   */
  renewEvery(ttlMs, addressIndex) {
    const was = this.#tickMs;
    this.#tickMs = ttlMs > 0 ? Math.max(Math.floor(ttlMs / 3), 10) : 0;
    if (this.#tickMs === was) return;
    if (was === 0) this.#current = addressIndex % this.#daemons.length;
    if (this.#renewing) return;
    clearTimeout(this.#timer);
    this.#timer = this.#tickMs > 0 ? setTimeout(() => void this.#round(), this.#tickMs) : undefined;
  }

  async #round() {
    this.#renewing = true;
    const started = Date.now();
    const leases = [...this.#held].map(([id, token]) => ({ id, token }));
    let renewed = 0;
    for (let i = 0; i < leases.length; i += MAX_BATCH) {
      const chunk = leases.slice(i, i + MAX_BATCH);
      const daemon = /** @type {Daemon} */ (this.#daemons[this.#current]);
      /** @type {Outcome[]} */
      let outcomes;
      try {
        // Abandoned after a tick at most, so a daemon that hangs leaves time to try the next one.
        const timeoutMs = Math.min(this.#rpcTimeoutMs, Math.max(this.#tickMs, 1_000));
        outcomes = await daemon.extendLease(
          chunk.map((l) => ({ workItemId: l.id, leaseToken: l.token })),
          timeoutMs,
        );
      } catch (err) {
        const e = ConnectError.from(err);
        this.#post({ type: "renewalFailed", code: e.code, message: e.rawMessage, address: daemon.address, leases: chunk.length });
        if (TRANSIENT.has(e.code)) this.#current = (this.#current + 1) % this.#daemons.length;
        break;
      }
      const sent = new Map(chunk.map((l) => [l.id, l.token]));
      /** @type {LostLease[]} */
      const lost = [];
      for (const o of outcomes) {
        const token = sent.get(o.workItemId);
        if (token === undefined) continue;
        if (o.ok) {
          renewed++;
          continue;
        }
        if (this.#held.get(o.workItemId) === token) this.#held.delete(o.workItemId);
        lost.push({ id: o.workItemId, token, message: o.message });
      }
      if (lost.length > 0) this.#post({ type: "lost", leases: lost });
    }
    if (renewed > 0) this.#post({ type: "renewed", leases: renewed });
    this.#renewing = false;
    if (this.#tickMs > 0) this.#timer = setTimeout(() => void this.#round(), Math.max(0, this.#tickMs - (Date.now() - started)));
  }
}
