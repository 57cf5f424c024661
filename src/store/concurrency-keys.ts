/**
 * SQL for aiflow_concurrency_key as operators see and set it (the rows a claim writes are part of the
 * claim statement, ./work-items/concurrency.ts): the keys with work or a limit, with their counts and
 * limits, the prefix rules, and an operator's limits.
 *
 * What must stay true:
 *   - The limit reported is the one the claim applies: it is computed with the claim's own fragments
 *     (itemLimit of the key's next item in claim order, else operatorLimit), never restated here.
 *   - A key row outlives its limit being cleared (max_in_flight set to NULL): claims compare-and-set
 *     on it, and a row a claim created is no different from one an operator did. A prefix rule has no
 *     such reader, so clearing one deletes it.
 *   - Keys are matched with starts_with() and equality only: they may hold % and _.
 */
import { sql, type CommonQueryMethods, type FragmentSqlToken } from "slonik";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import { ts } from "../db/values.js";
import { newId } from "../util/ids.js";
import { claimOrder } from "./work-items/claim-rule.js";
import { inFlight, itemLimit, operatorLimit, type KeyTerms } from "./work-items/concurrency.js";

export const keyRow = z.object({
  tenant_key: z.string(),
  key: z.string(),
  in_flight: z.number(),
  pending: z.bigint(),
  /** The operator's limit on the key's own row (NULL: none). */
  key_limit: z.number().nullable(),
  /** The longest prefix rule with a limit that the key starts with. */
  rule_prefix: z.string().nullable(),
  rule_limit: z.number().nullable(),
  /** The max_in_flight the key's next pending item (in claim order) states; NULL when none is pending. */
  item_limit: z.number().nullable(),
  /** What the key's next dispatch is held to, as the claim computes it; NULL when nothing says. */
  next_limit: z.number().nullable(),
});
export type KeyRow = z.infer<typeof keyRow>;

export const ruleRow = z.object({ tenant_key: z.string(), key_prefix: z.string(), max_in_flight: z.number() });
export type RuleRow = z.infer<typeof ruleRow>;

export interface KeyFilter {
  /** The caller's tenant limit; undefined: every tenant. */
  tenants?: readonly string[];
  tenant?: string;
  keyPrefix?: string;
  /** Keyset paging: keys after this (tenant, key), in (tenant_key, key) order. */
  after?: { tenant: string; key: string };
  limit: number;
}

