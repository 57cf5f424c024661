/**
 * SQL for the DAG engine's tables: aiflow_run, aiflow_task and aiflow_checkpoint (migration 0010;
 * its definitions and events are in the engines' shared tables, ./engine-definitions.ts and
 * ./engine-events.ts). Every read a caller reaches is scoped to
 * createdby = the caller and the run's tenant, in the statement itself. The engine's writes
 * (src/engines/dag/engine.ts) run in one transaction per step of a run, under the run row's lock.
 *
 * JSON columns are written from JSON text and read back as text; times are epoch ns (bigint)
 * except the common columns (timestamptz, from the caller's clock).
 */
import { sql, type CommonQueryMethods } from "slonik";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import { ts } from "../db/values.js";
import type { NodeRec, RunMeta, RunStateEntry, TaskMeta, TaskStateEntry } from "../engines/dag/model.js";
import type { Plan } from "../engines/dag/plan.js";

/** The parts of a run's row a step changed (dag/step.ts's Step.changes), which saveRun writes and nothing else. */
export interface RunChanges {
  context: Record<string, unknown>;
  nodes: Record<string, NodeRec>;
  workers: Record<string, string>;
}

const runRow = z.object({
  id: z.string(),
  definitionid: z.string(),
  context: z.string().nullable(),
  metadata: z.string(),
  states: z.string(),
  starttime: z.bigint().nullable(),
  endtime: z.bigint().nullable(),
  duration: z.bigint().nullable(),
  createdby: z.string(),
  createdon: z.number(),
  created_us: z.bigint(),
});
type RunRowRaw = z.infer<typeof runRow>;

export interface RunRow {
  id: string;
  definitionId: string;
  context: Record<string, unknown>;
  meta: RunMeta;
  states: RunStateEntry[];
  startNs: bigint | null;
  endNs: bigint | null;
  durationNs: bigint | null;
  createdBy: string;
  createdOn: number;
  createdUs: bigint;
}

const taskRow = z.object({
  id: z.string(),
  name: z.string(),
  workerid: z.string().nullable(),
  context: z.string().nullable(),
  metadata: z.string(),
  states: z.string(),
  starttime: z.bigint().nullable(),
  endtime: z.bigint().nullable(),
});

export interface TaskRow {
  id: string;
  name: string;
  worker: string | null;
  /** Its result as JSON text. */
  result: string | null;
  meta: TaskMeta;
  states: TaskStateEntry[];
  startNs: bigint | null;
  endNs: bigint | null;
}

export interface NewTask {
  id: string;
  name: string;
  meta: TaskMeta;
  state: TaskStateEntry;
  startNs: bigint;
}

export interface TaskEnd {
  id: string;
  worker: string | null;
  /** JSON text, or null. */
  result: string | null;
  /** Entries to append to its states (a run entry, then its end). */
  entries: TaskStateEntry[];
  endNs: bigint;
}

export interface CheckpointWrite {
  node: string;
  cursor: string;
  idx: number;
  total: number;
  done: boolean;
}

export interface RunListFilter {
  statuses?: string[];
  definitionId?: string;
}

// The plan is read apart (planOf): it never changes after the run starts, and the engine keeps it.
const RUN_COLUMNS = sql.fragment`id, definitionid, context::text AS context, (metadata - 'plan')::text AS metadata, states::text AS states, starttime, endtime, duration,
  createdby, createdon, (extract(epoch FROM createdon) * 1000000)::int8 AS created_us`;
const TASK_COLUMNS = sql.fragment`id, name, workerid, context::text AS context, metadata::text AS metadata, states::text AS states, starttime, endtime`;

const toRun = (r: RunRowRaw): RunRow => ({
  id: r.id,
  definitionId: r.definitionid,
  context: r.context === null ? {} : (JSON.parse(r.context) as Record<string, unknown>),
  // The plan is filled in by the engine (planOf, or its cache).
  meta: JSON.parse(r.metadata) as RunMeta,
  states: JSON.parse(r.states) as RunStateEntry[],
  startNs: r.starttime,
  endNs: r.endtime,
  durationNs: r.duration,
  createdBy: r.createdby,
  createdOn: r.createdon,
  createdUs: r.created_us,
});
const toTask = (r: z.infer<typeof taskRow>): TaskRow => ({
  id: r.id,
  name: r.name,
  worker: r.workerid,
  result: r.context,
  meta: JSON.parse(r.metadata) as TaskMeta,
  states: JSON.parse(r.states) as TaskStateEntry[],
  startNs: r.starttime,
  endNs: r.endtime,
});

