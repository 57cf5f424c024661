/**
 * SQL for aiflow_affinity_binding (keys pinned to agent names), apart from the binding a claim makes,
 * which is part of the claim statement in work-items.ts. Every change of a key's holder first locks
 * the binding row: claims that dispatch an item of the key update that same row in their statement,
 * so a rebind or unbind can never interleave with a dispatch.
 *
 * A binding belongs to a tenant (migration 0016): one row per (tenant_key, affinity_key), and "the
 * key's items" are that tenant's items of the key. Nothing here reads or moves another tenant's
 * binding of the same key.
 */
import { sql, type CommonQueryMethods, type DatabasePool } from "slonik";
import { ts } from "../db/values.js";
import { z } from "zod";
import { failedPrecondition, notFound } from "../domain/errors.js";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import { canTakeWork } from "./agents.js";

export const bindingRow = z.object({
  id: z.string(),
  tenant_key: z.string(),
  affinity_key: z.string(),
  agent_id: z.string(),
  createdon: z.number(),
  updatedon: z.number().nullable(),
});
const BINDING_COLUMNS = sql.fragment`id, tenant_key, affinity_key, agent_id, createdon, updatedon`;
export type BindingRow = z.infer<typeof bindingRow>;

export type AffinityPolicy = "hold" | "rebind";

export class AffinityBindingStore {
  constructor(
    private readonly db: DatabasePool,
    private readonly t: Tables,
  ) {}

  /** Bindings ordered by createdon (the spec's order), of these tenants (undefined: every tenant), by key prefix or agent, keyset-paged. */
  list(f: {
    tenants?: readonly string[];
    keyPrefix?: string;
    agent?: string;
    after?: { createdon: number; id: string };
    limit: number;
  }): Promise<readonly BindingRow[]> {
    const b = this.t.id("affinity_binding");
    const conds = [sql.fragment`true`];
    if (f.tenants) conds.push(sql.fragment`tenant_key = ANY(${sql.array([...f.tenants], "text")})`);
    if (f.keyPrefix) conds.push(sql.fragment`starts_with(affinity_key, ${f.keyPrefix})`);
    if (f.agent) conds.push(sql.fragment`agent_id = ${f.agent}`);
    if (f.after) conds.push(sql.fragment`(createdon, id) > (${ts(f.after.createdon)}, ${f.after.id})`);
    return withDbErrors(() =>
      this.db.any(sql.type(bindingRow)`
        SELECT ${BINDING_COLUMNS} FROM ${b} WHERE ${sql.join(conds, sql.fragment` AND `)}
         ORDER BY createdon, id LIMIT ${f.limit}`),
    );
  }

  /** The keys bound to an agent (each once, though several of its tenants may bind it), in binding order. */
  keysOf(agent: string): Promise<readonly string[]> {
    const b = this.t.id("affinity_binding");
    return withDbErrors(() =>
      this.db.anyFirst(sql.type(z.object({ affinity_key: z.string() }))`
        SELECT affinity_key FROM ${b} WHERE agent_id = ${agent} GROUP BY affinity_key ORDER BY min(createdon), min(id)`),
    );
  }

  /** The tenants (of `within`; undefined: any) in which a key is bound, in tenant order. */
  tenantsOf(key: string, within?: readonly string[]): Promise<readonly string[]> {
    const b = this.t.id("affinity_binding");
    const scope = within ? sql.fragment`AND tenant_key = ANY(${sql.array([...within], "text")})` : sql.fragment``;
    return withDbErrors(() =>
      this.db.anyFirst(sql.type(z.object({ tenant_key: z.string() }))`
        SELECT tenant_key FROM ${b} WHERE affinity_key = ${key} ${scope} ORDER BY tenant_key COLLATE "C"`),
    );
  }

