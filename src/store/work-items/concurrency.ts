/**
 * Concurrency keys in the claim statement: at no moment are more items of a key dispatched than
 * its limit (../../domain/concurrency.ts says which limit), whichever daemons and agents hold them.
 *
 * In flight is counted, not kept: the key's dispatched rows, by index (migration 0008). So every
 * path that ends a dispatch frees the key's slot by changing the item's status, and nothing can be
 * left holding a slot. The count is the statement's snapshot's, so a claim that dispatches items of
 * a key also writes the key's row (aiflow_concurrency_key), in one upsert per key (`kwritten`):
 *   - a key without a row gets one: of two claims racing for a key's first dispatch, one insert
 *     wins, and the other meets its row on conflict, which it did not read (its version is NULL
 *     to it), so it writes nothing and dispatches none of the key's items;
 *   - a key with a row is written with a compare-and-set on the row's version (xmin) as the
 *     snapshot read it: two claims that counted in the same state serialise on the row's lock,
 *     and the second's compare-and-set (re-checked on the row as committed) matches nothing, so
 *     it dispatches none of the key's items.
 * Either way, a dispatch of a key commits only from a count no other committed dispatch of the key
 * has changed since; an item ending meanwhile only makes a count too high, never too low.
 *
 * The claim admits a key's picked items in claim order while in-flight plus their rank stays within
 * the limit; the picked scan already passes over items of a key that is full in its snapshot, so a
 * full key's backlog does not fill the claim's LIMIT ahead of other work.
 */
import { sql, type FragmentSqlToken, type IdentifierSqlToken } from "slonik";

export interface KeyTerms {
  items: IdentifierSqlToken;
  keys: IdentifierSqlToken;
  /** The claim completes items in its own statement (`completing`): they hold no slot for it, ending as it commits. */
  completing: boolean;
  /** The function key_limit (migration 0008), where the operator-limit rule is written. */
  keyLimit: IdentifierSqlToken;
}

/**
 * The operator's limit for a key (tenant and key expressions): the key's own, else its longest
 * prefix's; NULL when there is none.
 */
export function operatorLimit(k: KeyTerms, tenant: FragmentSqlToken, key: FragmentSqlToken): FragmentSqlToken {
  return sql.fragment`${k.keyLimit}(${tenant}, ${key})`;
}

/** The key's dispatched items, counted by index. */
export function inFlight(k: KeyTerms, tenant: FragmentSqlToken, key: FragmentSqlToken): FragmentSqlToken {
  const ending = k.completing ? sql.fragment` AND kd.id NOT IN (SELECT id FROM completing)` : sql.fragment``;
  return sql.fragment`(SELECT count(*) FROM ${k.items} kd WHERE kd.tenant_key = ${tenant} AND kd.concurrency_key = ${key} AND kd.status = 'dispatched'${ending})`;
}

/** The limit an item (row `w`) is held to. */
export function itemLimit(k: KeyTerms, w: string): FragmentSqlToken {
  const a = sql.identifier([w]);
  return sql.fragment`COALESCE(${operatorLimit(k, sql.fragment`${a}.tenant_key`, sql.fragment`${a}.concurrency_key`)}, (${a}.worker_params ->> 'maxInFlight')::int, 1)`;
}

/**
 * The keys in flight as the claim's scan asks of them, as `kfull` (every key with an operator's
 * limit it has reached) and `kbusy` (for each key without one, (tenant, key, L) for L from 1 to its
 * in-flight count: an item stating limit L is full when its triple is there). Both are read as
 * hashed sets, built once per statement when the scan first meets a keyed row, from the partial
 * index of dispatched keyed rows; so a backlog of a full key costs the scan a hash probe per row,
 * not a count per row.
 */
export function keySetCtes(k: KeyTerms): FragmentSqlToken {
  const ending = k.completing ? sql.fragment` AND kd.id NOT IN (SELECT id FROM completing)` : sql.fragment``;
  return sql.fragment`kcount AS (
          SELECT c.t, c.k, c.n, ${operatorLimit(k, sql.fragment`c.t`, sql.fragment`c.k`)} AS ops
            FROM (SELECT kd.tenant_key AS t, kd.concurrency_key AS k, count(*) AS n FROM ${k.items} kd
                   WHERE kd.concurrency_key IS NOT NULL AND kd.status = 'dispatched'${ending} GROUP BY 1, 2) c
        ), kfull AS (
          SELECT t, k FROM kcount WHERE n >= ops
        ), kbusy AS (
          SELECT t, k, l::int AS l FROM kcount, generate_series(1, n) l WHERE ops IS NULL
        )`;
}

