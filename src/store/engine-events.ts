/**
 * SQL for the events the engines' advances consume (aiflow_engine_event, migrations 0012 and 0017):
 * a work item a run waits on ended (written by migration 0017's trigger in the transaction that ended
 * the item), or an attempt's timeout came due (written by the DAG's step with the attempt, due later).
 * An advance takes (deletes) a run's due events in the transaction that applies them, under the run
 * row's lock: an event is applied exactly once, across daemons and crashes.
 */
import { sql, type CommonQueryMethods } from "slonik";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { TableName, Tables } from "../db/tables.js";
import type { EngineKind } from "../domain/engine-kinds.js";

const eventRow = z.object({
  id: z.bigint(),
  /** 'item' (its work item ended) or 'timeout' (the DAG attempt task_id's deadline came due). */
  kind: z.enum(["item", "timeout"]),
  /** The DAG attempt the event ends; null for graph and machine events. */
  task_id: z.string().nullable(),
  /** Null for a timeout. */
  work_item_id: z.string().nullable(),
  status: z.enum(["completed", "failed", "cancelled"]).nullable(),
  agent: z.string().nullable(),
  result: z.string().nullable(),
  error: z.string().nullable(),
  dispatched_at: z.bigint().nullable(),
  ended_at: z.bigint().nullable(),
});
export type EngineEvent = z.infer<typeof eventRow>;

/** Where an engine's runs are: its run table and the column the events' run_id matches. */
export interface RunTable {
  table: TableName;
  key: "id" | "run_id";
}

export class EngineEventStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /**
   * The run id of a run of `kind` with events due at `nowNs`, its row locked (FOR UPDATE SKIP LOCKED:
   * a run another daemon is advancing is passed over), among the 64 whose due events have waited
   * longest, so that under a backlog no run waits behind runs that started before it; or null.
   */
  lockDue(kind: EngineKind, runs: RunTable, nowNs: bigint): Promise<string | null> {
    const ev = this.t.id("engine_event");
    const key = sql.identifier(["r", runs.key]);
    return withDbErrors(() =>
      this.db.maybeOneFirst(sql.type(z.object({ run_id: z.string() }))`
        SELECT ${key} AS run_id FROM ${this.t.id(runs.table)} r
          JOIN (SELECT run_id, min(id) AS waited FROM ${ev}
                 WHERE engine_kind = ${kind} AND COALESCE(due_at, 0) <= ${nowNs.toString()}::int8
                 GROUP BY run_id ORDER BY waited LIMIT 64) due
            ON due.run_id = ${key}
         ORDER BY due.waited
         LIMIT 1
         FOR UPDATE OF r SKIP LOCKED`),
    );
  }

  /** Takes (deletes and returns) a locked run's due events, oldest first: applied in this transaction or not at all. */
  async take(kind: EngineKind, runId: string, nowNs: bigint): Promise<readonly EngineEvent[]> {
    const ev = this.t.id("engine_event");
    const rows = await withDbErrors(() =>
      this.db.any(sql.type(eventRow)`
        DELETE FROM ${ev} WHERE engine_kind = ${kind} AND run_id = ${runId} AND COALESCE(due_at, 0) <= ${nowNs.toString()}::int8
        RETURNING id, kind, task_id, work_item_id, status, agent, result::text AS result, error, dispatched_at, ended_at`),
    );
    return [...rows].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  /** Timeouts: an event per attempt, due at its deadline. */
  async addTimers(kind: EngineKind, runId: string, timers: readonly { taskId: string; dueNs: bigint }[]): Promise<void> {
    if (timers.length === 0) return;
    const ev = this.t.id("engine_event");
    await withDbErrors(() =>
      this.db.query(sql.unsafe`
        INSERT INTO ${ev} (engine_kind, run_id, task_id, kind, due_at)
        SELECT ${kind}, ${runId}, t, 'timeout', d FROM unnest(${sql.array(
          timers.map((x) => x.taskId),
          "text",
        )}, ${sql.array(
          timers.map((x) => x.dueNs.toString()),
          "int8",
        )}) AS v(t, d)`),
    );
  }

  /** Drops the timeouts of attempts that ended (each would cost an advance that changes nothing). */
  async dropTimers(kind: EngineKind, runId: string, taskIds: readonly string[]): Promise<void> {
    if (taskIds.length === 0) return;
    const ev = this.t.id("engine_event");
    await withDbErrors(() =>
      this.db.query(
        sql.unsafe`DELETE FROM ${ev} WHERE engine_kind = ${kind} AND run_id = ${runId} AND kind = 'timeout' AND task_id = ANY(${sql.array(taskIds as string[], "text")})`,
      ),
    );
  }
}

/** An ended item's result as JSON (null when it had none). */
export const resultOf = (e: EngineEvent): unknown => (e.result === null ? null : JSON.parse(e.result));
