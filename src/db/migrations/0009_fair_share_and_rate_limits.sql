-- Fair share between tenants, aging, and rate limits (src/domain/fair-share.ts and rate-limits.ts
-- say the rules; src/store/work-items/fair-share.ts and rate-limits.ts how the claim keeps them).
--
-- Three columns on the work item:
--   share_tag       the item's turn among all tenants: its tenant's virtual time when it was
--                   enqueued (one more 1/weight per item of the tenant). A claim of an agent that
--                   serves several tenants hands out turns in share_tag order, and a tenant's turn
--                   goes to its best item by rank, so priority stays strict inside the tenant.
--   rank            the item's place inside its tenant: priority * aging step + enqueue time in
--                   seconds. With a step of S seconds, waiting S seconds is worth one priority
--                   level; with aging off the step is 1e9 s, so priority decides.
--   rate_limit_key  worker_params.rateLimitKey, copied so the claim reads it from the row.
-- Rows already there take share_tag 0 and the rank of aging off: they keep their order. A row
-- written by other means than an enqueue (by hand) has turn 0 and no rank, and ranks last.
ALTER TABLE {{table:work_item}}
  ADD COLUMN share_tag float8 NOT NULL DEFAULT 0,
  ADD COLUMN rank float8,
  ADD COLUMN rate_limit_key text;
UPDATE {{table:work_item}} SET rank = priority * 1e9 + extract(epoch FROM createdon);

-- Turns across tenants, and the best items of one tenant, each in claim order with the due time as
-- the last key (as the claim index has it, migration 0005), so items not yet due are passed over
-- on their index entries. Items of one Enqueue share a rank (their time), so the tenant's index
-- breaks ties by id, which ascends in arrival order: FIFO. Equal turns (of different tenants) need
-- no such order, and every enqueued row pays for these entries, so the turns' index has no id.
CREATE INDEX {{name:work_item_share_idx}} ON {{table:work_item}} (share_tag, (next_attempt_at + 0)) WHERE status = 'pending';
CREATE INDEX {{name:work_item_tenant_rank_idx}} ON {{table:work_item}} (tenant_key, rank, id, (next_attempt_at + 0)) WHERE status = 'pending';

-- One row per tenant that has enqueued: the operator's weight (NULL: the configured one, else 1)
-- and last_tag, the share_tag its latest item took. An enqueue writes its tenants' rows (an upsert
-- that adds 1/weight per item), so tags never collide or go back, on any number of daemons.
CREATE TABLE {{table:tenant_share}} (
  id          text PRIMARY KEY,
  tenant_key  text NOT NULL,
  weight      float8,
  last_tag    float8 NOT NULL DEFAULT 0,
  createdby   text NOT NULL,
  createdon   timestamptz NOT NULL,
  updatedby   text,
  updatedon   timestamptz,
  deletedby   text,
  deletedon   timestamptz,
  CONSTRAINT {{name:tenant_share_uq}} UNIQUE (tenant_key)
);

-- Rate limits and their state, per tenant. A row with limit_count set is an operator's limit for a
-- key (prefix = false) or for every key that starts with `key` (prefix = true): limit_count
-- dispatches per interval_ns, burst at once. A key row (prefix = false) is also the key's state in
-- the generic cell rate algorithm: tat_ns (its theoretical arrival time) and open_ns (the first
-- time another dispatch conforms: tat_ns less the burst's tolerance, stored so a claim finds the
-- keys that are closed now by index). A claim that dispatches items of a key writes its row with an
-- upsert whose condition is re-checked on the row as committed, so no two claims spend one slot.
CREATE TABLE {{table:rate_limit}} (
  id           text PRIMARY KEY,
  tenant_key   text NOT NULL,
  key          text NOT NULL,
  prefix       boolean NOT NULL DEFAULT false,
  limit_count  integer,
  interval_ns  bigint,
  burst        integer,
  tat_ns       float8,
  open_ns      float8,
  createdby    text NOT NULL,
  createdon    timestamptz NOT NULL,
  updatedby    text,
  updatedon    timestamptz,
  deletedby    text,
  deletedon    timestamptz,
  CONSTRAINT {{name:rate_limit_uq}} UNIQUE (tenant_key, key, prefix)
);
CREATE INDEX {{name:rate_limit_open_idx}} ON {{table:rate_limit}} (open_ns) WHERE open_ns IS NOT NULL;

-- rate_rule: the emission interval (ns per dispatch) and tolerance (ns) of a key's limit: the key's
-- own, else its longest prefix's; no row when there is none. A function for the reason key_limit
-- is one (migration 0008): the claim asks it only of rows with a rate limit key.
CREATE FUNCTION {{schema}}.{{name:rate_rule}}(tenant text, rkey text, OUT emit_ns float8, OUT tolerance_ns float8)
LANGUAGE plpgsql STABLE AS $fn$
BEGIN
  SELECT rl.interval_ns::float8 / rl.limit_count, (rl.burst - 1) * (rl.interval_ns::float8 / rl.limit_count)
    INTO emit_ns, tolerance_ns
    FROM {{table:rate_limit}} rl
   WHERE rl.tenant_key = tenant AND rl.limit_count IS NOT NULL
     AND ((NOT rl.prefix AND rl.key = rkey) OR (rl.prefix AND starts_with(rkey, rl.key)))
   ORDER BY rl.prefix, length(rl.key) DESC LIMIT 1;
END
$fn$;

