/**
 * Pages capped by bytes as well as by rows. A page of list results is read as a running sum of its
 * rows' sizes, in the page's own order, and only the rows that start within the budget leave
 * Postgres: the first row past it is the one lookahead that says more rows follow. So a page of
 * large rows costs the daemon at most its budget plus one row, however many rows it may hold.
 */
import { sql, type FragmentSqlToken } from "slonik";
import { z } from "zod";

/** The two columns budgeted() adds to each row. */
export const pageSizes = z.object({ page_bytes: z.number(), item_bytes: z.number() });

/**
 * `inner` (a SELECT with its own ORDER BY and LIMIT rows + 1) wrapped so that it yields the rows that
 * start within `maxBytes`, each row's `size` being an SQL expression over the inner select's columns.
 * `order` repeats the inner select's ORDER BY, in terms of its output columns.
 */
export function budgeted(inner: FragmentSqlToken, order: FragmentSqlToken, size: FragmentSqlToken, maxBytes: number): FragmentSqlToken {
  return sql.fragment`
    SELECT * FROM (
      SELECT s.*, sum(s.item_bytes) OVER (ORDER BY ${order} ROWS UNBOUNDED PRECEDING)::float8 AS page_bytes
        FROM (SELECT i.*, (${size})::float8 AS item_bytes FROM (${inner}) i) s
    ) p
     WHERE p.page_bytes - p.item_bytes < ${maxBytes}
     ORDER BY ${order}`;
}

/** A page of rows, and whether rows follow it (past the row limit or past the byte budget). */
export interface Page<T> {
  rows: readonly T[];
  more: boolean;
}

/**
 * The page from budgeted()'s rows: at most `limit` rows, stopping before the first row that ends past
 * `maxBytes` (never before the first row, however large).
 */
export function cutPage<T extends { page_bytes: number }>(rows: readonly T[], limit: number, maxBytes: number): Page<T> {
  let end = Math.min(rows.length, limit);
  const over = rows.findIndex((r, i) => i > 0 && r.page_bytes > maxBytes);
  if (over !== -1 && over < end) end = over;
  return { rows: rows.slice(0, end), more: rows.length > end };
}
