/**
 * What /readyz answers: whether this daemon can do its work now. Ready means all of:
 * - it is not shutting down (a draining daemon must leave the load balancer's rotation first);
 * - the database answers, within CHECK_TIMEOUT_MS, over the daemon's own pool;
 * - the schema is at the migration this daemon was built for (not older, not newer: a newer one
 *   means a later version migrated it, and this one would misread its tables);
 * - the LISTEN connection is up (without it, claims on this daemon hear of new work only at the
 *   fallback re-check, and drains and cancels reach its agents late).
 *
 * The database check is one short statement, shared by probes that arrive within CACHE_MS of each
 * other (a kubelet and a load balancer probing every second cost one statement per second).
 */
import type { DatabasePool } from "slonik";
import type { Clock } from "../clock.js";
import { appliedVersion, latestVersion } from "../db/migrate.js";
import { OutageLog } from "../db/outage-log.js";
import type { Tables } from "../db/tables.js";
import type { Logger } from "../log.js";
import { LATE, within } from "../util/within.js";

export const CHECK_TIMEOUT_MS = 2_000;
const CACHE_MS = 1_000;

export interface ReadinessReport {
  ready: boolean;
  /** Each check: "ok", or why not, in words an operator can act on. */
  checks: { shutdown: string; database: string; schema: string; listen: string };
}

export interface ReadinessDeps {
  pool: DatabasePool;
  tables: Tables;
  clock: Clock;
  /** Aborted when shutdown begins. */
  draining: AbortSignal;
  listening: () => boolean;
  log: Logger;
  /** The migration this daemon expects (default: the newest it carries). */
  expectedVersion?: number;
}

export class Readiness {
  #last: { atMs: number; database: string; schema: string } | undefined;
  #checking: Promise<{ database: string; schema: string }> | undefined;
  /** How the database's absence is logged: a line a second at most, however often probes come. */
  readonly #outage: OutageLog;
  readonly #expected: number;

  constructor(private readonly d: ReadinessDeps) {
    this.#expected = d.expectedVersion ?? latestVersion();
    this.#outage = new OutageLog(d.log, "readiness: the database is unavailable");
  }

  async report(): Promise<ReadinessReport> {
    const { database, schema } = await this.#database();
    const checks = {
      shutdown: this.d.draining.aborted ? "shutting down" : "ok",
      database,
      schema,
      listen: this.d.listening() ? "ok" : "the LISTEN connection is down; it is being made again",
    };
    return { ready: Object.values(checks).every((c) => c === "ok"), checks };
  }

  #database(): Promise<{ database: string; schema: string }> {
    const now = this.d.clock.nowMs();
    if (this.#last && now - this.#last.atMs < CACHE_MS) return Promise.resolve(this.#last);
    return (this.#checking ??= this.#check().then(
      (r) => {
        this.#last = { atMs: now, ...r };
        this.#checking = undefined;
        return r;
      },
      () => {
        this.#checking = undefined;
        return { database: "not checked", schema: "not checked" };
      },
    ));
  }

  async #check(): Promise<{ database: string; schema: string }> {
    try {
      const v = await within(appliedVersion(this.d.pool, this.d.tables), CHECK_TIMEOUT_MS);
      if (v === LATE) return { database: `the database did not answer within ${CHECK_TIMEOUT_MS} ms`, schema: "unknown" };
      const schema =
        v === this.#expected
          ? "ok"
          : v !== null && v > this.#expected
            ? `the schema is at migration ${v}, newer than this aiflowd knows (${this.#expected}): upgrade aiflowd`
            : `the schema is at migration ${v ?? 0}, older than this aiflowd needs (${this.#expected}): run aiflowd migrate`;
      return { database: "ok", schema };
    } catch (err) {
      // The probe is unauthenticated: the cause (addresses, users) goes to the log, not to the caller.
      if (!this.#outage.note(err)) this.d.log.error({ err }, "readiness: the database check failed");
      return { database: "the database is unavailable (the daemon's log says why)", schema: "unknown" };
    }
  }
}
