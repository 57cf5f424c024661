/**
 * SQL for aiflow_engine: each daemon instance records itself once per tenant it serves, keeps the
 * rows alive, marks them stopped on a clean exit, and finds dead instances stale.
 *
 * A row's updatedon is written by its own instance only: the time up to which that instance has
 * written every heartbeat it received (it keeps alive only after flushing them). The agent liveness
 * sweep reads it to tell whether an instance may still hold an agent's newer beats, so marking an
 * instance stale leaves it alone.
 */
import { sql, type CommonQueryMethods } from "slonik";
import { ts } from "../db/values.js";
import { ulid } from "ulid";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";

export type EngineStatus = "running" | "stopped" | "stale";

const engineRow = z.object({ tenantkey: z.string(), engineid: z.string(), status: z.string().nullable(), updatedon: z.number().nullable() });
export type EngineRow = z.infer<typeof engineRow>;

export class EngineStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /**
   * Records (or refreshes) this instance as running for each tenant, in one statement. `nowMs` must
   * be a time before which every heartbeat this instance received is written.
   */
  async keepAlive(engineId: string, tenants: readonly string[], nowMs: number): Promise<void> {
    if (tenants.length === 0) return;
    const engine = this.t.id("engine");
    await withDbErrors(() =>
      this.db.query(sql.unsafe`
        INSERT INTO ${engine} AS e (id, tenantkey, engineid, status, createdby, createdon, updatedby, updatedon)
        SELECT v.id, v.tenant, ${engineId}, 'running', ${engineId}, ${ts(nowMs)}, ${engineId}, ${ts(nowMs)}
          FROM unnest(${sql.array(
            tenants.map(() => ulid(nowMs)),
            "text",
          )}, ${sql.array([...tenants], "text")}) AS v(id, tenant)
        ON CONFLICT (tenantkey, engineid) DO UPDATE SET status = 'running', updatedby = EXCLUDED.updatedby, updatedon = EXCLUDED.updatedon`),
    );
  }

  async markStopped(engineId: string, nowMs: number): Promise<void> {
    const engine = this.t.id("engine");
    await withDbErrors(() =>
      this.db.query(sql.unsafe`UPDATE ${engine} SET status = 'stopped', updatedby = ${engineId}, updatedon = ${ts(nowMs)} WHERE engineid = ${engineId}`),
    );
  }

  /**
   * Instances that stopped keeping alive are stale; one statement, safe concurrently. updatedon
   * keeps the instance's last keepalive (see the file's opening comment).
   */
  markStale(staleBeforeMs: number, by: string): Promise<readonly EngineRow[]> {
    const engine = this.t.id("engine");
    return withDbErrors(() =>
      this.db.any(sql.type(engineRow)`
        UPDATE ${engine} SET status = 'stale', updatedby = ${by}
         WHERE status = 'running' AND updatedon < ${ts(staleBeforeMs)}
        RETURNING tenantkey, engineid, status, updatedon`),
    );
  }
}
