/**
 * SQL for aiflow_engine_run, all of it: the directory over every engine's runs. One row per
 * (tenant, run), no run state. Recording is one upsert that merges:
 *
 *  - a fact the write lacks (null) never erases a stored one, and a fact the row lacks is filled in
 *    by whichever write carries it, so an engine's save and a trigger's cause can arrive in either order;
 *  - ended_on: the first non-null value wins, later ones are ignored;
 *  - engine_kind, definition_id, parent_run_id, triggered_by, trigger_firing_id: a write that carries a
 *    value different from the stored one is refused as a whole (the upsert's WHERE lets no such update
 *    through), and the caller is told which facts disagree. Facts only ever go from null to a value and
 *    never change after that, so the read that names the disagreement cannot race the upsert into a
 *    wrong answer.
 *
 * There is no delete. Times come from the caller's clock. The merge trusts its writer: who may write
 * which run through RecordRun, and what such a write must satisfy, is ../rpc/run-writers.ts's.
 */
import { sql, type CommonQueryMethods } from "slonik";
import { ts } from "../db/values.js";
import { ulid } from "ulid";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { TableName, Tables } from "../db/tables.js";

const runRow = z.object({
  id: z.string(),
  tenant_key: z.string(),
  run_id: z.string(),
  engine_kind: z.string(),
  definition_id: z.string().nullable(),
  parent_run_id: z.string().nullable(),
  triggered_by: z.string().nullable(),
  trigger_firing_id: z.string().nullable(),
  /** Epoch ns. */
  ended_on: z.bigint().nullable(),
  createdby: z.string(),
  /** Epoch ms. */
  createdon: z.number(),
  updatedby: z.string().nullable(),
  updatedon: z.number().nullable(),
  /** createdon in epoch microseconds, exact: the paging cursor. */
  created_us: z.bigint(),
});
export type EngineRunRow = z.infer<typeof runRow>;

/** One write's facts. null: this write does not know. */
export interface RunFacts {
  tenantKey: string;
  runId: string;
  engineKind: string;
  definitionId: string | null;
  parentRunId: string | null;
  triggeredBy: string | null;
  triggerFiringId: string | null;
  /** Epoch ns. */
  endedOn: bigint | null;
}

/** The facts that may be set once and then never change (ended_on is first-write-wins instead). */
export const FIXED_FACTS = ["engine_kind", "definition_id", "parent_run_id", "triggered_by", "trigger_firing_id"] as const;
export type FixedFact = (typeof FIXED_FACTS)[number];

export type RecordRunResult =
  | { kind: "recorded"; row: EngineRunRow; created: boolean }
  /** Nothing was written: the stored row disagrees with the write on these facts. */
  | { kind: "conflict"; row: EngineRunRow; fields: { field: FixedFact; stored: string; given: string }[] };

export interface RunFilter {
  engineKind?: string;
  triggeredBy?: string;
  parentRunId?: string;
  state?: "live" | "ended";
}

/** Position after the last row of a page: (createdon, id) of that row. */
export interface RunCursor {
  createdUs: bigint;
  id: string;
}

const COLUMNS = sql.fragment`id, tenant_key, run_id, engine_kind, definition_id, parent_run_id, triggered_by, trigger_firing_id, ended_on,
  createdby, createdon, updatedby, updatedon, (extract(epoch FROM createdon) * 1000000)::int8 AS created_us`;

const recorded = runRow.extend({ created: z.boolean() });