export class ConcurrencyKeyStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /**
   * Keys with items pending or dispatched, or with an operator's limit on their row, ordered by
   * (tenant_key, key). Each source is read in key order with the page's LIMIT (the work item side
   * by its concurrency index), so a page does not read the whole backlog.
   */
  list(f: KeyFilter): Promise<readonly KeyRow[]> {
    const w = this.t.id("work_item");
    const ck = this.t.id("concurrency_key");
    const names = sql.fragment`(
        (SELECT DISTINCT tenant_key AS t, concurrency_key AS k FROM ${w}
          WHERE concurrency_key IS NOT NULL AND status IN ('pending', 'dispatched')
            AND ${scope(f, sql.fragment`tenant_key`, sql.fragment`concurrency_key`)}
          ORDER BY 1, 2 LIMIT ${f.limit})
        UNION
        (SELECT tenant_key, key FROM ${ck}
          WHERE NOT prefix AND max_in_flight IS NOT NULL
            AND ${scope(f, sql.fragment`tenant_key`, sql.fragment`key`)}
          ORDER BY 1, 2 LIMIT ${f.limit})
        ORDER BY 1, 2 LIMIT ${f.limit})`;
    return withDbErrors(() => this.db.any(sql.type(keyRow)`${this.#keysSelect(names)}`));
  }

  /** One key as it stands, whether or not anything is pending, in flight or limited. */
  get(tenant: string, key: string): Promise<KeyRow> {
    return withDbErrors(() => this.db.one(sql.type(keyRow)`${this.#keysSelect(sql.fragment`(SELECT ${tenant}::text AS t, ${key}::text AS k)`)}`));
  }

  /** The prefix rules with a limit, of these tenants (undefined: every tenant), by tenant and prefix. */
  rules(tenants?: readonly string[]): Promise<readonly RuleRow[]> {
    const ck = this.t.id("concurrency_key");
    const within = tenants ? sql.fragment`tenant_key = ANY(${sql.array([...tenants], "text")})` : sql.fragment`true`;
    return withDbErrors(() =>
      this.db.any(sql.type(ruleRow)`
        SELECT tenant_key, key AS key_prefix, max_in_flight FROM ${ck}
         WHERE prefix AND max_in_flight IS NOT NULL AND ${within}
         ORDER BY tenant_key, key`),
    );
  }

  /**
   * Sets an operator's limit on a key or a prefix; null clears it (a key row keeps its row, a prefix
   * rule is deleted). Any write of a key row moves its version, so a claim that counted the key's
   * in-flight items before it commits none of the key's dispatches (../work-items/concurrency.ts).
   */
  setLimit(s: { tenant: string; key: string; prefix: boolean; maxInFlight: number | null; by: string; nowMs: number }): Promise<void> {
    const ck = this.t.id("concurrency_key");
    const now = ts(s.nowMs);
    let statement;
    if (s.maxInFlight !== null)
      statement = sql.unsafe`
        INSERT INTO ${ck} (id, tenant_key, key, prefix, max_in_flight, createdby, createdon, updatedby, updatedon)
        VALUES (${newId(s.nowMs)}, ${s.tenant}, ${s.key}, ${s.prefix}, ${s.maxInFlight}, ${s.by}, ${now}, ${s.by}, ${now})
        ON CONFLICT (tenant_key, key, prefix) DO UPDATE
          SET max_in_flight = EXCLUDED.max_in_flight, updatedby = EXCLUDED.updatedby, updatedon = EXCLUDED.updatedon`;
    else if (s.prefix) statement = sql.unsafe`DELETE FROM ${ck} WHERE tenant_key = ${s.tenant} AND key = ${s.key} AND prefix`;
    else
      statement = sql.unsafe`
        UPDATE ${ck} SET max_in_flight = NULL, updatedby = ${s.by}, updatedon = ${now}
         WHERE tenant_key = ${s.tenant} AND key = ${s.key} AND NOT prefix AND max_in_flight IS NOT NULL`;
    return withDbErrors(async () => {
      await this.db.query(statement);
    });
  }

  /** Counts and limits for each (t, k) of `names`, in (t, k) order. */
  #keysSelect(names: FragmentSqlToken): FragmentSqlToken {
    const w = this.t.id("work_item");
    const ck = this.t.id("concurrency_key");
    const k: KeyTerms = { items: w, keys: ck, completing: false, keyLimit: this.t.routine("key_limit") };
    const t = sql.fragment`n.t`;
    const key = sql.fragment`n.k`;
    return sql.fragment`
      SELECT n.t AS tenant_key, n.k AS key,
             ${inFlight(k, t, key)}::int AS in_flight,
             (SELECT count(*) FROM ${w} kp WHERE kp.tenant_key = n.t AND kp.concurrency_key = n.k AND kp.status = 'pending') AS pending,
             kr.max_in_flight AS key_limit,
             pr.key AS rule_prefix, pr.max_in_flight AS rule_limit,
             nx.own AS item_limit,
             COALESCE(nx.held_to, ${operatorLimit(k, t, key)}) AS next_limit
        FROM ${names} n
        LEFT JOIN ${ck} kr ON kr.tenant_key = n.t AND kr.key = n.k AND NOT kr.prefix
        -- Which rule operatorLimit falls back to, for the label only: the number comes from it.
        LEFT JOIN LATERAL (SELECT r.key, r.max_in_flight FROM ${ck} r
                            WHERE r.tenant_key = n.t AND r.prefix AND r.max_in_flight IS NOT NULL AND starts_with(n.k, r.key)
                            ORDER BY length(r.key) DESC LIMIT 1) pr ON true
        LEFT JOIN LATERAL (SELECT (nw.worker_params ->> 'maxInFlight')::int AS own, ${itemLimit(k, "nw")} AS held_to FROM ${w} nw
                            WHERE nw.tenant_key = n.t AND nw.concurrency_key = n.k AND nw.status = 'pending'
                            ORDER BY ${claimOrder("nw")} LIMIT 1) nx ON true
       ORDER BY n.t, n.k`;
  }
}

/** The list's filter on a source's tenant and key columns. */
function scope(f: KeyFilter, tenant: FragmentSqlToken, key: FragmentSqlToken): FragmentSqlToken {
  const conds = [sql.fragment`true`];
  if (f.tenants) conds.push(sql.fragment`${tenant} = ANY(${sql.array([...f.tenants], "text")})`);
  if (f.tenant !== undefined) conds.push(sql.fragment`${tenant} = ${f.tenant}`);
  if (f.keyPrefix) conds.push(sql.fragment`starts_with(${key}, ${f.keyPrefix})`);
  if (f.after) conds.push(sql.fragment`(${tenant}, ${key}) > (${f.after.tenant}::text, ${f.after.key}::text)`);
  return sql.fragment`${sql.join(conds, sql.fragment` AND `)}`;
}
