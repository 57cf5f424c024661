/**
 * The slonik pool. Result rows are validated against each query's zod schema by an interceptor,
 * because slonik does not validate by itself. int8 columns come back as bigint (epoch nanoseconds do
 * not fit a double) and timestamptz as epoch milliseconds.
 */
import { createPool, SchemaValidationError, type DatabasePool, type Interceptor } from "slonik";
import { Admission, admitted, SLONIK_ROOM } from "./admission.js";
import type { Logger } from "../log.js";

const resultParser: Interceptor = {
  name: "zod-result-parser",
  transformRow: (ctx, query, row) => {
    if (!ctx.resultParser) return row;
    const parsed = ctx.resultParser.safeParse(row);
    if (!parsed.success) throw new SchemaValidationError(query, row, parsed.error.issues);
    return parsed.data as typeof row;
  },
};

export interface PoolOptions {
  url: string;
  maxConnections: number;
  applicationName?: string;
  /** Extra interceptors, run after the result parser (tests count statements with one). */
  interceptors?: readonly Interceptor[];
  /** How long an operation may go unanswered before its path counts as dead (default POOL_LIMITS.silentMs). */
  silentMs?: number;
}

/**
 * Limits both pools keep (this one and the hot pool, ./prepared.ts): the server ends a statement after
 * a minute, an idle connection is closed after 30 s, and opening one may take 5 s. An operation still
 * unanswered 5 s after the server would have ended it has lost its path to the server (silentMs).
 */
export const POOL_LIMITS = { statementMs: 60_000, idleMs: 30_000, connectMs: 5_000, silentMs: 65_000 } as const;

/** The pool, at most `maxConnections` connections at once (kept by ./admission.ts: it says why). */
export async function openPool(opts: PoolOptions): Promise<DatabasePool> {
  const pool = await createPool(withApplicationName(opts.url, opts.applicationName ?? "aiflowd"), {
    interceptors: [resultParser, ...(opts.interceptors ?? [])],
    maximumPoolSize: SLONIK_ROOM,
    // Stack capture costs more than most of our queries; errors carry the SQL already.
    captureStackTrace: false,
    // The default reset runs DISCARD ALL on every release, which drops prepared plans; we keep no
    // session state on pooled connections (LISTEN uses its own dedicated connection).
    resetConnection: async () => {},
    statementTimeout: POOL_LIMITS.statementMs,
    idleTimeout: POOL_LIMITS.idleMs,
    connectionTimeout: POOL_LIMITS.connectMs,
  });
  return admitted(pool, new Admission(opts.maxConnections, opts.silentMs ?? POOL_LIMITS.silentMs));
}

/**
 * Names the connections (pg_stat_activity shows which daemon part a query is from) and turns JIT off:
 * its compile time dwarfs the short statements a queue runs.
 */
function withApplicationName(url: string, name: string): string {
  try {
    const u = new URL(url);
    if (!u.searchParams.has("application_name")) u.searchParams.set("application_name", name);
    if (!u.searchParams.has("options")) u.searchParams.set("options", "-c jit=off");
    return u.toString();
  } catch {
    return url;
  }
}

/**
 * Opens the pool once the database answers, retrying with capped exponential backoff for up to
 * `timeoutMs` and saying so in the log each time, so an outage at start-up is visible rather than a
 * silent crash loop. Opening the pool is retried too: slonik reads the server's types when it is
 * created, so a refused connection fails there first.
 */
export async function openPoolWhenReachable(opts: PoolOptions, log: Logger, timeoutMs: number, signal?: AbortSignal): Promise<DatabasePool> {
  const { sql } = await import("slonik");
  const deadline = Date.now() + timeoutMs;
  let delay = 250;
  for (let attempt = 1; ; attempt++) {
    let pool: DatabasePool | undefined;
    try {
      pool = await openPool(opts);
      await pool.query(sql.unsafe`SELECT 1`);
      if (attempt > 1) log.info({ attempt }, "database reachable");
      return pool;
    } catch (err) {
      await pool?.end().catch(() => {});
      const remaining = deadline - Date.now();
      if (remaining <= 0 || signal?.aborted) throw new Error(`database unreachable after ${attempt} attempts: ${(err as Error).message}`, { cause: err });
      const wait = Math.min(delay, remaining);
      log.warn({ attempt, retryInMs: wait, err: (err as Error).message }, "database unreachable, retrying");
      await new Promise((r) => setTimeout(r, wait));
      delay = Math.min(delay * 2, 5_000);
    }
  }
}
