/**
 * The writes a producer or an operator asks for by name: cancel unfinished items, and redrive dead
 * letters. Each locks the rows it changes in the statement that changes them, and reports what a
 * holder of a cancelled item had, so its agent can be told.
 */
import { sql } from "slonik";
import { msToNs } from "../../clock.js";
import { withDbErrors } from "../../db/errors.js";
import { ts } from "../../db/values.js";
import { FREED_TENANT, idRow, requeuedRow, type Requeued } from "./columns.js";
import type { ItemsContext } from "./context.js";

/** Cancels unfinished items (by ids, a run, or parents with their children) of one tenant. */
export function cancel(
  q: ItemsContext,
  tenant: string,
  target: { ids: string[]; runId: string | null; parentIds: string[] },
  reason: string,
  nowMs: number,
  by: string,
): Promise<readonly Requeued[]> {
  const w = q.t.id("work_item");
  const runClause = target.runId ? sql.fragment`OR run_id = ${target.runId}` : sql.fragment``;
  return withDbErrors(() =>
    q.db.any(sql.type(requeuedRow)`
        WITH doomed AS (
          SELECT id, agent_id, lease_token, status, dispatched_at FROM ${w}
           WHERE tenant_key = ${tenant} AND status IN ('pending', 'dispatched')
             AND (id = ANY(${sql.array(target.ids, "text")})
                  OR id = ANY(${sql.array(target.parentIds, "text")})
                  OR parent_work_item_id = ANY(${sql.array(target.parentIds, "text")})
                  ${runClause})
           ORDER BY id
           FOR UPDATE
        )
        UPDATE ${w} w SET status = 'cancelled', completed_at = ${msToNs(nowMs)}, error = ${reason}, lease_expires_at = NULL, lease_token = NULL,
                          updatedby = ${by}, updatedon = ${ts(nowMs)}
          FROM doomed
         WHERE w.id = doomed.id
        RETURNING w.id, w.status, CASE WHEN doomed.status = 'dispatched' THEN doomed.agent_id END AS agent, doomed.lease_token AS token, w.engine_kind,
                  CASE WHEN doomed.status = 'dispatched' THEN ((${msToNs(nowMs)}::bigint - doomed.dispatched_at) / 1e9)::float8 END AS run_s,
                  CASE WHEN doomed.status = 'dispatched' THEN ${FREED_TENANT} END AS freed`),
  );
}

/** Dead letters back to pending with a fresh retry budget. */
export function redrive(
  q: ItemsContext,
  tenant: string | null,
  target: { ids: string[]; runId: string | null; all: boolean },
  nowMs: number,
  by: string,
): Promise<readonly string[]> {
  const w = q.t.id("work_item");
  const tenantClause = tenant ? sql.fragment`AND tenant_key = ${tenant}` : sql.fragment``;
  const which = target.all
    ? sql.fragment`true`
    : sql.fragment`(id = ANY(${sql.array(target.ids, "text")}) ${target.runId ? sql.fragment`OR run_id = ${target.runId}` : sql.fragment``})`;
  return withDbErrors(() =>
    q.db.anyFirst(sql.type(idRow)`
        UPDATE ${w} SET status = 'pending', retry_count = 0, redelivery_count = 0, next_attempt_at = ${msToNs(nowMs)}, completed_at = NULL, agent_id = NULL,
                        updatedby = ${by}, updatedon = ${ts(nowMs)}
         WHERE status = 'failed' ${tenantClause} AND ${which}
        RETURNING id`),
  );
}
