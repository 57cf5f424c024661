/**
 * What every statement group of the work item store runs on: the slonik pool, the table names, the
 * retry backoff, and the hot path's named prepared statements with the shapes they are built from.
 * A hot statement runs prepared when a PreparedQueries is given, and through slonik otherwise, so
 * both paths bind the same token.
 */
import { sql, type CommonQueryMethods, type FragmentSqlToken, type QuerySqlToken } from "slonik";
import type { z } from "zod";
import { withDbErrors } from "../../db/errors.js";
import { DEFAULT_CREDIT } from "../../domain/fair-share.js";
import type { PreparedQueries } from "../../db/prepared.js";
import { StatementShapes } from "../../db/statement-shapes.js";
import type { Tables } from "../../db/tables.js";
import type { idRow } from "./columns.js";

export interface Backoff {
  baseMs: number;
  capMs: number;
  /** Full jitter (rand(0, bound)) when true; the bound itself when false (deterministic tests). */
  jitter: boolean;
}

/** Fair share and aging as configured (../../domain/fair-share.ts). */
export interface Sharing {
  /** Configured weights by tenant (an operator's weight on the tenant's row stands over them). */
  weights: ReadonlyMap<string, number>;
  /** Items' worth of turns an idle tenant may bank. */
  credit: number;
  /** Waiting this long is worth one priority level; 0: aging off. */
  agingMs: number;
}

export const DEFAULT_SHARING: Sharing = { weights: new Map(), credit: DEFAULT_CREDIT, agingMs: 0 };

export class ItemsContext {
  /** The hot statements (enqueue, claim, completion), built once per shape. */
  readonly shapes = new StatementShapes();

  constructor(
    readonly db: CommonQueryMethods,
    readonly t: Tables,
    readonly backoff: Backoff,
    /** Named prepared statements for the hot path; without it, everything runs through slonik. */
    readonly hot?: PreparedQueries,
    readonly sharing: Sharing = DEFAULT_SHARING,
  ) {}

  /** Runs a hot-path statement as a prepared statement when a PreparedQueries is given. */
  hotRows<T extends z.ZodTypeAny>(token: QuerySqlToken<T>): Promise<readonly z.infer<T>[]> {
    return this.hot ? this.hot.any(token) : withDbErrors(() => this.db.any(token));
  }

  /** A hot-path statement whose rows skip the zod check (see ClaimedRow for when that is right). */
  hotRowsUnchecked<T>(token: QuerySqlToken): Promise<readonly T[]> {
    return this.hot ? this.hot.raw<T>(token) : (withDbErrors(() => this.db.any(token)) as Promise<readonly T[]>);
  }

  /** Ids a fenced write matched: one text column, read without a schema check (once per item). */
  hotIds(token: QuerySqlToken<typeof idRow>): Promise<readonly string[]> {
    return this.hotRowsUnchecked<{ id: string }>(token).then((rows) => rows.map((r) => r.id));
  }

  /**
   * Backoff in ns for an item that has been retried `retries` times: exponential with full jitter,
   * rand(0, min(cap, base × 2^retries)). Computed in SQL so a batch needs one statement.
   */
  backoffNs(retries: FragmentSqlToken): FragmentSqlToken {
    const { baseMs, capMs, jitter } = this.backoff;
    const bound = sql.fragment`least(${capMs}::float8, ${baseMs}::float8 * power(2::float8, least(${retries}, 60)))`;
    return sql.fragment`(floor(${jitter ? sql.fragment`random()` : sql.fragment`1`} * ${bound}) * 1000000)::bigint`;
  }
}
