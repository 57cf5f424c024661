/**
 * How the database being away is logged: as a warning line without a stack, the first at once and
 * then at most one a second per log site with how many failures it stands for, so an outage under
 * load (every call, sweep and flush failing) costs a few lines, not thousands.
 */
import type { Logger } from "../log.js";
import { databaseAway } from "./errors.js";

export class OutageLog {
  #lastAt = -Infinity;
  #since = 0;

  constructor(
    private readonly log: Logger,
    private readonly message: string,
    private readonly everyMs = 1_000,
  ) {}

  /** Logs `err` if it says the database is away, and returns true; false (nothing logged) otherwise. */
  note(err: unknown, fields: Record<string, unknown> = {}): boolean {
    const mapped = databaseAway(err);
    if (!mapped) return false;
    this.#since++;
    const now = performance.now();
    if (now - this.#lastAt < this.everyMs) return true;
    this.#lastAt = now;
    const cause = mapped.cause instanceof Error ? mapped.cause.message : undefined;
    this.log.warn({ ...fields, reason: mapped.message, cause, failures: this.#since }, this.message);
    this.#since = 0;
    return true;
  }
}