  /** Removes a tenant's binding of a key, refused while items of it are dispatched (they would end up on two agents). */
  unbind(tenant: string, key: string): Promise<void> {
    return this.#withLockedKey(tenant, key, async (tx, row) => {
      await this.#refuseInFlight(tx, tenant, key, null);
      await tx.query(sql.unsafe`DELETE FROM ${this.t.id("affinity_binding")} WHERE id = ${row.id}`);
    }).then(() => undefined);
  }

  /**
   * Moves a tenant's key to an active agent that serves the tenant, refused while items of it are
   * dispatched to another agent. An agent outside the tenant would never be given the key's items,
   * and the stranded sweep would make them dead letters.
   */
  rebind(tenant: string, key: string, agent: string, nowMs: number, by: string): Promise<BindingRow> {
    return this.#withLockedKey(tenant, key, async (tx) => {
      const a = this.t.id("agent");
      const found = await tx.maybeOne(sql.type(z.object({ serves: z.boolean() }))`
        SELECT COALESCE(metadata -> 'tenants' ? ${tenant}, false) AS serves FROM ${a} WHERE name = ${agent} AND ${canTakeWork()}`);
      if (!found) throw failedPrecondition(`agent '${agent}' is not an active agent; a key can only be bound to one`);
      if (!found.serves)
        throw failedPrecondition(`agent '${agent}' does not serve tenant '${tenant}'; a tenant's key can only be bound to an agent that serves it`);
      await this.#refuseInFlight(tx, tenant, key, agent);
      return tx.one(sql.type(bindingRow)`
        UPDATE ${this.t.id("affinity_binding")} SET agent_id = ${agent}, updatedby = ${by}, updatedon = ${ts(nowMs)}
         WHERE tenant_key = ${tenant} AND affinity_key = ${key} RETURNING ${BINDING_COLUMNS}`);
    });
  }

  /**
   * Removes bindings whose key has had no unfinished item, and no item finishing, for `idleMs`,
   * so keys such as run ids do not accumulate. One statement; safe concurrently.
   */
  cleanup(nowMs: number, idleMs: number): Promise<number> {
    const b = this.t.id("affinity_binding");
    const w = this.t.id("work_item");
    return withDbErrors(async () => {
      const res = await this.db.query(sql.unsafe`
        DELETE FROM ${b} b
         WHERE b.updatedon < ${ts(nowMs - idleMs)}
           AND NOT EXISTS (SELECT 1 FROM ${w} w WHERE w.affinity_key = b.affinity_key AND w.tenant_key = b.tenant_key
                             AND (w.status IN ('pending', 'dispatched') OR w.updatedon >= ${ts(nowMs - idleMs)}))`);
      return res.rowCount;
    });
  }

  async #withLockedKey<T>(tenant: string, key: string, fn: (tx: CommonQueryMethods, row: BindingRow) => Promise<T>): Promise<T> {
    return withDbErrors(() =>
      this.db.transaction(async (tx) => {
        // The row lock: a claim dispatching this key must update the same row, so it waits for us.
        const row = await tx.maybeOne(sql.type(bindingRow)`
          SELECT ${BINDING_COLUMNS} FROM ${this.t.id("affinity_binding")} WHERE tenant_key = ${tenant} AND affinity_key = ${key} FOR UPDATE`);
        if (!row) throw notFound(`no binding for affinity key '${key}' in tenant '${tenant}'`);
        return fn(tx, row);
      }),
    );
  }

  async #refuseInFlight(tx: CommonQueryMethods, tenant: string, key: string, except: string | null): Promise<void> {
    const w = this.t.id("work_item");
    const holders = await tx.anyFirst(sql.type(z.object({ agent_id: z.string() }))`
      SELECT DISTINCT agent_id FROM ${w} WHERE affinity_key = ${key} AND tenant_key = ${tenant} AND status = 'dispatched' AND agent_id IS NOT NULL
         AND (${except}::text IS NULL OR agent_id <> ${except}::text)`);
    if (holders.length > 0)
      throw failedPrecondition(
        `affinity key '${key}' has items in flight on ${holders.map((h) => `'${h}'`).join(", ")}; wait for them or drain that agent first`,
      );
  }
}
