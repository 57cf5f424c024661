/**
 * Failed authentications per remote address, in fixed windows on an injected clock. An address
 * with more than `limit` failures in its window is `throttled` until the window ends. What that
 * costs is its callers' choice (./gate.ts): the ports refuse a throttled address's failing calls
 * cheaply (no log line, no count per reason, no further record) and serve its calls with valid
 * credentials, so that one guesser behind a NAT or a proxy locks out nobody beside it. Nothing here
 * is reset by a success. Only missing and unknown tokens count; a valid token of the wrong role is a
 * caller's mistake, not a guess.
 * The map is bounded: past MAX_ADDRESSES, expired windows are dropped, and if none has expired the
 * oldest entry goes (a flood of addresses can then escape the limit, never exhaust memory).
 */
import type { Clock } from "../clock.js";

const MAX_ADDRESSES = 100_000;

interface Window {
  startMs: number;
  failures: number;
}

export class AuthFailures {
  readonly #windows = new Map<string, Window>();

  constructor(
    private readonly clock: Clock,
    private readonly limit: number,
    private readonly windowMs: number,
  ) {}

  /** True while the address is over its limit. */
  throttled(address: string): boolean {
    const w = this.#windows.get(address);
    if (!w) return false;
    if (this.clock.nowMs() - w.startMs >= this.windowMs) {
      this.#windows.delete(address);
      return false;
    }
    return w.failures > this.limit;
  }

  /** Records one failure; returns true when this failure took the address over its limit. */
  record(address: string): boolean {
    const now = this.clock.nowMs();
    let w = this.#windows.get(address);
    if (!w || now - w.startMs >= this.windowMs) {
      if (w) this.#windows.delete(address);
      else if (this.#windows.size >= MAX_ADDRESSES) this.#prune(now);
      w = { startMs: now, failures: 0 };
      this.#windows.set(address, w);
    }
    w.failures++;
    return w.failures === this.limit + 1;
  }

  #prune(now: number): void {
    for (const [address, w] of this.#windows) if (now - w.startMs >= this.windowMs) this.#windows.delete(address);
    if (this.#windows.size >= MAX_ADDRESSES) this.#windows.delete(this.#windows.keys().next().value!);
  }
}