export class EngineRunStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /**
   * An engine's own record of its run, on the save of its state: as `record`, but a disagreement is
   * a bug in the engine (it wrote the stored facts itself), so it throws and the save rolls back.
   */
  async recordOwn(f: RunFacts, nowMs: number, by: string): Promise<void> {
    const res = await this.record(f, nowMs, by);
    if (res.kind === "conflict")
      throw new Error(`the directory row of run '${f.runId}' disagrees with the engine on ${res.fields.map((x) => x.field).join(", ")}`);
  }

  /** The merge described above, as one statement; on disagreement, a read of the row that refused it. */
  async record(f: RunFacts, nowMs: number, by: string): Promise<RecordRunResult> {
    const run = this.t.id("engine_run");
    const endedOn = f.endedOn === null ? null : f.endedOn.toString();
    const row = await withDbErrors(() =>
      this.db.maybeOne(sql.type(recorded)`
        INSERT INTO ${run} AS r (id, tenant_key, run_id, engine_kind, definition_id, parent_run_id, triggered_by, trigger_firing_id,
                                 ended_on, createdby, createdon, updatedby, updatedon)
        VALUES (${ulid(nowMs)}, ${f.tenantKey}, ${f.runId}, ${f.engineKind}, ${f.definitionId}, ${f.parentRunId}, ${f.triggeredBy},
                ${f.triggerFiringId}, ${endedOn}::int8, ${by}, ${ts(nowMs)}, ${by}, ${ts(nowMs)})
        ON CONFLICT (tenant_key, run_id) DO UPDATE SET
          definition_id     = COALESCE(r.definition_id, EXCLUDED.definition_id),
          parent_run_id     = COALESCE(r.parent_run_id, EXCLUDED.parent_run_id),
          triggered_by      = COALESCE(r.triggered_by, EXCLUDED.triggered_by),
          trigger_firing_id = COALESCE(r.trigger_firing_id, EXCLUDED.trigger_firing_id),
          ended_on          = COALESCE(r.ended_on, EXCLUDED.ended_on),
          updatedby         = EXCLUDED.updatedby,
          updatedon         = EXCLUDED.updatedon
        WHERE r.engine_kind = EXCLUDED.engine_kind
          AND COALESCE(r.definition_id = EXCLUDED.definition_id, true)
          AND COALESCE(r.parent_run_id = EXCLUDED.parent_run_id, true)
          AND COALESCE(r.triggered_by = EXCLUDED.triggered_by, true)
          AND COALESCE(r.trigger_firing_id = EXCLUDED.trigger_firing_id, true)
        RETURNING ${COLUMNS}, (xmax = 0) AS created`),
    );
    if (row) {
      const { created, ...rest } = row;
      return { kind: "recorded", row: rest, created };
    }
    const current = await this.get(f.tenantKey, f.runId);
    if (!current) throw new Error(`engine_run (${f.tenantKey}, ${f.runId}) refused an upsert but does not exist`);
    const given: Record<FixedFact, string | null> = {
      engine_kind: f.engineKind,
      definition_id: f.definitionId,
      parent_run_id: f.parentRunId,
      triggered_by: f.triggeredBy,
      trigger_firing_id: f.triggerFiringId,
    };
    const fields = FIXED_FACTS.flatMap((field) => {
      const stored = current[field];
      const g = given[field];
      return stored !== null && g !== null && stored !== g ? [{ field, stored, given: g }] : [];
    });
    if (fields.length === 0) throw new Error(`engine_run (${f.tenantKey}, ${f.runId}) refused an upsert with no disagreeing fact`);
    return { kind: "conflict", row: current, fields };
  }

  /**
   * A run that was ended lives again (a resumed DAG run): ended_on goes back to null, written by the
   * engine that owns the run on the save that resumes it. The first end after that wins as before.
   */
  async reopen(tenantKey: string, runId: string, by: string, nowMs: number): Promise<void> {
    const run = this.t.id("engine_run");
    await withDbErrors(() =>
      this.db.query(
        sql.unsafe`UPDATE ${run} SET ended_on = NULL, updatedby = ${by}, updatedon = ${ts(nowMs)} WHERE tenant_key = ${tenantKey} AND run_id = ${runId}`,
      ),
    );
  }

  /**
   * The engine table holding the run's own state, resolved from its id in the entity reference's
   * order: the DAG engine's run (aiflow_run.id), then aiflow_graph_run.run_id, then
   * aiflow_machine_run.run_id; null when none holds a run of that tenant by that id.
   */
  async engineTable(tenantKey: string, runId: string): Promise<TableName | null> {
    const [dag, graph, machine] = [this.t.id("run"), this.t.id("graph_run"), this.t.id("machine_run")];
    const found = await withDbErrors(() =>
      this.db.oneFirst(sql.type(z.object({ t: z.string() }))`
        SELECT CASE
          WHEN EXISTS (SELECT 1 FROM ${dag} WHERE id = ${runId} AND metadata ->> 'tenantKey' = ${tenantKey}) THEN 'run'
          WHEN EXISTS (SELECT 1 FROM ${graph} WHERE run_id = ${runId} AND tenant_key = ${tenantKey}) THEN 'graph_run'
          WHEN EXISTS (SELECT 1 FROM ${machine} WHERE run_id = ${runId} AND tenant_key = ${tenantKey}) THEN 'machine_run'
          ELSE '' END AS t`),
    );
    return found === "" ? null : (found as TableName);
  }

  /** One run of one tenant, or null. */
  get(tenantKey: string, runId: string): Promise<EngineRunRow | null> {
    const run = this.t.id("engine_run");
    return withDbErrors(() => this.db.maybeOne(sql.type(runRow)`SELECT ${COLUMNS} FROM ${run} WHERE tenant_key = ${tenantKey} AND run_id = ${runId}`));
  }

  /** Up to `limit` runs of a tenant after `cursor`, newest first (createdon desc, id desc). */
  list(tenantKey: string, filter: RunFilter, cursor: RunCursor | null, limit: number): Promise<readonly EngineRunRow[]> {
    const run = this.t.id("engine_run");
    const where = [sql.fragment`tenant_key = ${tenantKey}`];
    if (filter.engineKind !== undefined) where.push(sql.fragment`engine_kind = ${filter.engineKind}`);
    if (filter.triggeredBy !== undefined) where.push(sql.fragment`triggered_by = ${filter.triggeredBy}`);
    if (filter.parentRunId !== undefined) where.push(sql.fragment`parent_run_id = ${filter.parentRunId}`);
    if (filter.state === "live") where.push(sql.fragment`ended_on IS NULL`);
    if (filter.state === "ended") where.push(sql.fragment`ended_on IS NOT NULL`);
    if (cursor)
      where.push(sql.fragment`(createdon, id) < ('epoch'::timestamptz + ${cursor.createdUs.toString()}::int8 * interval '1 microsecond', ${cursor.id})`);
    return withDbErrors(() =>
      this.db.any(sql.type(runRow)`
        SELECT ${COLUMNS} FROM ${run}
         WHERE ${sql.join(where, sql.fragment` AND `)}
         ORDER BY createdon DESC, id DESC
         LIMIT ${limit}`),
    );
  }
}