-- rate_admit (at: the claim's time, for the common columns; seed: a fresh ULID the new rows' ids
-- are made from): of a claim's picked rows that carry a rate limit key (`rows`: a jsonb array of
-- {id, t: tenant, k: key} in claim order), the ones the keys' limits let go now, and the spending
-- of their slots. Per key, in (tenant, key) order: with no limit, every row; else the key's row is
-- made if missing and locked, and the first m rows go, m the most that conform at now_ns
-- (base + (m - 1) * emit - tolerance <= now_ns, base the later of tat_ns and now_ns), and the row
-- takes tat_ns = base + m * emit. VOLATILE, so its statements read the newest committed state:
-- after waiting on the lock of a key row that another claim just spent, it counts from what that
-- claim wrote. A function for the reason place is one (migration 0008).
CREATE FUNCTION {{schema}}.{{name:rate_admit}}(agent_name text, now_ns float8, at timestamptz, seed text, rows jsonb)
RETURNS TABLE (admitted_id text)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  g record;
  e float8;
  tol float8;
  tat float8;
  base float8;
  m int;
  n int := 0;
BEGIN
  FOR g IN
    SELECT r.t, r.k, array_agg(r.id ORDER BY r.ord) AS ids
      FROM ROWS FROM (jsonb_to_recordset(rows) AS (id text, t text, k text)) WITH ORDINALITY AS r(id, t, k, ord)
     GROUP BY r.t, r.k ORDER BY r.t COLLATE "C", r.k COLLATE "C"
  LOOP
    SELECT rr.emit_ns, rr.tolerance_ns INTO e, tol FROM {{schema}}.{{name:rate_rule}}(g.t, g.k) rr;
    IF e IS NULL THEN
      RETURN QUERY SELECT unnest(g.ids);
      CONTINUE;
    END IF;
    n := n + 1;
    INSERT INTO {{table:rate_limit}} (id, tenant_key, key, prefix, createdby, createdon)
    VALUES (overlay(seed placing upper(lpad(to_hex(n), 3, '0')) from 11 for 3), g.t, g.k, false, agent_name, at)
    ON CONFLICT (tenant_key, key, prefix) DO NOTHING;
    SELECT rl.tat_ns INTO tat FROM {{table:rate_limit}} rl WHERE rl.tenant_key = g.t AND rl.key = g.k AND NOT rl.prefix FOR UPDATE;
    base := GREATEST(COALESCE(tat, 0), now_ns);
    m := LEAST(cardinality(g.ids), GREATEST(0, floor((now_ns + tol - base) / e)::int + 1));
    IF m > 0 THEN
      UPDATE {{table:rate_limit}} SET tat_ns = base + m * e, open_ns = base + m * e - tol, updatedby = agent_name, updatedon = at
       WHERE tenant_key = g.t AND key = g.k AND NOT prefix;
      RETURN QUERY SELECT unnest(g.ids[1:m]);
    END IF;
  END LOOP;
END
$fn$;

-- stamp_turns: the Enqueue insert's turns (src/store/work-items/fair-share.ts says the rule). Per
-- tenant of the insert (tenants, counts, configured weights or NULL, who and when, in one order),
-- its row in tenant_share is written by one upsert, in tenant order, that adds count / weight to
-- its last turn, from no earlier than the queue's current turn less `credit` items (the earliest
-- due pending turn, else the latest any tenant took). Returns each tenant's new last turn and
-- weight, in the order given. A function for the reason place is one (migration 0008): the insert
-- runs on every Enqueue, and its own plan stays small.
CREATE FUNCTION {{schema}}.{{name:stamp_turns}}(tenants text[], counts int[], weights float8[], bys text[], ats timestamptz[], seed text, frontier_ns int8, credit float8,
                                               OUT lasts float8[], OUT ws float8[])
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  front float8;
BEGIN
  SELECT f.share_tag INTO front FROM {{table:work_item}} f
   WHERE f.status = 'pending' AND f.next_attempt_at + 0 <= frontier_ns ORDER BY f.share_tag LIMIT 1;
  IF front IS NULL THEN
    SELECT max(tm.last_tag) INTO front FROM {{table:tenant_share}} tm;
  END IF;
  front := COALESCE(front, 0);
  WITH vn AS (
    SELECT * FROM unnest(tenants, counts, weights, bys, ats) WITH ORDINALITY AS vn(tenant, cnt, config_w, by, at, n)
  ), turned AS (
    INSERT INTO {{table:tenant_share}} AS ts (id, tenant_key, last_tag, createdby, createdon, updatedby, updatedon)
    SELECT overlay(seed placing upper(lpad(to_hex(vn.n::int), 3, '0')) from 11 for 3), vn.tenant,
           front + (vn.cnt - credit) / COALESCE(vn.config_w, 1), vn.by, vn.at, vn.by, vn.at
      FROM vn ORDER BY vn.tenant COLLATE "C"
    ON CONFLICT (tenant_key) DO UPDATE
       SET last_tag = GREATEST(ts.last_tag, front - credit / COALESCE(ts.weight, (SELECT v2.config_w FROM vn v2 WHERE v2.tenant = ts.tenant_key), 1))
                      + (SELECT v2.cnt FROM vn v2 WHERE v2.tenant = ts.tenant_key) / COALESCE(ts.weight, (SELECT v2.config_w FROM vn v2 WHERE v2.tenant = ts.tenant_key), 1),
           updatedby = EXCLUDED.updatedby, updatedon = EXCLUDED.updatedon
    RETURNING ts.tenant_key, ts.last_tag, COALESCE(ts.weight, (SELECT v2.config_w FROM vn v2 WHERE v2.tenant = ts.tenant_key), 1) AS w
  )
  SELECT array_agg(t.last_tag ORDER BY vn.n), array_agg(t.w ORDER BY vn.n) INTO lasts, ws FROM turned t JOIN vn ON vn.tenant = t.tenant_key;
END
$fn$;
