/**
 * Reads of work items: one by id, those a Wait watches, a parent's child counts, and list pages in
 * dispatch order, keyset-paged and capped by bytes (../paging.ts). Nothing here writes.
 */
import { sql } from "slonik";
import { z } from "zod";
import { withDbErrors } from "../../db/errors.js";
import { ts } from "../../db/values.js";
import { budgeted, cutPage, pageSizes, type Page } from "../paging.js";
import { ITEM_COLUMNS, ITEM_STATUSES, workItemRow, type ItemStatus, type WorkItemRow } from "./columns.js";
import type { ItemsContext } from "./context.js";

export interface ListFilter {
  /** Undefined: every tenant (operators without a tenant limit only). */
  tenants?: readonly string[];
  statuses: ItemStatus[];
  engineKind?: string;
  runId?: string;
  parentId?: string;
  agent?: string;
  idempotencyKey?: string;
  /** Keyset cursor: the last row of the previous page. */
  after?: { priority: number; createdon: number; id: string };
  limit: number;
  /**
   * The page's payload and result bytes: rows are taken while they fit, and always at least one
   * (../paging.ts).
   */
  maxBytes: number;
}

/** One item; tenant-qualified unless the caller is an operator (tenant null). */
export function get(q: ItemsContext, tenant: string | null, id: string): Promise<WorkItemRow | null> {
  const w = q.t.id("work_item");
  const scope = tenant === null ? sql.fragment`true` : sql.fragment`tenant_key = ${tenant}`;
  return withDbErrors(() => q.db.maybeOne(sql.type(workItemRow)`SELECT ${ITEM_COLUMNS} FROM ${w} WHERE ${scope} AND id = ${id}`));
}

/** Items by ids or run, for Wait. */
export function find(q: ItemsContext, tenant: string, ids: readonly string[], runId: string | null): Promise<readonly WorkItemRow[]> {
  const w = q.t.id("work_item");
  return withDbErrors(() =>
    q.db.any(sql.type(workItemRow)`
        SELECT ${ITEM_COLUMNS} FROM ${w} WHERE tenant_key = ${tenant}
           AND (id = ANY(${sql.array([...ids], "text")}) ${runId ? sql.fragment`OR run_id = ${runId}` : sql.fragment``})
         ORDER BY priority, createdon, id`),
  );
}

const statusCount = z.object({ status: z.enum(ITEM_STATUSES), n: z.number() });

/** A parent's children by status. */
export function childCounts(q: ItemsContext, tenant: string, parentId: string): Promise<Record<ItemStatus, number>> {
  const w = q.t.id("work_item");
  return withDbErrors(async () => {
    const rows = await q.db.any(sql.type(statusCount)`
        SELECT status, count(*)::int AS n FROM ${w} WHERE tenant_key = ${tenant} AND parent_work_item_id = ${parentId} GROUP BY status`);
    const counts = { pending: 0, dispatched: 0, completed: 0, failed: 0, cancelled: 0 };
    for (const r of rows) counts[r.status] = r.n;
    return counts;
  });
}

/** One page in dispatch order (priority, createdon, id), keyset-paged, within f.limit rows and f.maxBytes. */
export function list(q: ItemsContext, f: ListFilter): Promise<Page<WorkItemRow>> {
  const w = q.t.id("work_item");
  const conds = [
    f.tenants === undefined
      ? sql.fragment`true`
      : f.tenants.length === 1
        ? sql.fragment`tenant_key = ${f.tenants[0]!}`
        : sql.fragment`tenant_key = ANY(${sql.array([...f.tenants], "text")})`,
  ];
  if (f.statuses.length > 0) conds.push(sql.fragment`status = ANY(${sql.array(f.statuses, "text")})`);
  if (f.engineKind) conds.push(sql.fragment`engine_kind = ${f.engineKind}`);
  if (f.runId) conds.push(sql.fragment`run_id = ${f.runId}`);
  if (f.parentId) conds.push(sql.fragment`parent_work_item_id = ${f.parentId}`);
  if (f.agent) conds.push(sql.fragment`agent_id = ${f.agent}`);
  if (f.idempotencyKey) conds.push(sql.fragment`idempotency_key = ${f.idempotencyKey}`);
  if (f.after) conds.push(sql.fragment`(priority, createdon, id) > (${f.after.priority}, ${ts(f.after.createdon)}, ${f.after.id})`);
  const order = sql.fragment`priority, createdon, id`;
  const inner = sql.fragment`SELECT ${ITEM_COLUMNS} FROM ${w} WHERE ${sql.join(conds, sql.fragment` AND `)} ORDER BY ${order} LIMIT ${f.limit + 1}`;
  const size = sql.fragment`coalesce(octet_length(payload), 0) + coalesce(octet_length(result), 0)`;
  return withDbErrors(async () =>
    cutPage(await q.db.any(sql.type(workItemRow.merge(pageSizes))`${budgeted(inner, order, size, f.maxBytes)}`), f.limit, f.maxBytes),
  );
}