/**
 * The picked scan's test of a row `w`: no key, or its key has room in the snapshot. The key's full
 * when an operator's limit is reached (kfull), or, without one, when the row's own limit is
 * (kbusy); a key with an operator's limit it has not reached has room whatever the row states.
 */
export function keyHasRoom(w: string): FragmentSqlToken {
  const a = sql.identifier([w]);
  return sql.fragment`(${a}.concurrency_key IS NULL
             OR ((${a}.tenant_key, ${a}.concurrency_key) NOT IN (SELECT t, k FROM kfull)
                 AND (${a}.tenant_key, ${a}.concurrency_key, COALESCE((${a}.worker_params ->> 'maxInFlight')::int, 1)) NOT IN (SELECT t, k, l FROM kbusy)))`;
}

/**
 * The CTEs over the claim's `picked` (which carries tenant_key, concurrency_key, own_limit and the
 * claim-order columns, ordered by `order`): `ckeys`, each picked key with its row's version and in-flight count;
 * `kadmit`, the picked items within their key's limit; `kwritten`, the key rows this
 * claim created or moved (see the header). `rowId(n)` makes the n-th new row's id.
 */
export function keyCtes(
  k: KeyTerms,
  m: { agent: string; now: FragmentSqlToken; rowId: (n: FragmentSqlToken) => FragmentSqlToken; order: FragmentSqlToken },
): FragmentSqlToken {
  const ck = sql.fragment`${k.keys}`;
  return sql.fragment`ckeys AS (
          -- In flight as the scan's kcount counted it (the same snapshot, the same completions left out):
          -- a picked keyed row means the scan asked kcount already.
          SELECT d.t, d.k, kr.xmin::text AS v, COALESCE(kc.n, 0) AS in_flight,
                 ${operatorLimit(k, sql.fragment`d.t`, sql.fragment`d.k`)} AS ops_limit, row_number() OVER (ORDER BY d.t, d.k) AS n
            FROM (SELECT DISTINCT tenant_key AS t, concurrency_key AS k FROM picked WHERE concurrency_key IS NOT NULL) d
            LEFT JOIN ${ck} kr ON kr.tenant_key = d.t AND kr.key = d.k AND NOT kr.prefix
            LEFT JOIN kcount kc ON kc.t = d.t AND kc.k = d.k
        ), kadmit AS (
          SELECT r.id, r.t, r.k FROM (
            SELECT p.id, p.tenant_key AS t, p.concurrency_key AS k, p.own_limit,
                   row_number() OVER (PARTITION BY p.tenant_key, p.concurrency_key ORDER BY ${m.order}) AS rank
              FROM picked p WHERE p.concurrency_key IS NOT NULL) r
            JOIN ckeys ON ckeys.t = r.t AND ckeys.k = r.k
           WHERE ckeys.in_flight + r.rank <= COALESCE(ckeys.ops_limit, r.own_limit, 1)
        ), kwritten AS (
          -- One write per admitted key: the insert of its first row, or, when it has one, the
          -- compare-and-set on the version this statement's snapshot read (NULL when it read none:
          -- a row another claim inserted meanwhile is not this claim's to take).
          INSERT INTO ${ck} AS kk (id, tenant_key, key, prefix, createdby, createdon, updatedby, updatedon)
          SELECT ${m.rowId(sql.fragment`ckeys.n`)}, ckeys.t, ckeys.k, false, ${m.agent}, ${m.now}, ${m.agent}, ${m.now}
            FROM ckeys WHERE EXISTS (SELECT 1 FROM kadmit WHERE kadmit.t = ckeys.t AND kadmit.k = ckeys.k)
          ON CONFLICT (tenant_key, key, prefix) DO UPDATE SET updatedby = EXCLUDED.updatedby, updatedon = EXCLUDED.updatedon
           WHERE kk.xmin::text = (SELECT c.v FROM ckeys c WHERE c.t = kk.tenant_key AND c.k = kk.key)
          RETURNING kk.tenant_key AS t, kk.key AS k
        )`;
}

/**
 * The claim admitted items of a key whose row another claim wrote first: it lost the race for that
 * key. Asked of `ckeys` first, which a claim without keyed items has empty, so such a claim never
 * computes `kadmit`.
 */
export const keysLost = sql.fragment`EXISTS (SELECT 1 FROM ckeys) AND EXISTS (SELECT 1 FROM kadmit
                 WHERE (kadmit.t, kadmit.k) NOT IN (SELECT t, k FROM kwritten))`;

/** The claim's UPDATE's test of a picked row: no key, or admitted and its key's row written by this claim. */
export const keyDispatchable = sql.fragment`(picked.concurrency_key IS NULL
                OR (picked.id IN (SELECT id FROM kadmit)
                    AND (picked.tenant_key, picked.concurrency_key) IN (SELECT t, k FROM kwritten)))`;