export class DagRunStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /** A new run; with an idempotency key the caller used before in the tenant, nothing is written and null comes back. */
  async insertRun(r: {
    id: string;
    definitionId: string;
    context: Record<string, unknown>;
    meta: RunMeta;
    states: RunStateEntry[];
    startNs: bigint;
    by: string;
    nowMs: number;
  }): Promise<boolean> {
    const run = this.t.id("run");
    const row = await withDbErrors(() =>
      this.db.maybeOne(sql.type(z.object({ id: z.string() }))`
        INSERT INTO ${run} (id, definitionid, runtype, context, metadata, states, starttime, createdby, createdon, updatedby, updatedon)
        VALUES (${r.id}, ${r.definitionId}, 'dag', ${JSON.stringify(r.context)}::jsonb, ${JSON.stringify(r.meta)}::jsonb, ${JSON.stringify(r.states)}::jsonb,
                ${r.startNs.toString()}::int8, ${r.by}, ${ts(r.nowMs)}, ${r.by}, ${ts(r.nowMs)})
        ON CONFLICT (createdby, (metadata ->> 'tenantKey'), (metadata ->> 'idempotencyKey')) WHERE metadata ? 'idempotencyKey' DO NOTHING
        RETURNING id`),
    );
    return row !== null;
  }

  /** The caller's run of the idempotency key (a fresh snapshot: it may have been committed meanwhile). */
  async byIdempotencyKey(by: string, tenantKey: string, key: string): Promise<RunRow | null> {
    const run = this.t.id("run");
    const row = await withDbErrors(() =>
      this.db.maybeOne(
        sql.type(
          runRow,
        )`SELECT ${RUN_COLUMNS} FROM ${run} WHERE createdby = ${by} AND metadata ->> 'tenantKey' = ${tenantKey} AND metadata ->> 'idempotencyKey' = ${key} AND metadata ? 'idempotencyKey'`,
      ),
    );
    return row && toRun(row);
  }

  /** The caller's run in the tenant, or null: another caller's run reads as no run. With `lock`, FOR UPDATE. */
  async get(id: string, scope: { by: string; tenantKey: string } | null, lock = false): Promise<RunRow | null> {
    const run = this.t.id("run");
    const where = scope ? sql.fragment`AND createdby = ${scope.by} AND metadata ->> 'tenantKey' = ${scope.tenantKey}` : sql.fragment``;
    const row = await withDbErrors(() =>
      this.db.maybeOne(sql.type(runRow)`SELECT ${RUN_COLUMNS} FROM ${run} WHERE id = ${id} ${where} ${lock ? sql.fragment`FOR UPDATE` : sql.fragment``}`),
    );
    return row && toRun(row);
  }

  /** A run's plan (its definition as validated at start), or null when there is no such run. */
  async planOf(runId: string): Promise<Plan | null> {
    const run = this.t.id("run");
    const text = await withDbErrors(() =>
      this.db.maybeOneFirst(sql.type(z.object({ p: z.string() }))`SELECT (metadata -> 'plan')::text AS p FROM ${run} WHERE id = ${runId}`),
    );
    return text === null ? null : (JSON.parse(text) as Plan);
  }

  /**
   * Writes back what a step changed: the context keys and node states it set merged into the
   * stored ones (the plan and the rest stay as stored), the rest of the metadata that may change,
   * the states and the times (the run's transaction tells watchers at commit).
   */
  async saveRun(r: RunRow, changes: RunChanges, by: string, nowMs: number): Promise<void> {
    const run = this.t.id("run");
    const opt = (v: bigint | null) => (v === null ? null : v.toString());
    const rest = { pendingEvents: r.meta.pendingEvents, reason: r.meta.reason ?? null };
    await withDbErrors(() =>
      this.db.query(sql.unsafe`
        UPDATE ${run} SET context = COALESCE(context, '{}'::jsonb) || ${JSON.stringify(changes.context)}::jsonb,
               metadata = metadata || ${JSON.stringify(rest)}::jsonb
                          || jsonb_build_object('nodes', (metadata -> 'nodes') || ${JSON.stringify(changes.nodes)}::jsonb,
                                                'workers', COALESCE(metadata -> 'workers', '{}'::jsonb) || ${JSON.stringify(changes.workers)}::jsonb),
               states = ${JSON.stringify(r.states)}::jsonb,
               starttime = ${opt(r.startNs)}::int8, endtime = ${opt(r.endNs)}::int8, duration = ${opt(r.durationNs)}::int8,
               updatedby = ${by}, updatedon = ${ts(nowMs)}
         WHERE id = ${r.id}`),
    );
  }

  /**
   * Inserts attempts. `owner` is the run's caller (aiflow_run.createdby), whoever writes them: reads
   * are scoped by createdby = caller, and an attempt the daemon queues as the run advances (by `by`,
   * its engine) is still the caller's. `by` is the writer, in updatedby.
   */
  async insertTasks(runId: string, definitionId: string, tasks: readonly NewTask[], owner: string, by: string, nowMs: number): Promise<void> {
    if (tasks.length === 0) return;
    const task = this.t.id("task");
    const col = <T>(f: (t: NewTask) => T) => tasks.map(f);
    await withDbErrors(() =>
      this.db.query(sql.unsafe`
        INSERT INTO ${task} (id, name, definitionid, runid, metadata, states, starttime, createdby, createdon, updatedby, updatedon)
        SELECT v.id, v.name, ${definitionId}, ${runId}, v.meta::jsonb, jsonb_build_array(v.st::jsonb), v.st_ns, ${owner}, ${ts(nowMs)}, ${by}, ${ts(nowMs)}
          FROM unnest(${sql.array(
            col((t) => t.id),
            "text",
          )}, ${sql.array(
            col((t) => t.name),
            "text",
          )}, ${sql.array(
            col((t) => JSON.stringify(t.meta)),
            "text",
          )},
                      ${sql.array(
                        col((t) => JSON.stringify(t.state)),
                        "text",
                      )}, ${sql.array(
                        col((t) => t.startNs.toString()),
                        "int8",
                      )}) AS v(id, name, meta, st, st_ns)`),
    );
  }

  /** Ends attempts: their worker, result and end time, their states extended. */
  async endTasks(ends: readonly TaskEnd[], by: string, nowMs: number): Promise<void> {
    if (ends.length === 0) return;
    const task = this.t.id("task");
    const col = <T>(f: (t: TaskEnd) => T) => ends.map(f);
    await withDbErrors(() =>
      this.db.query(sql.unsafe`
        UPDATE ${task} t SET workerid = COALESCE(v.worker, t.workerid), context = COALESCE(v.result::jsonb, t.context), states = t.states || v.entries::jsonb,
               endtime = v.end_ns, duration = v.end_ns - t.starttime, updatedby = ${by}, updatedon = ${ts(nowMs)}
          FROM unnest(${sql.array(
            col((t) => t.id),
            "text",
          )}, ${sql.array(
            col((t) => t.worker),
            "text",
          )}, ${sql.array(
            col((t) => t.result),
            "text",
          )},
                      ${sql.array(
                        col((t) => JSON.stringify(t.entries)),
                        "text",
                      )}, ${sql.array(
                        col((t) => t.endNs.toString()),
                        "int8",
                      )}) AS v(id, worker, result, entries, end_ns)
         WHERE t.id = v.id`),
    );
  }

  async tasksByIds(ids: readonly string[]): Promise<readonly TaskRow[]> {
    if (ids.length === 0) return [];
    const task = this.t.id("task");
    const rows = await withDbErrors(() =>
      this.db.any(sql.type(taskRow)`SELECT ${TASK_COLUMNS} FROM ${task} WHERE id = ANY(${sql.array(ids as string[], "text")})`),
    );
    return rows.map(toTask);
  }

  /** Every attempt of a run, oldest first. */
  async tasksOfRun(runId: string): Promise<readonly TaskRow[]> {
    const task = this.t.id("task");
    const rows = await withDbErrors(() => this.db.any(sql.type(taskRow)`SELECT ${TASK_COLUMNS} FROM ${task} WHERE runid = ${runId} ORDER BY id`));
    return rows.map(toTask);
  }

  /** A fan-out node's completed iterations' results by index (JSON text). */
  async iterationResults(runId: string, node: string): Promise<Map<number, string | null>> {
    const task = this.t.id("task");
    const rows = await withDbErrors(() =>
      this.db.any(sql.type(z.object({ i: z.number(), r: z.string().nullable() }))`
        SELECT (metadata ->> 'iteration')::int AS i, context::text AS r FROM ${task}
         WHERE runid = ${runId} AND metadata ->> 'node' = ${node} AND states -> -1 ->> 'state' = 'completed'`),
    );
    return new Map(rows.map((r) => [r.i, r.r]));
  }

  /** A node's attempts not ended yet (iterations in flight), by iteration index. */
  async liveIterations(runId: string, node: string): Promise<Set<number>> {
    const task = this.t.id("task");
    const rows = await withDbErrors(() =>
      this.db.anyFirst(sql.type(z.object({ i: z.number() }))`
        SELECT (metadata ->> 'iteration')::int AS i FROM ${task}
         WHERE runid = ${runId} AND metadata ->> 'node' = ${node} AND states -> -1 ->> 'state' IN ('queued', 'waiting')`),
    );
    return new Set(rows);
  }

  async checkpoints(runId: string): Promise<Map<string, { cursor: string | null; total: number }>> {
    const cp = this.t.id("checkpoint");
    const rows = await withDbErrors(() =>
      this.db.any(sql.type(z.object({ node_name: z.string(), cursor: z.string().nullable(), total: z.bigint().nullable() }))`
        SELECT node_name, cursor, total FROM ${cp} WHERE run_id = ${runId} ORDER BY run_id, node_name`),
    );
    return new Map(rows.map((r) => [r.node_name, { cursor: r.cursor, total: Number(r.total ?? 0n) }]));
  }

  /** One row per fanning node: a second write updates it (the unique (run_id, node_name)). Created by `owner`, the run's caller, as attempts are (insertTasks). */
  async saveCheckpoints(
    runId: string,
    definitionId: string,
    writes: readonly CheckpointWrite[],
    nowNs: bigint,
    owner: string,
    by: string,
    nowMs: number,
    ids: () => string,
  ): Promise<void> {
    if (writes.length === 0) return;
    const cp = this.t.id("checkpoint");
    const col = <T>(f: (w: CheckpointWrite) => T) => writes.map(f);
    await withDbErrors(() =>
      this.db.query(sql.unsafe`
        INSERT INTO ${cp} AS c (id, run_id, node_name, definition_id, iterator_type, cursor, idx, total, done, updated_at, createdby, createdon, updatedby, updatedon)
        SELECT v.id, ${runId}, v.node, ${definitionId}, 'map', v.cursor, v.idx, v.total, v.done, ${nowNs.toString()}::int8, ${owner}, ${ts(nowMs)}, ${by}, ${ts(nowMs)}
          FROM unnest(${sql.array(
            writes.map(() => ids()),
            "text",
          )}, ${sql.array(
            col((w) => w.node),
            "text",
          )}, ${sql.array(
            col((w) => w.cursor),
            "text",
          )}, ${sql.array(
            col((w) => w.idx),
            "int8",
          )},
                      ${sql.array(
                        col((w) => w.total),
                        "int8",
                      )}, ${sql.array(
                        col((w) => w.done),
                        "bool",
                      )}) AS v(id, node, cursor, idx, total, done)
        ON CONFLICT (run_id, node_name) DO UPDATE SET cursor = EXCLUDED.cursor, idx = EXCLUDED.idx, total = EXCLUDED.total, done = EXCLUDED.done,
               updated_at = EXCLUDED.updated_at, updatedby = EXCLUDED.updatedby, updatedon = EXCLUDED.updatedon`),
    );
  }

  /** The caller's runs of a tenant, newest first, after the cursor. */
  async list(
    scope: { by: string; tenantKey: string },
    filter: RunListFilter,
    cursor: { createdUs: bigint; id: string } | null,
    limit: number,
  ): Promise<readonly RunRow[]> {
    const run = this.t.id("run");
    const where = [sql.fragment`createdby = ${scope.by}`, sql.fragment`metadata ->> 'tenantKey' = ${scope.tenantKey}`];
    if (filter.statuses?.length) where.push(sql.fragment`states -> -1 ->> 'state' = ANY(${sql.array(filter.statuses, "text")})`);
    if (filter.definitionId) where.push(sql.fragment`definitionid = ${filter.definitionId}`);
    if (cursor)
      where.push(sql.fragment`(createdon, id) < ('epoch'::timestamptz + ${cursor.createdUs.toString()}::int8 * interval '1 microsecond', ${cursor.id})`);
    const rows = await withDbErrors(() =>
      this.db.any(
        sql.type(runRow)`SELECT ${RUN_COLUMNS} FROM ${run} WHERE ${sql.join(where, sql.fragment` AND `)} ORDER BY createdon DESC, id DESC LIMIT ${limit}`,
      ),
    );
    return rows.map(toRun);
  }
}
