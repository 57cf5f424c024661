/**
 * SQL for aiflow_rate_limit as operators see and set it (the slots a claim spends are part of the
 * claim statement, ./work-items/rate-limits.ts, and the function rate_admit of migration 0009): the
 * operators' limits on keys and prefixes, the keys' state, and setting and clearing a limit.
 *
 * A row is (tenant_key, key, prefix). A rule is a row with limit_count set: limit_count dispatches
 * per interval_ns, burst at once. A key row (prefix false) is also the key's state, tat_ns and
 * open_ns, which claims write. So one key row may hold both a rule and state.
 *
 * What must stay true:
 *   - The limit reported for a key is the one the claim applies: the key's own rule, else its
 *     longest prefix's, chosen with rate_rule's own conditions and order (`applyingRule`).
 *   - Setting a key's rule upserts on (tenant_key, key, prefix) and leaves the state columns to the
 *     respacing below; clearing a rule sets its columns NULL, and deletes the row only when it is a
 *     prefix rule or holds no state (claims lock and write key rows; a prefix row has no such reader).
 *   - A change applies from the next claim, to the slots already spent too: in one transaction that
 *     holds the state rows of the keys it covers (in (tenant, key) order, as rate_admit locks them),
 *     each key's spent slots ahead of now are counted again under its new limit,
 *     tat = now + (tat − now) × emit_new / emit_old, and open_ns = tat − tolerance_new. A key the
 *     change leaves unlimited keeps tat_ns but loses open_ns, so no claim passes over its items; a key
 *     that was unlimited starts afresh (tat no later than now). Without this a raised or cleared limit
 *     would hold a key closed until the old limit's next slot, up to an interval (a week) away.
 *   - Keys are matched with starts_with() and equality only: they may hold % and _.
 */
import { sql, type CommonQueryMethods, type FragmentSqlToken } from "slonik";
import { z } from "zod";
import { msToNs } from "../clock.js";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import { ts } from "../db/values.js";
import { newId } from "../util/ids.js";

export const ruleRow = z.object({
  tenant_key: z.string(),
  key: z.string(),
  prefix: z.boolean(),
  limit_count: z.number(),
  interval_ns: z.bigint(),
  burst: z.number(),
});
export type RuleRow = z.infer<typeof ruleRow>;

export const keyStateRow = z.object({
  tenant_key: z.string(),
  key: z.string(),
  /** The key's theoretical arrival time (epoch ns); NULL when it has spent no slot. */
  tat_ns: z.number().nullable(),
  /** The first time another dispatch conforms (epoch ns); NULL when no limit holds the key. */
  open_ns: z.number().nullable(),
  /** The rule that applies to the key now (all NULL: none). */
  rule_key: z.string().nullable(),
  rule_prefix: z.boolean().nullable(),
  limit_count: z.number().nullable(),
  interval_ns: z.bigint().nullable(),
  burst: z.number().nullable(),
});
export type KeyStateRow = z.infer<typeof keyStateRow>;

export interface RateFilter {
  /** The caller's tenant limit; undefined: every tenant. */
  tenants?: readonly string[];
  tenant?: string;
  keyPrefix?: string;
}

export interface KeyStateFilter extends RateFilter {
  /** Keyset paging: keys after this (tenant, key), in (tenant_key, key) order. */
  after?: { tenant: string; key: string };
  limit: number;
}

export interface RuleTarget {
  tenant: string;
  key: string;
  prefix: boolean;
  by: string;
  nowMs: number;
}

export interface NewRule extends RuleTarget {
  count: number;
  intervalNs: bigint;
  burst: number;
}

const covered = z.object({ key: z.string(), emit_ns: z.number().nullable(), tat_ns: z.number().nullable() });

