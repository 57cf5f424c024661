/**
 * The statement parts the graph and state-machine run stores share (graph-runs.ts,
 * machine-runs.ts): a caller's own runs of a tenant, and the keyset page after a cursor, newest
 * first (createdon desc, id desc).
 */
import { sql, type FragmentSqlToken } from "slonik";

export interface Owner {
  by: string;
  tenantKey: string;
}

export interface RunCursor {
  createdUs: bigint;
  id: string;
}

/** `AND` the run is the caller's, in the tenant; nothing for an engine's own read (null). */
export const ownedBy = (scope: Owner | null): FragmentSqlToken =>
  scope ? sql.fragment`AND createdby = ${scope.by} AND tenant_key = ${scope.tenantKey}` : sql.fragment``;

/** `AND` the run comes after the cursor in the newest-first order; nothing for the first page. */
export const afterCursor = (cursor: RunCursor | null): FragmentSqlToken =>
  cursor
    ? sql.fragment`AND (createdon, id) < ('epoch'::timestamptz + ${cursor.createdUs.toString()}::int8 * interval '1 microsecond', ${cursor.id})`
    : sql.fragment``;

export const forUpdate = (lock: boolean): FragmentSqlToken => (lock ? sql.fragment`FOR UPDATE` : sql.fragment``);
