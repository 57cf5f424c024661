/**
 * Named prepared statements for the queue's hot path (claim, complete, fail, extend, release).
 * Postgres spent most of a claim planning it; a named statement is planned once
 * per connection and then runs on a cached plan. slonik cannot name statements, so these run on a
 * pg pool of their own, built from the same slonik SQL tokens (so the SQL still lives in the store,
 * values still bound) and validated by the same zod schemas. Row types match slonik's: int8 as
 * bigint, timestamptz as epoch milliseconds. A LIMIT in these statements is written as a literal,
 * because a bound LIMIT lets a generic plan fall back to sorting every pending row. JIT is off: its
 * compile time dwarfs these millisecond statements, and a cached generic plan's
 * pessimistic cost estimate would trigger it on every execution. Bitmap scans are off: no hot
 * statement wants one (the fenced writes go by primary key), and with a queue's statistics always
 * behind (the pending count swings from none to millions between analyses) the planner took a
 * bitmap scan of every pending row plus a sort for the claim, where the claim index's own order,
 * stopping at LIMIT, reads only the rows it takes. Sequential scans are off for the same reason: a
 * table analysed while empty (a new deployment, the end of a backlog) and then filled had every
 * claim read the whole table, finished rows and all; every hot statement has an index to go by.
 */
import { createHash } from "node:crypto";
import pg from "pg";
import type { QuerySqlToken } from "slonik";
import type { z } from "zod";
import { interpretDbError } from "./errors.js";
import { POOL_LIMITS } from "./pool.js";

const INT8 = 20;
const TIMESTAMPTZ = 1184;

const types = {
  getTypeParser(oid: number, format?: "text" | "binary") {
    if (oid === INT8) return (v: string) => BigInt(v);
    if (oid === TIMESTAMPTZ) return (v: string) => Date.parse(v);
    return pg.types.getTypeParser(oid, format);
  },
};

/**
 * The hot pool's planner settings (why each: above). Sorts are off as well: with the pending count
 * analysed near zero, the planner read every pending row by the due index and sorted them for a
 * claim, where the claim index's order needs no sort.
 * A sort no plan can avoid (an affinity key's DISTINCT) still runs: the setting only penalises.
 */
export const HOT_SESSION_OPTIONS = "-c jit=off -c enable_bitmapscan=off -c enable_seqscan=off -c enable_sort=off";

/** Client-side limits of the hot pool (tests shorten them). */
export interface HotTimeouts {
  /** A statement unanswered this long fails and its connection is dropped. */
  queryMs?: number;
  /** Opening a connection. */
  connectMs?: number;
}

export class PreparedQueries {
  readonly #pool: pg.Pool;
  /** By a token's SQL text: the statement's name and its text with pg's placeholders, made once. */
  readonly #statements = new Map<string, { name: string; text: string }>();

  constructor(url: string, maxConnections: number, timeouts: HotTimeouts = {}) {
    this.#pool = new pg.Pool({
      connectionString: url,
      max: maxConnections,
      application_name: "aiflowd-hot",
      types,
      idleTimeoutMillis: POOL_LIMITS.idleMs,
      options: HOT_SESSION_OPTIONS,
      // As the slonik pool's: a statement is ended by the server after a minute...
      statement_timeout: POOL_LIMITS.statementMs,
      // ...and one the server never answers (a silent network path, a hung server) by the client
      // 10 s later, which also retires the connection; otherwise each would hold its pooled
      // connection, and the claims queued behind it, until the kernel gave up on the socket.
      query_timeout: timeouts.queryMs ?? POOL_LIMITS.statementMs + 10_000,
      connectionTimeoutMillis: timeouts.connectMs ?? POOL_LIMITS.connectMs,
      keepAlive: true,
    });
    // An idle client's error (the server went away) must not crash the daemon; the next query reconnects.
    this.#pool.on("error", () => {});
  }

  /** Runs a slonik token as a named prepared statement and validates each row with the token's schema. */
  async any<T extends z.ZodTypeAny>(token: QuerySqlToken<T>): Promise<z.infer<T>[]> {
    const parser = token.parser as z.ZodTypeAny;
    return (await this.raw<unknown>(token)).map((row) => parser.parse(row) as z.infer<T>);
  }

  /**
   * Runs a slonik token as a named prepared statement and returns its rows as pg parsed them, with
   * no schema check: for statements on the per-item hot path whose casts fix every column's type.
   */
  async raw<R>(token: QuerySqlToken): Promise<R[]> {
    let statement = this.#statements.get(token.sql);
    if (!statement) {
      statement = { name: `aiflow_${createHash("sha1").update(token.sql).digest("hex").slice(0, 24)}`, text: token.sql.replaceAll("$slonik_", "$") };
      this.#statements.set(token.sql, statement);
    }
    let res: pg.QueryResult;
    try {
      res = await this.#pool.query({ name: statement.name, text: statement.text, values: token.values as unknown[] });
    } catch (err) {
      throw interpretDbError(err);
    }
    return res.rows as R[];
  }

  /** The pool's connections for /metrics. */
  usage(): { inUse: number; idle: number; waiting: number } {
    const p = this.#pool;
    return { inUse: p.totalCount - p.idleCount, idle: p.idleCount, waiting: p.waitingCount };
  }

  end(): Promise<void> {
    return this.#pool.end();
  }
}
