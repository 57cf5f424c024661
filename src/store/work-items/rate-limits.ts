/**
 * Rate limits in the claim statement (the rule: ../../domain/rate-limits.ts), by the generic cell
 * rate algorithm over the key's row in aiflow_rate_limit: tat_ns, its theoretical arrival time,
 * and open_ns = tat_ns less the tolerance, the first time another dispatch conforms.
 *
 * - The picked scan passes over rows of keys closed now (open_ns in the future), read once per
 *   statement as a hashed set from the open_ns index, so a key's backlog over its limit costs a
 *   hash probe per row and never fills the claim's LIMIT ahead of other work.
 * - Of the picked rows that carry a key (and that their concurrency key admits, when they have
 *   one), the function rate_admit (migration 0009, which holds its SQL) lets go, per key and in
 *   claim order, those that conform now, and spends their slots on the key's row. It locks the row
 *   first and reads it afresh after any wait, so two claims never spend one slot, on any daemons:
 *   the second counts from what the first wrote.
 * - A slot is spent when the row is written, so an admitted item that another of the claim's tests
 *   holds back (its affinity key, its resources) leaves its slot unused: a limit can be under-used,
 *   never exceeded.
 * As with placement, a function keeps this out of the claim's own plan: a claim without keyed rows
 * never calls it.
 */
import { sql, type FragmentSqlToken, type IdentifierSqlToken } from "slonik";

export interface RateTerms {
  limits: IdentifierSqlToken;
  /** The function rate_admit (migration 0009). */
  admit: IdentifierSqlToken;
  /** Epoch ns of the claim (a bound marker). */
  nowNs: FragmentSqlToken;
}

/** `rclosed`: the keys closed now, and when each opens (`o`, epoch ns). */
export function rateSetCtes(r: RateTerms): FragmentSqlToken {
  return sql.fragment`rclosed AS (
          SELECT rc.tenant_key AS t, rc.key AS k, rc.open_ns AS o FROM ${r.limits} rc WHERE rc.open_ns > ${r.nowNs}::float8 AND NOT rc.prefix
        )`;
}

/** The picked scan's test of a row `w`: no rate limit key, or its key is not closed now. */
export function rateHasRoom(w: string): FragmentSqlToken {
  const a = sql.identifier([w]);
  return sql.fragment`(${a}.rate_limit_key IS NULL OR (${a}.tenant_key, ${a}.rate_limit_key) NOT IN (SELECT t, k FROM rclosed))`;
}

/**
 * `radmit`: the ids of the picked rows with a key that may go (rate_admit, called only when
 * `eligible` picked rows carry a key). `order` is claim order over picked rows `p`.
 */
export function rateAdmitCte(
  r: RateTerms,
  m: { eligible: FragmentSqlToken; order: FragmentSqlToken; agent: string; now: FragmentSqlToken; seed: string },
): FragmentSqlToken {
  const keyed = sql.fragment`p.rate_limit_key IS NOT NULL AND ${m.eligible}`;
  return sql.fragment`radmit AS (
          SELECT ra.admitted_id AS id
            FROM ${r.admit}(${m.agent}, ${r.nowNs}::float8, ${m.now}, ${m.seed},
                            (SELECT jsonb_agg(jsonb_build_object('id', p.id, 't', p.tenant_key, 'k', p.rate_limit_key) ORDER BY ${m.order}) FROM picked p WHERE ${keyed})) ra
           WHERE EXISTS (SELECT 1 FROM picked p WHERE ${keyed})
        )`;
}

/** The claim's UPDATE's test of a picked row: no rate limit key, or rate_admit let it go. */
export const rateDispatchable = sql.fragment`(picked.rate_limit_key IS NULL OR picked.id IN (SELECT id FROM radmit))`;

/** The claim picked rows of a limited key (among `eligible`) that rate_admit did not let go. Asked of picked first, so a claim without keyed rows never calls rate_admit for it. */
export const rateHeld = (eligible: FragmentSqlToken): FragmentSqlToken =>
  sql.fragment`EXISTS (SELECT 1 FROM picked p WHERE p.rate_limit_key IS NOT NULL AND ${eligible} AND p.id NOT IN (SELECT id FROM radmit))`;

/** The earliest time (epoch ns) a closed key opens, for a claim that found nothing and waits (NULL: none is closed). */
export const nextOpening = sql.fragment`(SELECT min(o) FROM rclosed)`;
