/**
 * Wake-ups without polling, across daemons. `ring(keys)` wakes this daemon's waiters at once and
 * tells the other daemons with ONE NOTIFY per coalescing window, however many items or calls rang
 * in it (a NOTIFY per item is what caps other Postgres queues at a few hundred jobs per second).
 *
 * A waiter is armed BEFORE it checks the database, so a ring that lands between its check and its
 * wait is not lost. A ring may wake only as many local waiters as it has work for; other daemons are
 * told the keys and wake every matching waiter.
 */
import { randomUUID } from "node:crypto";
import type { DatabasePool } from "slonik";
import { notify, type PgListener } from "../db/notify.js";
import type { Logger } from "../log.js";

/** The wildcard key: wakes every waiter. */
export const ANY = "*";
const MAX_PAYLOAD = 7000;

export interface Armed {
  /** Resolves true when rung (for one of its keys) since arming, false at the timeout or an abort. */
  wait(timeoutMs: number, signals: readonly AbortSignal[]): Promise<boolean>;
  disarm(): void;
}

interface Waiter {
  keys: ReadonlySet<string> | null;
  rung: boolean;
  resolve?: (rung: boolean) => void;
}

export class Beacon {
  readonly #waiters = new Set<Waiter>();
  #outgoing = new Set<string>();
  #timer: NodeJS.Timeout | undefined;
  /**
   * Who sent a notification, to skip our own (we woke our waiters when we rang). Unique per beacon,
   * not the configured instance id: two daemons given the same id (or the default HOST:PORT with
   * port 0) must still wake each other.
   */
  readonly #self: string;

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
        if (msg.from !== this.#self) this.#wakeLocal(msg.keys);
      } catch {
        this.#wakeLocal([ANY]);
      }
    });
    // Notifications sent while the listener was reconnecting are lost: wake everyone to re-check.
    listener.onReconnect(() => this.#wakeLocal([ANY]));
  }

  /** Wakes local waiters now and other daemons within one window. */
  ring(keys: readonly string[], limit = Number.POSITIVE_INFINITY): void {
    if (keys.length === 0) return;
    this.#wakeLocal(keys, limit);
    for (const k of keys) this.#outgoing.add(k);
    this.#timer ??= setTimeout(() => void this.#flush(), this.windowMs);
  }

  /** Wakes only this daemon's waiters (for conditions every daemon detects itself, like due items). */
  ringLocal(keys: readonly string[]): void {
    this.#wakeLocal(keys);
  }

  /** Arms a waiter for these keys (null: any ring wakes it). */
  arm(keys: ReadonlySet<string> | null): Armed {
    const w: Waiter = { keys, rung: false };
    this.#waiters.add(w);
    return {
      wait: (timeoutMs, signals) => {
        if (w.rung) return Promise.resolve(true);
        if (timeoutMs <= 0 || signals.some((s) => s.aborted)) return Promise.resolve(false);
        return new Promise<boolean>((resolve) => {
          const done = (rung: boolean) => {
            clearTimeout(timer);
            for (const s of signals) s.removeEventListener("abort", onAbort);
            w.resolve = undefined;
            resolve(rung);
          };
          const onAbort = () => done(false);
          const timer = setTimeout(() => done(false), timeoutMs);
          for (const s of signals) s.addEventListener("abort", onAbort);
          w.resolve = done;
        });
      },
      disarm: () => {
        this.#waiters.delete(w);
        w.resolve?.(false);
      },
    };
  }

  get waiting(): number {
    return this.#waiters.size;
  }

  async stop(): Promise<void> {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    await this.#flush();
  }

  /**
   * Wakes matching waiters, at most `limit` of them (the longest-waiting first: a Set iterates in
   * insertion order). A limit keeps one item from waking every idle claim on the daemon.
   */
  #wakeLocal(keys: readonly string[], limit = Number.POSITIVE_INFINITY): void {
    const all = keys.includes(ANY);
    let woken = 0;
    for (const w of this.#waiters) {
      if (woken >= limit) return;
      if (w.rung) continue;
      if (all || w.keys === null || keys.some((k) => w.keys!.has(k))) {
        w.rung = true;
        w.resolve?.(true);
        woken++;
      }
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
