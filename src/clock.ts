/**
 * Time is a parameter. Every query that compares against "now" takes it from a Clock, so tests
 * drive leases, backoff and liveness with a FakeClock instead of sleeping.
 */
export interface Clock {
  /** Milliseconds since the epoch. */
  nowMs(): number;
}

export const systemClock: Clock = {
  nowMs: () => Date.now(),
};

/** A clock that only moves when told to. */
export class FakeClock implements Clock {
  #ms: number;

  constructor(startMs = Date.UTC(2026, 0, 1)) {
    this.#ms = startMs;
  }

  nowMs(): number {
    return this.#ms;
  }

  advance(ms: number): void {
    this.#ms += ms;
  }

  set(ms: number): void {
    this.#ms = ms;
  }
}

/** Milliseconds as nanoseconds, the unit of the engine-written bigint columns. */
export const msToNs = (ms: number): bigint => BigInt(Math.round(ms)) * 1_000_000n;
