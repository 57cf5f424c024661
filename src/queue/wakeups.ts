/**
 * Wake-ups without polling, across daemons. `ring(keys)` wakes this daemon's waiters at once and
 * tells the other daemons with ONE NOTIFY per coalescing window, however many items or calls rang
 * in it (a NOTIFY per item is what caps other Postgres queues at a few hundred jobs per second).
 *
 * A waiter is armed BEFORE it checks the database, so a ring that lands between its check and its
 * wait is not lost. A ring may wake only as many local waiters as it has work for; other daemons are
 * told the keys and wake every matching waiter.
 *
 * Other daemons are only told when there are any: each daemon announces itself when it starts (and
 * when its listener reconnects) and then every PEER_PING_MS, answers the first announcement it hears
 * from a daemon with its own (so a daemon that starts later knows of it at once), and a daemon that has heard no other
 * daemon for PEER_TTL_MS keeps its rings local. A lone daemon (the common deployment) then sends no
 * NOTIFY at all where it sent one per window: at 1,000 enqueues a second, 200 statements a second,
 * each also a signal to every listening connection. A ping lost or late costs at most the claims'
 * fallback re-check: one statement per daemon every few seconds over the keys waiters wait on
 * (WorkQueue's due-wake task), which rings the keys that have due work; waiters keep no timer of
 * their own, so a thousand idle claims cost that one statement, not a thousand.
 */
import { randomUUID } from "node:crypto";
import type { DatabasePool } from "slonik";
import { notify, type PgListener } from "../db/notify.js";
import type { Logger } from "../log.js";
import { onAbort } from "../util/on-abort.js";

/** The wildcard key: wakes every waiter. */
export const ANY = "*";
const MAX_PAYLOAD = 7000;
const PEER_PING_MS = 5_000;
const PEER_TTL_MS = 3 * PEER_PING_MS;

export interface Armed {
  /** Resolves true when rung (for one of its keys) since arming, false at the timeout, an abort or once disarmed. */
  wait(timeoutMs: number, signals: readonly AbortSignal[]): Promise<boolean>;
  disarm(): void;
  /** How many items the waiter's next look takes at most, changed while it waits (a stream given more credits). */
  setCapacity(capacity: number): void;
}

interface Waiter {
  keys: ReadonlySet<string> | null;
  /** How many items the waiter's next look takes at most (a claim's max_items; 1 for other waiters). */
  capacity: number;
  rung: boolean;
  /**
   * Capacity left of a waiter woken from its wait: it looks again only after the rings of this
   * tick, so it sees their items too, and further rings count against it before waking others.
   */
  spare: number;
  resolve?: (rung: boolean) => void;
}

export class Wakeups {
  readonly #waiters = new Set<Waiter>();
  #outgoing = new Set<string>();
  #timer: NodeJS.Timeout | undefined;
  /**
   * Who sent a notification, to skip our own (we woke our waiters when we rang). Unique per daemon,
   * not the configured instance id: two daemons given the same id (or the default HOST:PORT with
   * port 0) must still wake each other.
   */
  readonly #self: string;
  /** Until when (Date.now() ms) another daemon is known to listen on this channel. */
  #peersUntil = 0;
  /** Each daemon heard from, until when it counts as listening. */
  readonly #peers = new Map<string, number>();
  #ping: NodeJS.Timeout | undefined;

  constructor(
    private readonly pool: DatabasePool,
    private readonly channel: string,
    instanceId: string,
    private readonly windowMs: number,
    private readonly log: Logger,
  ) {
    this.#self = `${instanceId}/${randomUUID()}`;
  }

