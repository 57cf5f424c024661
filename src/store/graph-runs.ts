/**
 * SQL for the graph engine's runs (aiflow_graph_run, migration 0012). Reads a caller reaches are
 * scoped to createdby = the caller and the run's tenant in the statement itself; the engine's writes
 * (src/engines/graph/engine.ts) run in one transaction per step, under the run row's lock.
 */
import { sql, type CommonQueryMethods } from "slonik";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import { ts } from "../db/values.js";
import { afterCursor, forUpdate, ownedBy, type Owner, type RunCursor } from "./owned-runs.js";
import type { GraphPlan } from "../engines/graph/plan.js";

export type GraphStatus = "running" | "completed" | "stopped" | "failed" | "cancelled";

export interface GraphRunRow {
  id: string;
  runId: string;
  tenantKey: string;
  definitionId: string;
  plan: GraphPlan;
  task: string;
  steps: number;
  /** The latest nodes walked, in order (at most --run-history-max: ../engines/run-history.ts). */
  path: string[];
  /** Nodes dropped from the front of `path`. */
  pathDropped: number;
  runCounts: Record<string, number>;
  state: Record<string, unknown>;
  status: GraphStatus;
  reason: string | null;
  error: string | null;
  workItemId: string | null;
  createdBy: string;
  createdOn: number;
  createdUs: bigint;
}

const row = z.object({
  id: z.string(),
  run_id: z.string(),
  tenant_key: z.string(),
  definition_id: z.string(),
  plan: z.string(),
  task: z.string().nullable(),
  steps: z.bigint().nullable(),
  path: z.string().nullable(),
  path_dropped: z.bigint(),
  run_counts: z.string().nullable(),
  state: z.string().nullable(),
  status: z.enum(["running", "completed", "stopped", "failed", "cancelled"]),
  reason: z.string().nullable(),
  error: z.string().nullable(),
  work_item_id: z.string().nullable(),
  createdby: z.string(),
  createdon: z.number(),
  created_us: z.bigint(),
});

const COLUMNS = sql.fragment`id, run_id, tenant_key, definition_id, plan::text AS plan, task, steps, path, path_dropped, run_counts, state, status, reason, error, work_item_id,
  createdby, createdon, (extract(epoch FROM createdon) * 1000000)::int8 AS created_us`;

const toRow = (r: z.infer<typeof row>): GraphRunRow => ({
  id: r.id,
  runId: r.run_id,
  tenantKey: r.tenant_key,
  definitionId: r.definition_id,
  plan: JSON.parse(r.plan) as GraphPlan,
  task: r.task ?? "",
  steps: Number(r.steps ?? 0n),
  path: r.path === null ? [] : (JSON.parse(r.path) as string[]),
  pathDropped: Number(r.path_dropped),
  runCounts: r.run_counts === null ? {} : (JSON.parse(r.run_counts) as Record<string, number>),
  state: r.state === null ? {} : (JSON.parse(r.state) as Record<string, unknown>),
  status: r.status,
  reason: r.reason,
  error: r.error,
  workItemId: r.work_item_id,
  createdBy: r.createdby,
  createdOn: r.createdon,
  createdUs: r.created_us,
});

export class GraphRunStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  async insert(r: GraphRunRow, nowMs: number): Promise<void> {
    const runs = this.t.id("graph_run");
    await withDbErrors(() =>
      this.db.query(sql.unsafe`
        INSERT INTO ${runs} (id, run_id, tenant_key, definition_id, plan, task, steps, path, path_dropped, run_counts, state, status, reason, error,
                             work_item_id, createdby, createdon, updatedby, updatedon)
        VALUES (${r.id}, ${r.runId}, ${r.tenantKey}, ${r.definitionId}, ${JSON.stringify(r.plan)}::jsonb, ${r.task}, ${r.steps}, ${JSON.stringify(r.path)},
                ${r.pathDropped}, ${JSON.stringify(r.runCounts)}, ${JSON.stringify(r.state)}, ${r.status}, ${r.reason}, ${r.error}, ${r.workItemId},
                ${r.createdBy}, ${ts(nowMs)}, ${r.createdBy}, ${ts(nowMs)})`),
    );
  }

  /** Writes what a step changes (everything but the run's identity and plan). */
  async save(r: GraphRunRow, by: string, nowMs: number): Promise<void> {
    const runs = this.t.id("graph_run");
    await withDbErrors(() =>
      this.db.query(sql.unsafe`
        UPDATE ${runs} SET task = ${r.task}, steps = ${r.steps}, path = ${JSON.stringify(r.path)}, path_dropped = ${r.pathDropped}, run_counts = ${JSON.stringify(r.runCounts)},
               state = ${JSON.stringify(r.state)}, status = ${r.status}, reason = ${r.reason}, error = ${r.error}, work_item_id = ${r.workItemId},
               updatedby = ${by}, updatedon = ${ts(nowMs)}
         WHERE run_id = ${r.runId}`),
    );
  }

  /** The caller's run in the tenant (scope), or any run (null); with `lock`, FOR UPDATE. */
  async get(runId: string, scope: Owner | null, lock = false): Promise<GraphRunRow | null> {
    const runs = this.t.id("graph_run");
    const r = await withDbErrors(() =>
      this.db.maybeOne(sql.type(row)`SELECT ${COLUMNS} FROM ${runs} WHERE run_id = ${runId} ${ownedBy(scope)} ${forUpdate(lock)}`),
    );
    return r && toRow(r);
  }

  /** The caller's runs of the tenant after `cursor`, newest first. */
  async list(scope: Owner, cursor: RunCursor | null, limit: number): Promise<readonly GraphRunRow[]> {
    const runs = this.t.id("graph_run");
    const rows = await withDbErrors(() =>
      this.db.any(
        sql.type(row)`SELECT ${COLUMNS} FROM ${runs} WHERE true ${ownedBy(scope)} ${afterCursor(cursor)} ORDER BY createdon DESC, id DESC LIMIT ${limit}`,
      ),
    );
    return rows.map(toRow);
  }
}
