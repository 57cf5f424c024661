-- The queue's current turn, as fair share means it (src/domain/fair-share.ts): the turn claims are
-- handing out now. Migration 0009 read it as the earliest turn among due pending items, so one item
-- that no agent takes (an engine kind nobody serves, a rate limit's backlog) held it back for good
-- and every tenant that became busy started that far back, however many items ahead of the tenants
-- being served: unlimited credit. And each tenant that became busy lowered it for the next by the
-- credit (its own first turn became the earliest pending one), so tenants arriving one after
-- another were served last first.
--
-- What must stay true:
--   - A tenant that becomes busy starts no earlier than the turn being handed out to the agents that
--     serve it, less the credit, whatever else is pending: so it is at most the credit ahead of the
--     tenants it shares those agents with.
--   - The current turn never goes back, so tenants that become busy one after another start from
--     the same turn or later ones, in arrival order, never each ahead of the one before.
--   - Agents that serve different tenants (pools) advance apart: a fast pool's turn is no starting
--     point for a tenant of a slow one. So the turn is kept per pool: per list of tenants an agent
--     of several tenants registered with.
--
-- fair_share_turn: one row per such list (pool: md5 of the list as the agent registered it; agents
-- listing the same tenants in another order keep two rows, which advance alike). turn is the latest
-- turn a shared claim (src/store/work-items/fair-share.ts) of such an agent handed out: a claim
-- spends, per tenant, as many turns as it dispatched items of the tenant, the tenant's earliest
-- among its slots, and writes the latest of them here when it is later than the row's. It takes
-- the row with SKIP LOCKED, so claims never wait on each other for it: a claim that finds the row
-- held leaves it to the next one, and the turn lags by at most a claim's batch.
--
-- The row whose pool is '' (tenants empty) is the floor: the current turn of a queue before this
-- migration (the earliest due pending turn, else the latest any tenant took), kept for tenants no
-- pool serves.
CREATE TABLE {{table:fair_share_turn}} (
  id          text PRIMARY KEY,
  pool        text NOT NULL,
  tenants     text[] NOT NULL,
  turn        float8 NOT NULL,
  createdby   text NOT NULL,
  createdon   timestamptz NOT NULL,
  updatedby   text,
  updatedon   timestamptz,
  deletedby   text,
  deletedon   timestamptz,
  CONSTRAINT {{name:fair_share_turn_uq}} UNIQUE (pool)
);
INSERT INTO {{table:fair_share_turn}} (id, pool, tenants, turn, createdby, createdon)
SELECT '00000000000000000000000000', '', '{}',
       COALESCE((SELECT min(f.share_tag) FROM {{table:work_item}} f WHERE f.status = 'pending'),
                (SELECT max(tm.last_tag) FROM {{table:tenant_share}} tm), 0),
       'migration 0015', now();

-- current_turn: a tenant's current turn, the latest turn of the pools that serve it, else (no
-- agent of several tenants has claimed for it) the latest of any pool and the floor. A seq scan
-- of a table with a row per distinct tenant list: few rows. STABLE: it reads the caller's snapshot
-- (stamp_turns is VOLATILE, so each of its statements reads the newest committed turns).
CREATE FUNCTION {{schema}}.{{name:current_turn}}(tenant text) RETURNS float8
LANGUAGE sql STABLE AS $fn$
  SELECT COALESCE((SELECT max(ft.turn) FROM {{table:fair_share_turn}} ft WHERE tenant = ANY(ft.tenants)),
                  (SELECT max(ft.turn) FROM {{table:fair_share_turn}} ft), 0)
$fn$;

-- stamp_turns as in migration 0009, but each tenant's current turn is current_turn's, not the
-- earliest due pending turn. frontier_ns is no longer read: the signature stays, so daemons of
-- either version call the same function.
CREATE OR REPLACE FUNCTION {{schema}}.{{name:stamp_turns}}(tenants text[], counts int[], weights float8[], bys text[], ats timestamptz[], seed text, frontier_ns int8, credit float8,
                                                          OUT lasts float8[], OUT ws float8[])
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  WITH vn AS (
    SELECT vn.*, {{schema}}.{{name:current_turn}}(vn.tenant) AS front
      FROM unnest(tenants, counts, weights, bys, ats) WITH ORDINALITY AS vn(tenant, cnt, config_w, by, at, n)
  ), turned AS (
    INSERT INTO {{table:tenant_share}} AS ts (id, tenant_key, last_tag, createdby, createdon, updatedby, updatedon)
    SELECT overlay(seed placing upper(lpad(to_hex(vn.n::int), 3, '0')) from 11 for 3), vn.tenant,
           vn.front + (vn.cnt - credit) / COALESCE(vn.config_w, 1), vn.by, vn.at, vn.by, vn.at
      FROM vn ORDER BY vn.tenant COLLATE "C"
    ON CONFLICT (tenant_key) DO UPDATE
       SET last_tag = GREATEST(ts.last_tag, (SELECT v2.front FROM vn v2 WHERE v2.tenant = ts.tenant_key)
                                            - credit / COALESCE(ts.weight, (SELECT v2.config_w FROM vn v2 WHERE v2.tenant = ts.tenant_key), 1))
                      + (SELECT v2.cnt FROM vn v2 WHERE v2.tenant = ts.tenant_key) / COALESCE(ts.weight, (SELECT v2.config_w FROM vn v2 WHERE v2.tenant = ts.tenant_key), 1),
           updatedby = EXCLUDED.updatedby, updatedon = EXCLUDED.updatedon
    RETURNING ts.tenant_key, ts.last_tag, COALESCE(ts.weight, (SELECT v2.config_w FROM vn v2 WHERE v2.tenant = ts.tenant_key), 1) AS w
  )
  SELECT array_agg(t.last_tag ORDER BY vn.n), array_agg(t.w ORDER BY vn.n) INTO lasts, ws FROM turned t JOIN vn ON vn.tenant = t.tenant_key;
END
$fn$;
