/**
 * SQL for aiflow_tenant_share as operators see and set it (the enqueue's upsert of a tenant's turns
 * is part of the insert statement, ./work-items/fair-share.ts): the tenants with their effective
 * weights and counts, and an operator's weight.
 *
 * What must stay true:
 *   - The effective weight is the one the enqueue spaces turns by: COALESCE(the row's weight, the
 *     configured weight, 1), the same expression as turnCtes'.
 *   - A change of weight applies to the tenant's backlog: in one transaction that holds the tenant's
 *     row (so no enqueue of the tenant stamps turns meanwhile), the turns its pending items hold past
 *     the queue's current turn V are respaced, tag = V + (tag − V) × w_old / w_new, and its last_tag
 *     likewise, so its next items follow on from the respaced backlog. V is the earliest turn among
 *     due pending items (the enqueue's own frontier), or, with none due, the tenant's own earliest.
 *     Turns at or before V are not moved: they are due now, whatever the weight.
 *   - Item rows are locked in id order before they are written (as the fenced writes lock theirs);
 *     claims take pending rows with SKIP LOCKED and so never wait on them.
 */
import { sql, type CommonQueryMethods } from "slonik";
import { z } from "zod";
import { msToNs } from "../clock.js";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import { ts } from "../db/values.js";
import { newId } from "../util/ids.js";

export type WeightSource = "operator" | "config" | "default";

export const tenantRow = z.object({
  tenant_key: z.string(),
  /** The operator's weight on the tenant's row (NULL: none). */
  operator_weight: z.number().nullable(),
  /** The configured weight (--tenant-weights), NULL when the tenant has none. */
  config_weight: z.number().nullable(),
  /** What the enqueue spaces the tenant's turns by. */
  weight: z.number(),
  pending: z.bigint(),
  dispatched: z.bigint(),
});
export type TenantRow = z.infer<typeof tenantRow>;

export const sourceOf = (r: Pick<TenantRow, "operator_weight" | "config_weight">): WeightSource =>
  r.operator_weight !== null ? "operator" : r.config_weight !== null ? "config" : "default";

export interface TenantFilter {
  /** The caller's tenant limit; undefined: every tenant. */
  tenants?: readonly string[];
  tenant?: string;
  /** The configured weights (--tenant-weights): their tenants are listed whether or not they have a row. */
  configured: ReadonlyMap<string, number>;
}

export interface WeightChange {
  tenant: string;
  /** The operator's new weight; null drops it (the configured one, else 1, applies). */
  weight: number | null;
  by: string;
  nowMs: number;
  configured: ReadonlyMap<string, number>;
}

export interface WeightChanged {
  /** Effective weights before and after. */
  from: number;
  to: number;
  /** Pending items whose turns were respaced. */
  respaced: number;
}

const lockedRow = z.object({ weight: z.number().nullable() });
const frontier = z.object({ v: z.number().nullable() });

export class TenantShareStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /** Tenants with a row or a configured weight, by tenant key, with their weights and counts. */
  list(f: TenantFilter): Promise<readonly TenantRow[]> {
    const s = this.t.id("tenant_share");
    const w = this.t.id("work_item");
    const conds = [sql.fragment`true`];
    if (f.tenants) conds.push(sql.fragment`n.t = ANY(${sql.array([...f.tenants], "text")})`);
    if (f.tenant !== undefined) conds.push(sql.fragment`n.t = ${f.tenant}`);
    return withDbErrors(() =>
      this.db.any(sql.type(tenantRow)`
        WITH cfg AS (
          SELECT c.t, c.w FROM unnest(${sql.array([...f.configured.keys()], "text")}::text[], ${sql.array([...f.configured.values()], "float8")}::float8[]) AS c(t, w)
        ), n AS (
          SELECT tenant_key AS t FROM ${s} UNION SELECT t FROM cfg
        )
        SELECT n.t AS tenant_key, s.weight AS operator_weight, cfg.w AS config_weight, COALESCE(s.weight, cfg.w, 1)::float8 AS weight,
               (SELECT count(*) FROM ${w} p WHERE p.tenant_key = n.t AND p.status = 'pending') AS pending,
               (SELECT count(*) FROM ${w} d WHERE d.tenant_key = n.t AND d.status = 'dispatched') AS dispatched
          FROM n
          LEFT JOIN ${s} s ON s.tenant_key = n.t
          LEFT JOIN cfg ON cfg.t = n.t
         WHERE ${sql.join(conds, sql.fragment` AND `)}
         ORDER BY n.t`),
    );
  }

  /**
   * Sets (a number) or drops (null) the operator's weight of a tenant, making its row if it has
   * none, and respaces its pending backlog's turns to the new weight (see the header), in one
   * transaction.
   */
  setWeight(c: WeightChange): Promise<WeightChanged> {
    const s = this.t.id("tenant_share");
    const w = this.t.id("work_item");
    const now = ts(c.nowMs);
    const configured = c.configured.get(c.tenant) ?? null;
    return withDbErrors(() =>
      this.db.transaction(async (tx) => {
        // A new row starts at last_tag 0: the enqueue's upsert takes the later of it and the queue's
        // turn less the credit, as for any tenant coming back from idle.
        await tx.query(sql.unsafe`
          INSERT INTO ${s} (id, tenant_key, weight, last_tag, createdby, createdon)
          VALUES (${newId(c.nowMs)}, ${c.tenant}, NULL, 0, ${c.by}, ${now})
          ON CONFLICT (tenant_key) DO NOTHING`);
        // Held to the commit: an enqueue of the tenant writes this row first, so it waits, and then
        // stamps its turns from the respaced last_tag with the new weight.
        const row = await tx.one(sql.type(lockedRow)`SELECT weight FROM ${s} WHERE tenant_key = ${c.tenant} FOR UPDATE`);
        const from = row.weight ?? configured ?? 1;
        const to = c.weight ?? configured ?? 1;
        let respaced = 0;
        if (from !== to) {
          const { v } = await tx.one(sql.type(frontier)`
            SELECT COALESCE(
                     (SELECT f.share_tag FROM ${w} f WHERE f.status = 'pending' AND f.next_attempt_at + 0 <= ${String(msToNs(c.nowMs))}::int8
                       ORDER BY f.share_tag, f.id LIMIT 1),
                     (SELECT min(o.share_tag) FROM ${w} o WHERE o.tenant_key = ${c.tenant} AND o.status = 'pending')) AS v`);
          if (v !== null) {
            const scale = sql.fragment`${from}::float8 / ${to}::float8`;
            const res = await tx.query(sql.unsafe`
              UPDATE ${w} u SET share_tag = ${v}::float8 + (u.share_tag - ${v}::float8) * ${scale}
                FROM (SELECT l.id FROM ${w} l WHERE l.tenant_key = ${c.tenant} AND l.status = 'pending' AND l.share_tag > ${v}::float8
                       ORDER BY l.id FOR UPDATE) locked
               WHERE u.id = locked.id AND u.status = 'pending' AND u.share_tag > ${v}::float8`);
            respaced = res.rowCount;
            await tx.query(sql.unsafe`
              UPDATE ${s} SET last_tag = ${v}::float8 + (last_tag - ${v}::float8) * ${scale}
               WHERE tenant_key = ${c.tenant} AND last_tag > ${v}::float8`);
          }
        }
        await tx.query(sql.unsafe`UPDATE ${s} SET weight = ${c.weight}::float8, updatedby = ${c.by}, updatedon = ${now} WHERE tenant_key = ${c.tenant}`);
        return { from, to, respaced };
      }),
    );
  }
}
