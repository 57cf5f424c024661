/**
 * SQL for aiflow_trigger_firing, all of it. The table is append-only: this store can insert a firing,
 * read it back qualified by tenant, list them, and run the retention sweep. There is no update, and
 * the sweep is the only delete (payloads carry whatever their senders put in them, secrets included).
 */
import { sql, type CommonQueryMethods } from "slonik";
import { ts } from "../db/values.js";
import { ulid } from "ulid";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import { budgeted, cutPage, pageSizes, type Page } from "./paging.js";

const firingRow = z.object({
  id: z.string(),
  tenant_key: z.string(),
  trigger_name: z.string(),
  // Plain strings rather than enums: a row written by another writer must still be readable.
  trigger_type: z.string().nullable(),
  payload: z.string().nullable(),
  action: z.string().nullable(),
  definition_id: z.string().nullable(),
  event: z.string().nullable(),
  run_id: z.string().nullable(),
  outcome: z.string().nullable(),
  error: z.string().nullable(),
  /** Epoch ns, the source's time. */
  fired_on: z.bigint().nullable(),
  createdby: z.string(),
  /** Epoch ms. */
  createdon: z.number(),
});
export type FiringRow = z.infer<typeof firingRow>;

export type TriggerType = "webhook" | "cron" | "gitpoll" | "filesystem";
export type FiringAction = "start" | "signal";
export type FiringOutcome = "started" | "signalled" | "refused" | "failed";

export interface FiringInput {
  tenantKey: string;
  triggerName: string;
  triggerType: TriggerType | null;
  /** JSON text exactly as it arrived. */
  payload: string | null;
  action: FiringAction | null;
  definitionId: string | null;
  event: string | null;
  runId: string | null;
  outcome: FiringOutcome;
  error: string | null;
  /** Epoch ns. */
  firedOn: bigint | null;
}

export interface FiringFilter {
  triggerName?: string;
  runId?: string;
  /** Any of these; undefined or empty: all. */
  outcomes?: readonly string[];
}

/** Position after the last row of a page: (fired_on, id) of that row. */
export interface FiringCursor {
  firedOn: bigint | null;
  id: string;
}

const COLUMNS = sql.fragment`id, tenant_key, trigger_name, trigger_type, payload, action, definition_id, event, run_id, outcome, error, fired_on, createdby, createdon`;

export class TriggerFiringStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /** Appends one firing; every call is a new row with a new id (`id`, or one made now). */
  insert(f: FiringInput, nowMs: number, by: string, id: string = ulid(nowMs)): Promise<FiringRow> {
    const firing = this.t.id("trigger_firing");
    const firedOn = f.firedOn === null ? null : f.firedOn.toString();
    return withDbErrors(() =>
      this.db.one(sql.type(firingRow)`
        INSERT INTO ${firing} (id, tenant_key, trigger_name, trigger_type, payload, action, definition_id, event, run_id, outcome, error,
                               fired_on, createdby, createdon)
        VALUES (${id}, ${f.tenantKey}, ${f.triggerName}, ${f.triggerType}, ${f.payload}, ${f.action}, ${f.definitionId}, ${f.event},
                ${f.runId}, ${f.outcome}, ${f.error}, ${firedOn}::int8, ${by}, ${ts(nowMs)})
        RETURNING ${COLUMNS}`),
    );
  }

  /** One firing of one tenant, or null: an id alone never reads another tenant's row. */
  get(tenantKey: string, id: string): Promise<FiringRow | null> {
    const firing = this.t.id("trigger_firing");
    return withDbErrors(() => this.db.maybeOne(sql.type(firingRow)`SELECT ${COLUMNS} FROM ${firing} WHERE tenant_key = ${tenantKey} AND id = ${id}`));
  }

  /**
   * Up to `limit` firings of a tenant after `cursor` and within `maxBytes` of payloads
   * (./paging.ts), fired_on desc then id desc, firings with no
   * fired_on after all the others. Two branches so each can walk an index in its own order: the dated
   * firings by (tenant_key, fired_on DESC, id DESC), then the undated ones by id.
   */
  list(tenantKey: string, filter: FiringFilter, cursor: FiringCursor | null, limit: number, maxBytes: number): Promise<Page<FiringRow>> {
    const firing = this.t.id("trigger_firing");
    const common = [sql.fragment`tenant_key = ${tenantKey}`];
    if (filter.triggerName !== undefined) common.push(sql.fragment`trigger_name = ${filter.triggerName}`);
    if (filter.runId !== undefined) common.push(sql.fragment`run_id = ${filter.runId}`);
    if (filter.outcomes && filter.outcomes.length > 0) common.push(sql.fragment`outcome = ANY(${sql.array([...filter.outcomes], "text")})`);

    const dated = [...common, sql.fragment`fired_on IS NOT NULL`];
    const undated = [...common, sql.fragment`fired_on IS NULL`];
    if (cursor && cursor.firedOn !== null) dated.push(sql.fragment`(fired_on, id) < (${cursor.firedOn.toString()}::int8, ${cursor.id})`);
    if (cursor && cursor.firedOn === null) {
      dated.push(sql.fragment`false`);
      undated.push(sql.fragment`id < ${cursor.id}`);
    }
    const and = sql.fragment` AND `;
    const rows = limit + 1;
    const order = sql.fragment`fired_on DESC NULLS LAST, id DESC`;
    const inner = sql.fragment`
        SELECT ${COLUMNS} FROM (
          (SELECT ${COLUMNS} FROM ${firing} WHERE ${sql.join(dated, and)} ORDER BY fired_on DESC, id DESC LIMIT ${rows})
          UNION ALL
          (SELECT ${COLUMNS} FROM ${firing} WHERE ${sql.join(undated, and)} ORDER BY id DESC LIMIT ${rows})
        ) AS f
        ORDER BY ${order}
        LIMIT ${rows}`;
    const size = sql.fragment`coalesce(octet_length(payload), 0)`;
    return withDbErrors(async () =>
      cutPage(await this.db.any(sql.type(firingRow.merge(pageSizes))`${budgeted(inner, order, size, maxBytes)}`), limit, maxBytes),
    );
  }

  /**
   * The retention sweep: deletes firings the daemon recorded before `cutoffMs` (by createdon, the
   * daemon's own clock, so a source clock that is skewed or reports an old event time can neither
   * keep a payload forever nor have it deleted on arrival). Deletes in batches of short statements;
   * SKIP LOCKED lets every daemon instance sweep at once without waiting on each other.
   * Returns how many rows were deleted.
   */
  async sweep(cutoffMs: number, batch = 5_000): Promise<number> {
    const firing = this.t.id("trigger_firing");
    let total = 0;
    for (;;) {
      const res = await withDbErrors(() =>
        this.db.query(sql.unsafe`
          DELETE FROM ${firing}
           WHERE id IN (SELECT id FROM ${firing} WHERE createdon < ${ts(cutoffMs)} LIMIT ${batch} FOR UPDATE SKIP LOCKED)`),
      );
      total += res.rowCount;
      if (res.rowCount < batch) return total;
    }
  }
}
