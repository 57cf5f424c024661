/**
 * Group commit for Enqueue. Calls that arrive while an insert is in flight (or in the same tick) are
 * written together in one statement when it returns, so a thousand single-item Enqueue calls a
 * second cost a few dozen statements rather than a thousand. A batch that fails is retried call by
 * call, so one call's bad row cannot fail its neighbours. Each statement offers its plain rows to
 * claims waiting for them (./handoff.ts).
 */
import type { EnqueueResult, EnqueueRow, WorkItemStore } from "../store/work-items.js";
import type { Handoff } from "./handoff.js";

type Result = EnqueueResult[];

interface Waiting {
  rows: EnqueueRow[];
  resolve: (r: Result) => void;
  reject: (err: unknown) => void;
}

/** Rows per statement at most; a larger backlog goes in several statements, one after another. */
const MAX_ROWS = 5000;

export class EnqueueBatcher {
  #queue: Waiting[] = [];
  #busy = false;

  constructor(
    private readonly store: WorkItemStore,
    private readonly handoff?: Handoff,
  ) {}

  submit(rows: EnqueueRow[]): Promise<Result> {
    return new Promise((resolve, reject) => {
      this.#queue.push({ rows, resolve, reject });
      if (!this.#busy) {
        this.#busy = true;
        // Let the calls that arrive in this tick join the first statement.
        setImmediate(() => void this.#drain());
      }
    });
  }

  async #drain(): Promise<void> {
    while (this.#queue.length > 0) {
      const batch: Waiting[] = [];
      let size = 0;
      while (this.#queue.length > 0 && (batch.length === 0 || size + this.#queue[0]!.rows.length <= MAX_ROWS)) {
        const w = this.#queue.shift()!;
        batch.push(w);
        size += w.rows.length;
      }
      await this.#write(batch);
    }
    this.#busy = false;
  }

  async #write(batch: Waiting[]): Promise<void> {
    const rows = batch.flatMap((w) => w.rows);
    const offers = this.handoff?.reserve(rows);
    let results: Result;
    try {
      results = await this.store.enqueueRows(rows, offers?.input);
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