  async start(listener: PgListener): Promise<void> {
    await listener.on(this.channel, (payload) => {
      try {
        const msg = JSON.parse(payload) as { from: string; keys: string[] };
        if (msg.from === this.#self) return;
        const now = Date.now();
        this.#peersUntil = now + PEER_TTL_MS;
        // A daemon heard for the first time (just started) has not heard this one, which announced
        // before it listened: answer at once, or its rings stay local until the next ping.
        if ((this.#peers.get(msg.from) ?? 0) < now) void this.#announce();
        this.#peers.set(msg.from, now + PEER_TTL_MS);
        if (this.#peers.size > 1024) for (const [peer, until] of this.#peers) if (until < now) this.#peers.delete(peer);
        if (msg.keys.length > 0) this.#wakeLocal(msg.keys);
      } catch {
        this.#wakeLocal([ANY]);
      }
    });
    // Notifications sent while the listener was reconnecting are lost: wake everyone to re-check,
    // and announce this daemon again (others may have stopped counting it).
    listener.onReconnect(() => {
      this.#wakeLocal([ANY]);
      void this.#announce();
    });
    await this.#announce();
    this.#ping = setInterval(() => void this.#announce(), PEER_PING_MS);
    this.#ping.unref();
  }

  /** Whether another daemon was heard from lately (its rings are then worth a NOTIFY). */
  get hasPeers(): boolean {
    return Date.now() < this.#peersUntil;
  }

  /** Wakes local waiters now and other daemons within one window. */
  ring(keys: readonly string[], limit = Number.POSITIVE_INFINITY): void {
    if (keys.length === 0) return;
    this.#wakeLocal(keys, limit);
    if (!this.hasPeers) return;
    for (const k of keys) this.#outgoing.add(k);
    this.#timer ??= setTimeout(() => void this.#flush(), this.windowMs);
  }

  /** Wakes only this daemon's waiters (for conditions every daemon detects itself, like due items). */
  ringLocal(keys: readonly string[]): void {
    this.#wakeLocal(keys);
  }

  /**
   * Arms a waiter for these keys (null: any ring wakes it) that takes up to `capacity` items when it
   * looks again. With `onWake` the waiter waits from now on without wait(): the first ring calls it
   * with true, disarm() with false (an agent stream parks this way, with no timer and no signal
   * listener of its own).
   */
  arm(keys: ReadonlySet<string> | null, capacity = 1, onWake?: (rung: boolean) => void): Armed {
    const w: Waiter = { keys, capacity: Math.max(1, capacity), rung: false, spare: 0 };
    if (onWake)
      w.resolve = (rung) => {
        w.resolve = undefined;
        onWake(rung);
      };
    this.#waiters.add(w);
    return {
      wait: (timeoutMs, signals) => {
        if (w.rung) return Promise.resolve(true);
        // Disarmed (by its owner, or by a handoff that offered its claim items): nothing wakes it.
        if (!this.#waiters.has(w) || timeoutMs <= 0 || signals.some((s) => s.aborted)) return Promise.resolve(false);
        return new Promise<boolean>((resolve) => {
          const done = (rung: boolean) => {
            clearTimeout(timer);
            for (const off of offs) off();
            w.resolve = undefined;
            resolve(rung);
          };
          const timer = setTimeout(() => done(false), timeoutMs);
          const offs = signals.map((s) => onAbort(s, () => done(false)));
          w.resolve = done;
        });
      },
      disarm: () => {
        this.#waiters.delete(w);
        w.resolve?.(false);
      },
      setCapacity: (capacity) => {
        w.capacity = Math.max(1, capacity);
      },
    };
  }

  get waiting(): number {
    return this.#waiters.size;
  }

  /**
   * The keys armed waiters wait on, each once (a waiter armed for any key adds none: any ring of
   * one of these wakes it too). The fallback re-check asks the database about these keys only.
   */
  waitedKeys(): string[] {
    const keys = new Set<string>();
    for (const w of this.#waiters) if (!w.rung && w.keys) for (const k of w.keys) keys.add(k);
    return [...keys];
  }

  async stop(): Promise<void> {
    clearInterval(this.#ping);
    clearTimeout(this.#timer);
    this.#timer = undefined;
    await this.#flush();
  }

  /**
   * Wakes matching waiters for `limit` items (the longest-waiting first: a Set iterates in insertion
   * order). A limit keeps one item from waking every idle claim on the daemon, and a waiter counts
   * for as many items as it takes: the single-item Enqueue calls of one insert statement ring one by
   * one in the same tick, and each used to wake a claim of its own, which then raced the others for
   * the statement's items (one claim took them, the rest ran their statements for nothing). Waiters
   * already woken from their wait take items of later rings up to their capacity; a waiter rung while
   * it looks (its statement may have missed the items) counts for one, as before.
   */
  #wakeLocal(keys: readonly string[], limit = Number.POSITIVE_INFINITY): void {
    const all = keys.includes(ANY);
    let left = limit;
    for (const w of this.#waiters) {
      if (left <= 0) return;
      if (!(all || w.keys === null || keys.some((k) => w.keys!.has(k)))) continue;
      if (w.rung) {
        const take = Math.min(w.spare, left);
        w.spare -= take;
        left -= take;
        continue;
      }
      w.rung = true;
      if (w.resolve) {
        w.spare = Math.max(0, w.capacity - left);
        left -= w.capacity;
        w.resolve(true);
      } else left--;
    }
  }

  /** Tells other daemons this one listens here (a message with no keys wakes nobody). */
  async #announce(): Promise<void> {
    try {
      await notify(this.pool, this.channel, JSON.stringify({ from: this.#self, keys: [] }));
    } catch (err) {
      this.log.debug({ err: (err as Error).message, channel: this.channel }, "could not announce this daemon to others");
    }
  }

  async #flush(): Promise<void> {
    this.#timer = undefined;
    if (this.#outgoing.size === 0) return;
    let keys = [...this.#outgoing];
    this.#outgoing = new Set();
    let payload = JSON.stringify({ from: this.#self, keys });
    if (payload.length > MAX_PAYLOAD) {
      keys = [ANY];
      payload = JSON.stringify({ from: this.#self, keys });
    }
    try {
      await notify(this.pool, this.channel, payload);
    } catch (err) {
      this.log.warn({ err: (err as Error).message, channel: this.channel }, "could not notify other daemons; their fallback poll will find the work");
    }
  }
}
