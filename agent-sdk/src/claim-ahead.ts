/**
 * How many items an agent claims beyond its free slots ("prefetch"), so that its slots do not sit
 * idle through a claim's round trip, and so that each claim carries more.
 *
 * Much of what a claim costs does not depend on how many items it brings: in the drain benchmark,
 * claims of 32, 62 and 121 items cost the machine 291–317, 207–241 and 194 µs of CPU per item. With
 * handlers that finish within a round trip, an agent that claims only for its free slots makes one
 * claim per `slots` items, and its slots sit idle while each is out.
 *
 * What is claimed ahead waits, leased, for a slot, so it must not outlast a round trip: by Little's
 * law the slots finish `slots × round trip ÷ handler time` items in one, and that many (at most
 * `prefetch`) are claimed ahead. Handlers much slower than a round trip get nothing ahead, so a slow
 * agent never sits on items another could run. Nothing is claimed ahead until both have been
 * measured: the handlers' time as they settle, the round trip only from claims answered at once
 * (they brought all they asked for; a claim that waited for work says nothing about the trip).
 */

/** Weight of the newest sample in the moving averages. */
const WEIGHT = 0.2;
/** A handler's time is counted as at least this (ms): a no-op's zero would make the allowance infinite. */
const MIN_HANDLER_MS = 0.001;

export class ClaimAhead {
  #handlerMs: number | undefined;
  #roundTripMs: number | undefined;

  constructor(
    private readonly slots: number,
    /** The most items held beyond the slots; 0 turns claiming ahead off. */
    private readonly max: number,
  ) {}

  /** A handler settled after `ms`. */
  handlerTook(ms: number): void {
    this.#handlerMs = average(this.#handlerMs, ms);
  }

  /** A claim answered at once (it brought all it asked for) after `ms`. */
  claimTook(ms: number): void {
    this.#roundTripMs = average(this.#roundTripMs, ms);
  }

  /** How many items to hold beyond the slots now. */
  get allowance(): number {
    if (this.max === 0 || this.#handlerMs === undefined || this.#roundTripMs === undefined) return 0;
    const finished = (this.slots * this.#roundTripMs) / Math.max(this.#handlerMs, MIN_HANDLER_MS);
    return Math.min(this.max, Math.floor(finished));
  }
}

function average(previous: number | undefined, sample: number): number {
  return previous === undefined ? sample : previous + WEIGHT * (sample - previous);
}
