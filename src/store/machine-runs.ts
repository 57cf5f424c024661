/**
 * SQL for the state-machine engine's runs (aiflow_machine_run, migration 0012). Reads a caller
 * reaches are scoped to createdby = the caller and the run's tenant in the statement itself; every
 * change (an event, an action's outcome, a cancel) is one transaction under the run row's lock.
 */
import { sql, type CommonQueryMethods } from "slonik";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import { ts } from "../db/values.js";
import { afterCursor, forUpdate, ownedBy, type Owner, type RunCursor } from "./owned-runs.js";
import type { MachinePlan } from "../engines/machine/plan.js";

/** The transition under way while the machine is suspended. */
export interface Pending {
  from: string;
  event: string;
  to: string;
}

export interface MachineRunRow {
  id: string;
  runId: string;
  tenantKey: string;
  definitionId: string;
  plan: MachinePlan;
  state: string;
  context: Record<string, unknown>;
  /** The latest states visited, in order (at most --run-history-max: ../engines/run-history.ts). */
  history: string[];
  /** States dropped from the front of `history`. */
  historyDropped: number;
  live: boolean;
  suspended: boolean;
  failure: string | null;
  reason: string | null;
  pending: Pending | null;
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
  state: z.string().nullable(),
  context: z.string().nullable(),
  history: z.string().nullable(),
  history_dropped: z.bigint(),
  live: z.boolean().nullable(),
  suspended: z.boolean().nullable(),
  failure: z.string().nullable(),
  reason: z.string().nullable(),
  pending: z.string().nullable(),
  work_item_id: z.string().nullable(),
  createdby: z.string(),
  createdon: z.number(),
  created_us: z.bigint(),
});

const COLUMNS = sql.fragment`id, run_id, tenant_key, definition_id, plan::text AS plan, state, context, history, history_dropped, live, suspended, failure, reason, pending::text AS pending,
  work_item_id, createdby, createdon, (extract(epoch FROM createdon) * 1000000)::int8 AS created_us`;

const toRow = (r: z.infer<typeof row>): MachineRunRow => ({
  id: r.id,
  runId: r.run_id,
  tenantKey: r.tenant_key,
  definitionId: r.definition_id,
  plan: JSON.parse(r.plan) as MachinePlan,
  state: r.state ?? "",
  context: r.context === null ? {} : (JSON.parse(r.context) as Record<string, unknown>),
  history: r.history === null ? [] : (JSON.parse(r.history) as string[]),
  historyDropped: Number(r.history_dropped),
  live: r.live ?? false,
  suspended: r.suspended ?? false,
  failure: r.failure,
  reason: r.reason,
  pending: r.pending === null ? null : (JSON.parse(r.pending) as Pending),
  workItemId: r.work_item_id,
  createdBy: r.createdby,
  createdOn: r.createdon,
  createdUs: r.created_us,
});

export class MachineRunStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  async insert(r: MachineRunRow, nowMs: number): Promise<void> {
    const runs = this.t.id("machine_run");
    await withDbErrors(() =>
      this.db.query(sql.unsafe`
        INSERT INTO ${runs} (id, run_id, tenant_key, definition_id, plan, state, context, history, history_dropped, live, suspended, failure, reason, pending,
                             work_item_id, createdby, createdon, updatedby, updatedon)
        VALUES (${r.id}, ${r.runId}, ${r.tenantKey}, ${r.definitionId}, ${JSON.stringify(r.plan)}::jsonb, ${r.state}, ${JSON.stringify(r.context)},
                ${JSON.stringify(r.history)}, ${r.historyDropped}, ${r.live}, ${r.suspended}, ${r.failure}, ${r.reason}, ${r.pending === null ? null : JSON.stringify(r.pending)}::jsonb,
                ${r.workItemId}, ${r.createdBy}, ${ts(nowMs)}, ${r.createdBy}, ${ts(nowMs)})`),
    );
  }

  /** Writes what a change changes (everything but the run's identity and plan). */
  async save(r: MachineRunRow, by: string, nowMs: number): Promise<void> {
    const runs = this.t.id("machine_run");
    await withDbErrors(() =>
      this.db.query(sql.unsafe`
        UPDATE ${runs} SET state = ${r.state}, context = ${JSON.stringify(r.context)}, history = ${JSON.stringify(r.history)}, history_dropped = ${r.historyDropped}, live = ${r.live},
               suspended = ${r.suspended}, failure = ${r.failure}, reason = ${r.reason}, pending = ${r.pending === null ? null : JSON.stringify(r.pending)}::jsonb,
               work_item_id = ${r.workItemId}, updatedby = ${by}, updatedon = ${ts(nowMs)}
         WHERE run_id = ${r.runId}`),
    );
  }

  /** The caller's run in the tenant (scope), or any run (null); with `lock`, FOR UPDATE. */
  async get(runId: string, scope: Owner | null, lock = false): Promise<MachineRunRow | null> {
    const runs = this.t.id("machine_run");
    const r = await withDbErrors(() =>
      this.db.maybeOne(sql.type(row)`SELECT ${COLUMNS} FROM ${runs} WHERE run_id = ${runId} ${ownedBy(scope)} ${forUpdate(lock)}`),
    );
    return r && toRow(r);
  }

  /** The caller's runs of the tenant after `cursor`, newest first. */
  async list(scope: Owner, cursor: RunCursor | null, limit: number): Promise<readonly MachineRunRow[]> {
    const runs = this.t.id("machine_run");
    const rows = await withDbErrors(() =>
      this.db.any(
        sql.type(row)`SELECT ${COLUMNS} FROM ${runs} WHERE true ${ownedBy(scope)} ${afterCursor(cursor)} ORDER BY createdon DESC, id DESC LIMIT ${limit}`,
      ),
    );
    return rows.map(toRow);
  }
}
