/**
 * Group commit for Enqueue. Calls that arrive while an insert is in flight (or in the same tick) are
 * written together in one statement when it returns, so a thousand single-item Enqueue calls a
 * second cost a few dozen statements rather than a thousand. A batch that fails is retried call by
 * call, so one call's bad row cannot fail its neighbours. Each statement offers its plain rows to
 * claims waiting for them (./waiting-claims.ts).
 *
 * Under sustained load the statements are paced: one starts at most once per window (`--enqueue-window`).
 * Unpaced, the next insert starts the moment the last returns, so a steady trickle of calls keeps a
 * few hundred inserts a second in flight whatever the rate, and each wakes a claim round trip; the
 * loop keeps the machine busy, and that load, not any one statement, sets the tail latency.
 * Paced, the same calls share fewer, larger statements and hand each waiting claim more rows. A call
 * that finds no statement in flight, and a backlog that already fills a statement, go at once.
 */
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import type { EnqueueResult, EnqueueRow, WorkItemStore } from "../store/work-items.js";
import type { WaitingClaims } from "./waiting-claims.js";

type Result = EnqueueResult[];

interface Waiting {
  rows: EnqueueRow[];
  resolve: (r: Result) => void;
  reject: (err: unknown) => void;
}

/** Rows per statement at most; a larger backlog goes in several statements, one after another. */
export const MAX_ROWS = 5000;

/** Monotonic time and waiting for the pacing window (not the wall clock: it may jump); tests pass their own. */
export interface PaceTimer {
  now(): number;
  sleep(ms: number): Promise<void>;
}

const monotonic: PaceTimer = { now: () => performance.now(), sleep: (ms) => sleep(ms) };

export interface BatcherOptions {
  /** Least time between the starts of two statements under load, in ms; 0: no pacing. */
  windowMs?: number;
  timer?: PaceTimer;
}

export class EnqueueGroupCommit {
  #queue: Waiting[] = [];
  #queuedRows = 0;
  #busy = false;
  /** Calls were waiting when the last statement returned (before its callers were answered). */
  #backlog = false;
  readonly #windowMs: number;
  readonly #timer: PaceTimer;

  constructor(
    private readonly store: WorkItemStore,
    private readonly waitingClaims?: WaitingClaims,
    options: BatcherOptions = {},
  ) {
    this.#windowMs = options.windowMs ?? 0;
    this.#timer = options.timer ?? monotonic;
  }

  submit(rows: EnqueueRow[]): Promise<Result> {
    return new Promise((resolve, reject) => {
      this.#queue.push({ rows, resolve, reject });
      this.#queuedRows += rows.length;
      if (!this.#busy) {
        this.#busy = true;
        // Let the calls that arrive in this tick join the first statement.
        setImmediate(() => void this.#drain());
      }
    });
  }

  async #drain(): Promise<void> {
    // Only calls that arrived while a statement was in flight are paced: a call that finds the batcher
    // idle (the first of a burst, or a producer that waits for each answer before its next call) is
    // written at once.
    let lastStart = Number.NEGATIVE_INFINITY;
    while (this.#queue.length > 0) {
      const wait = lastStart + this.#windowMs - this.#timer.now();
      if (this.#backlog && wait > 0 && this.#queuedRows < MAX_ROWS) await this.#timer.sleep(wait);
      lastStart = this.#timer.now();
      const batch: Waiting[] = [];
      let size = 0;
      while (this.#queue.length > 0 && (batch.length === 0 || size + this.#queue[0]!.rows.length <= MAX_ROWS)) {
        const w = this.#queue.shift()!;
        batch.push(w);
        size += w.rows.length;
      }
      this.#queuedRows -= size;
      await this.#write(batch);
    }
    this.#busy = false;
  }

  async #write(batch: Waiting[]): Promise<void> {
    const rows = batch.flatMap((w) => w.rows);
    const offers = this.waitingClaims?.reserve(rows);
    let results: Result;
    try {
      // Read when the statement returns, before any caller is answered (their next calls would count).
      results = await this.store.enqueueRows(rows, offers?.input).finally(() => (this.#backlog = this.#queue.length > 0));
    } catch (err) {
      // Nothing went in, so nothing was handed over; the claims offered these rows claim as before.
      offers?.settle(undefined);
      if (batch.length === 1) return batch[0]!.reject(err);
      for (const w of batch) await this.#write([w]);
      return;
    }
    offers?.settle(results);
    let at = 0;
    for (const w of batch) {
      w.resolve(results.slice(at, at + w.rows.length));
      at += w.rows.length;
    }
  }
}