export class RateLimitStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /** The rules (key and prefix) of the filter, by tenant, key and prefix. */
  rules(f: RateFilter): Promise<readonly RuleRow[]> {
    const rl = this.t.id("rate_limit");
    return withDbErrors(() =>
      this.db.any(sql.type(ruleRow)`
        SELECT tenant_key, key, prefix, limit_count, interval_ns, burst FROM ${rl}
         WHERE limit_count IS NOT NULL AND ${scope(f, undefined)}
         ORDER BY tenant_key, key, prefix`),
    );
  }

  /** Keys that have spent a slot (tat_ns set), by (tenant_key, key), with the rule that applies to each. */
  list(f: KeyStateFilter): Promise<readonly KeyStateRow[]> {
    const rl = this.t.id("rate_limit");
    return withDbErrors(() =>
      this.db.any(sql.type(keyStateRow)`
        SELECT s.tenant_key, s.key, s.tat_ns, s.open_ns, ${this.#ruleColumns()}
          FROM ${rl} s ${this.#applyingRule(sql.fragment`s.tenant_key`, sql.fragment`s.key`)}
         WHERE NOT s.prefix AND s.tat_ns IS NOT NULL AND ${scope(f, f.after, "s")}
         ORDER BY s.tenant_key, s.key
         LIMIT ${f.limit}`),
    );
  }

  /** One key as it stands, whether or not it has state or a limit. */
  get(tenant: string, key: string): Promise<KeyStateRow> {
    const rl = this.t.id("rate_limit");
    return withDbErrors(() =>
      this.db.one(sql.type(keyStateRow)`
        SELECT n.t AS tenant_key, n.k AS key, s.tat_ns, s.open_ns, ${this.#ruleColumns()}
          FROM (SELECT ${tenant}::text AS t, ${key}::text AS k) n
          LEFT JOIN ${rl} s ON s.tenant_key = n.t AND s.key = n.k AND NOT s.prefix
          ${this.#applyingRule(sql.fragment`n.t`, sql.fragment`n.k`)}`),
    );
  }

  /** Sets an operator's limit on a key or a prefix, and respaces the covered keys' spent slots (see the header). */
  set(r: NewRule): Promise<void> {
    const rl = this.t.id("rate_limit");
    const now = ts(r.nowMs);
    return this.#change(r, async (tx) => {
      await tx.query(sql.unsafe`
        INSERT INTO ${rl} (id, tenant_key, key, prefix, limit_count, interval_ns, burst, createdby, createdon, updatedby, updatedon)
        VALUES (${newId(r.nowMs)}, ${r.tenant}, ${r.key}, ${r.prefix}, ${r.count}, ${String(r.intervalNs)}::int8, ${r.burst}, ${r.by}, ${now}, ${r.by}, ${now})
        ON CONFLICT (tenant_key, key, prefix) DO UPDATE
          SET limit_count = EXCLUDED.limit_count, interval_ns = EXCLUDED.interval_ns, burst = EXCLUDED.burst,
              updatedby = EXCLUDED.updatedby, updatedon = EXCLUDED.updatedon`);
    });
  }

  /**
   * Clears an operator's limit on a key or a prefix: a prefix rule, or a key row without state, is
   * deleted; a key row with state keeps its row with the rule's columns NULL. True when there was a
   * rule. The covered keys' spent slots are respaced as for set.
   */
  clear(r: RuleTarget): Promise<boolean> {
    const rl = this.t.id("rate_limit");
    const target = sql.fragment`tenant_key = ${r.tenant} AND key = ${r.key} AND prefix = ${r.prefix}`;
    return this.#change(r, async (tx) => {
      const deleted = await tx.query(sql.unsafe`DELETE FROM ${rl} WHERE ${target} AND limit_count IS NOT NULL AND (prefix OR tat_ns IS NULL)`);
      const nulled = await tx.query(sql.unsafe`
        UPDATE ${rl} SET limit_count = NULL, interval_ns = NULL, burst = NULL, updatedby = ${r.by}, updatedon = ${ts(r.nowMs)}
         WHERE ${target} AND limit_count IS NOT NULL`);
      return deleted.rowCount + nulled.rowCount > 0;
    });
  }

  /**
   * Runs `write` (the rule's change) in a transaction between locking the state rows of the keys the
   * rule covers, with each key's emission interval before, and respacing them under the new rules.
   */
  #change<T>(r: RuleTarget, write: (tx: CommonQueryMethods) => Promise<T>): Promise<T> {
    const rl = this.t.id("rate_limit");
    const rule = this.t.routine("rate_rule");
    const nowNs = sql.fragment`${String(msToNs(r.nowMs))}::float8`;
    const keys = r.prefix ? sql.fragment`starts_with(s.key, ${r.key})` : sql.fragment`s.key = ${r.key}`;
    return withDbErrors(() =>
      this.db.transaction(async (tx) => {
        // The key row itself is locked (made first when missing), so a claim that would make it and
        // spend its first slot meanwhile waits, and its state is respaced with the rest.
        if (!r.prefix)
          await tx.query(sql.unsafe`
            INSERT INTO ${rl} (id, tenant_key, key, prefix, createdby, createdon) VALUES (${newId(r.nowMs)}, ${r.tenant}, ${r.key}, false, ${r.by}, ${ts(r.nowMs)})
            ON CONFLICT (tenant_key, key, prefix) DO NOTHING`);
        const before = await tx.any(sql.type(covered)`
          SELECT s.key, rr.emit_ns, s.tat_ns FROM ${rl} s LEFT JOIN LATERAL ${rule}(s.tenant_key, s.key) rr ON true
           WHERE s.tenant_key = ${r.tenant} AND NOT s.prefix AND ${keys}
           ORDER BY s.key COLLATE "C"
           FOR UPDATE OF s`);
        const out = await write(tx);
        const spent = before.filter((b) => b.tat_ns !== null);
        if (spent.length > 0)
          await tx.query(sql.unsafe`
            UPDATE ${rl} s SET tat_ns = n.tat, open_ns = CASE WHEN n.emit_ns IS NULL THEN NULL ELSE n.tat - n.tolerance_ns END
              FROM (SELECT o.k, rr.emit_ns, rr.tolerance_ns,
                           CASE WHEN rr.emit_ns IS NULL THEN c.tat_ns
                                WHEN o.e_old IS NULL THEN LEAST(c.tat_ns, ${nowNs})
                                WHEN c.tat_ns > ${nowNs} THEN ${nowNs} + (c.tat_ns - ${nowNs}) * rr.emit_ns / o.e_old
                                ELSE c.tat_ns END AS tat
                      FROM unnest(${sql.array(
                        spent.map((b) => b.key),
                        "text",
                      )}, ${sql.array(
                        spent.map((b) => b.emit_ns),
                        "float8",
                      )}) AS o(k, e_old)
                      JOIN ${rl} c ON c.tenant_key = ${r.tenant} AND c.key = o.k AND NOT c.prefix
                      LEFT JOIN LATERAL ${rule}(${r.tenant}, o.k) rr ON true) n
             WHERE s.tenant_key = ${r.tenant} AND s.key = n.k AND NOT s.prefix AND s.tat_ns IS NOT NULL`);
        // A key row made above only to be locked, which nothing needed: no rule and no state.
        if (!r.prefix)
          await tx.query(
            sql.unsafe`DELETE FROM ${rl} WHERE tenant_key = ${r.tenant} AND key = ${r.key} AND NOT prefix AND limit_count IS NULL AND tat_ns IS NULL`,
          );
        return out;
      }),
    );
  }

  /** The applying rule's columns, from the `ar` join. */
  #ruleColumns(): FragmentSqlToken {
    return sql.fragment`ar.key AS rule_key, ar.prefix AS rule_prefix, ar.limit_count, ar.interval_ns, ar.burst`;
  }

  /** `ar`: the rule that applies to (tenant, key), as rate_rule (migration 0009) chooses it: the key's own, else the longest prefix's. */
  #applyingRule(tenant: FragmentSqlToken, key: FragmentSqlToken): FragmentSqlToken {
    const rl = this.t.id("rate_limit");
    return sql.fragment`
      LEFT JOIN LATERAL (SELECT r.key, r.prefix, r.limit_count, r.interval_ns, r.burst FROM ${rl} r
                          WHERE r.tenant_key = ${tenant} AND r.limit_count IS NOT NULL
                            AND ((NOT r.prefix AND r.key = ${key}) OR (r.prefix AND starts_with(${key}, r.key)))
                          ORDER BY r.prefix, length(r.key) DESC LIMIT 1) ar ON true`;
  }
}

/** A filter on a rate_limit alias's tenant and key (no alias: the table's own columns). */
function scope(f: RateFilter, after: { tenant: string; key: string } | undefined, alias?: string): FragmentSqlToken {
  const col = (c: string) => (alias ? sql.identifier([alias, c]) : sql.identifier([c]));
  const conds = [sql.fragment`true`];
  if (f.tenants) conds.push(sql.fragment`${col("tenant_key")} = ANY(${sql.array([...f.tenants], "text")})`);
  if (f.tenant !== undefined) conds.push(sql.fragment`${col("tenant_key")} = ${f.tenant}`);
  if (f.keyPrefix) conds.push(sql.fragment`starts_with(${col("key")}, ${f.keyPrefix})`);
  if (after) conds.push(sql.fragment`(${col("tenant_key")}, ${col("key")}) > (${after.tenant}::text, ${after.key}::text)`);
  return sql.fragment`${sql.join(conds, sql.fragment` AND `)}`;
}
