/**
 * SQL for the events the graph and state-machine engines consume (aiflow_engine_event, migration
 * 0012): the work item a run waits on ended. The migration's trigger writes them in the transaction
 * that ended the item; an advance takes (deletes) a run's events in the transaction that applies
 * them, under the run row's lock.
 */
import { sql, type CommonQueryMethods } from "slonik";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import type { NativeKind } from "./engine-definitions.js";

const eventRow = z.object({
  id: z.bigint(),
  work_item_id: z.string(),
  status: z.enum(["completed", "failed", "cancelled"]),
  agent: z.string().nullable(),
  result: z.string().nullable(),
  error: z.string().nullable(),
});
export type ItemEnded = z.infer<typeof eventRow>;

const RUN_TABLE = { graph: "graph_run", statemachine: "machine_run" } as const;

export class EngineEventStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /**
   * The run_id of a run of `kind` with events, its row locked (FOR UPDATE SKIP LOCKED: a run another
   * daemon is advancing is passed over), among the 64 whose events have waited longest; or null.
   */
  lockDue(kind: NativeKind): Promise<string | null> {
    const runs = this.t.id(RUN_TABLE[kind]);
    const ev = this.t.id("engine_event");
    return withDbErrors(() =>
      this.db.maybeOneFirst(sql.type(z.object({ run_id: z.string() }))`
        SELECT r.run_id FROM ${runs} r
          JOIN (SELECT run_id, min(id) AS waited FROM ${ev} WHERE engine_kind = ${kind} GROUP BY run_id ORDER BY waited LIMIT 64) due
            ON due.run_id = r.run_id
         ORDER BY due.waited
         LIMIT 1
         FOR UPDATE OF r SKIP LOCKED`),
    );
  }

  /** Takes (deletes and returns) a locked run's events, oldest first: applied in this transaction or not at all. */
  async take(kind: NativeKind, runId: string): Promise<readonly ItemEnded[]> {
    const ev = this.t.id("engine_event");
    const rows = await withDbErrors(() =>
      this.db.any(sql.type(eventRow)`
        DELETE FROM ${ev} WHERE engine_kind = ${kind} AND run_id = ${runId}
        RETURNING id, work_item_id, status, agent, result::text AS result, error`),
    );
    return [...rows].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }
}
