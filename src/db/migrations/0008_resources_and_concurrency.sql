-- Dispatch that fits the work to the agent (see src/store/work-items/placement.ts and concurrency.ts).
--
-- What an item needs (worker_params.requirements) and the key it shares a limit with
-- (worker_params.concurrencyKey) live in worker_params, as its selector does. Two columns more:
--   gpu_indices      the GPUs (by the agent's index) the current or last dispatch placed the item on.
--                    While the item is dispatched, those GPUs' memory is reserved for it: a
--                    reservation is nothing but a dispatched row, so every path that ends a dispatch
--                    (complete, fail, release, expiry, an agent gone, a drain deadline, cancel)
--                    releases it by changing the status, with no bookkeeping to forget.
--   concurrency_key  worker_params.concurrencyKey, copied (as affinity_key is) so the claim counts a
--                    key's dispatched items by index.
ALTER TABLE {{table:work_item}}
  ADD COLUMN gpu_indices integer[],
  ADD COLUMN concurrency_key text;

-- A key's items by status (the claim's count of one key's in flight, the ops listing's pending), and
-- every key's items in flight at once (the claim's set of full keys), without reading finished ones.
CREATE INDEX {{name:work_item_concurrency_idx}} ON {{table:work_item}} (tenant_key, concurrency_key, status) WHERE concurrency_key IS NOT NULL;
CREATE INDEX {{name:work_item_concurrency_dispatched_idx}} ON {{table:work_item}} (tenant_key, concurrency_key) WHERE concurrency_key IS NOT NULL AND status = 'dispatched';

-- One row per concurrency key a claim has dispatched (prefix = false), and the limits operators set
-- per key or per key prefix (prefix = true: every key that starts with `key`).
--   max_in_flight  an operator's limit, over the items' own; NULL on a key row: the items' own.
-- A claim that dispatches a key's items writes the key's row (creating it on the key's first
-- dispatch) with a compare-and-set on its version, as a claim writes an affinity binding: two claims
-- that counted the key's in-flight items in the same state cannot both commit dispatches of it.
CREATE TABLE {{table:concurrency_key}} (
  id            text PRIMARY KEY,
  tenant_key    text NOT NULL,
  key           text NOT NULL,
  prefix        boolean NOT NULL DEFAULT false,
  max_in_flight integer,
  createdby     text NOT NULL,
  createdon     timestamptz NOT NULL,
  updatedby     text,
  updatedon     timestamptz,
  deletedby     text,
  deletedon     timestamptz,
  CONSTRAINT {{name:concurrency_key_uq}} UNIQUE (tenant_key, key, prefix)
);

-- What the claiming agent has free, and the placement of a claim's items on it: functions, so that
-- their plans are compiled once per connection and stay out of the claim statement's own plan (a
-- claim of plain work, which calls neither, would otherwise set up every node of them on every
-- run). src/store/work-items/placement.ts says what they compute and why.
--
-- agent_room: one row of the agent's free resources. STABLE: it reads the calling statement's
-- snapshot, so the figures and the row version it returns are those the claim's compare-and-set
-- checks. `ending`: items the calling claim completes in its own statement (they reserve nothing).
CREATE FUNCTION {{schema}}.{{name:agent_room}}(agent_name text, live_edge_ms float8, ending text[])
RETURNS TABLE (room_v text, room_live boolean, room_gidx int[], room_gmodel text[], room_gtotal int8[], room_gcap int8[], room_gfree int8[],
               room_gmost int8, room_gsome int8, room_dmount text[], room_dfree int8[], room_cpu int8, room_mem int8)
LANGUAGE plpgsql STABLE AS $fn$
BEGIN
  RETURN QUERY
  WITH ragent AS (
    SELECT ra.xmin::text AS v, ra.metadata -> 'capacity' AS cap, ra.metrics AS hb,
           COALESCE((ra.metrics ->> 'at')::float8, 0) * 1e6 AS seen_ns,
           COALESCE((ra.metrics ->> 'at')::float8 >= live_edge_ms, false) AS live
      FROM {{table:agent}} ra WHERE ra.name = agent_name
  ), resv AS (
    -- What the agent's in-flight items reserve, and whether its latest heartbeat came before each started.
    SELECT wd.worker_params -> 'requirements' AS r, wd.gpu_indices AS g, wd.dispatched_at > (SELECT seen_ns FROM ragent) AS unseen
      FROM {{table:work_item}} wd
     WHERE wd.agent_id = agent_name AND wd.status = 'dispatched' AND wd.worker_params ? 'requirements' AND wd.id <> ALL(ending)
  ), rgpu AS (
    SELECT c.idx, c.model, c.total, c.total - u.held AS cap,
           CASE WHEN h.free IS NULL THEN 0 ELSE LEAST(c.total - u.held, h.free - u.unseen) END AS free
      FROM (SELECT (e ->> 'index')::int AS idx, COALESCE(e ->> 'model', '') AS model, (e ->> 'memoryMb')::int8 AS total
              FROM ragent, jsonb_array_elements(COALESCE(ragent.cap -> 'gpus', '[]'::jsonb)) e) c
      LEFT JOIN (SELECT (e ->> 'index')::int AS idx, min(floor(((e -> 'memory' ->> 'total')::float8 - (e -> 'memory' ->> 'used')::float8) / 1048576.0))::int8 AS free
                   FROM ragent, jsonb_array_elements(COALESCE(ragent.hb -> 'gpus', '[]'::jsonb)) e GROUP BY 1) h ON h.idx = c.idx
      CROSS JOIN LATERAL (
        SELECT COALESCE(sum(m.mb), 0)::int8 AS held, COALESCE(sum(m.mb) FILTER (WHERE m.unseen), 0)::int8 AS unseen
          FROM (SELECT COALESCE((x.r ->> 'gpuMemoryMb')::int8, c.total) AS mb, x.unseen FROM resv x WHERE c.idx = ANY(x.g)) m) u
  ), rdisk AS (
    SELECT c.ord, c.mount, CASE WHEN h.free IS NULL THEN 0 ELSE LEAST(c.size - u.held, h.free - u.unseen) END AS free
      FROM (SELECT d.e ->> 'mount' AS mount, (d.e ->> 'sizeMb')::int8 AS size, d.ord
              FROM ragent, jsonb_array_elements(COALESCE(ragent.cap -> 'disks', '[]'::jsonb)) WITH ORDINALITY AS d(e, ord)) c
      LEFT JOIN (SELECT e ->> 'mount' AS mount, min(floor((e ->> 'free')::float8 / 1048576.0))::int8 AS free
                   FROM ragent, jsonb_array_elements(COALESCE(ragent.hb -> 'disks', '[]'::jsonb)) e GROUP BY 1) h ON h.mount = c.mount
      CROSS JOIN LATERAL (
        SELECT COALESCE(sum(m.mb), 0)::int8 AS held, COALESCE(sum(m.mb) FILTER (WHERE m.unseen), 0)::int8 AS unseen
          FROM (SELECT (x.r ->> 'diskMb')::int8 AS mb, x.unseen FROM resv x
                 WHERE x.r ? 'diskMb' AND COALESCE(x.r ->> 'diskMount', (SELECT ragent.cap -> 'disks' -> 0 ->> 'mount' FROM ragent)) = c.mount) m) u
  )
  SELECT g.v, g.live,
         ARRAY(SELECT idx FROM rgpu ORDER BY idx), ARRAY(SELECT model FROM rgpu ORDER BY idx),
         ARRAY(SELECT total FROM rgpu ORDER BY idx), ARRAY(SELECT cap FROM rgpu ORDER BY idx), ARRAY(SELECT free FROM rgpu ORDER BY idx),
         (SELECT COALESCE(max(free), 0)::int8 FROM rgpu), (SELECT count(*)::int8 FROM rgpu WHERE free > 0),
         ARRAY(SELECT mount FROM rdisk ORDER BY ord), ARRAY(SELECT free FROM rdisk ORDER BY ord),
         CASE WHEN g.hb -> 'cpu' IS NULL THEN 0::int8 ELSE
           LEAST(g.cpucap - (SELECT COALESCE(sum((r ->> 'cpuMillis')::int8), 0) FROM resv),
                 floor(g.cpucap * (1 - (g.hb -> 'cpu' ->> 'utilization')::float8 / 100))::int8
                   - (SELECT COALESCE(sum((r ->> 'cpuMillis')::int8), 0) FROM resv WHERE unseen))::int8 END,
         CASE WHEN g.hb -> 'memory' IS NULL THEN 0::int8 ELSE
           LEAST(g.memcap - (SELECT COALESCE(sum((r ->> 'memoryMb')::int8), 0) FROM resv),
                 floor(((g.hb -> 'memory' ->> 'total')::float8 - (g.hb -> 'memory' ->> 'used')::float8) / 1048576.0)::int8
                   - (SELECT COALESCE(sum((r ->> 'memoryMb')::int8), 0) FROM resv WHERE unseen))::int8 END
    FROM (SELECT v, live, hb, COALESCE((cap ->> 'cpuMillis')::int8, 0) AS cpucap, COALESCE((cap ->> 'memoryMb')::int8, 0) AS memcap FROM ragent) g;
END
$fn$;

-- place: the claim's items (`need`: [{id, r: requirements}] in claim order) placed one after another
-- on what `agent_room` found free, each on the GPUs with the least free memory that still hold it;
-- the items that fit, with the GPU indices they were placed on. A GPU need without gpuMemoryMb
-- takes each GPU whole (one nothing reserves). Pure computation over its arguments.
CREATE FUNCTION {{schema}}.{{name:place}}(gidx int[], gmodel text[], gtotal int8[], gcap int8[], gfree int8[], dmount text[], dfree int8[],
                                          cpu int8, mem int8, need jsonb)
RETURNS TABLE (placed_id text, placed_gpus int[])
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
  item jsonb;
  r jsonb;
  want int;
  mb int8;
  model text;
  chosen int[];
  i int;
  d int;
  ok boolean;
BEGIN
  FOR item IN SELECT e FROM jsonb_array_elements(need) e LOOP
    r := item -> 'r';
    want := COALESCE((r ->> 'gpus')::int, 0);
    mb := (r ->> 'gpuMemoryMb')::int8;
    model := lower(COALESCE(r ->> 'gpuModel', ''));
    ok := COALESCE((r ->> 'cpuMillis')::int8, 0) <= cpu AND COALESCE((r ->> 'memoryMb')::int8, 0) <= mem;
    d := NULL;
    IF ok AND r ? 'diskMb' THEN
      d := CASE WHEN r ? 'diskMount' THEN array_position(dmount, r ->> 'diskMount') ELSE 1 END;
      ok := d IS NOT NULL AND COALESCE(dfree[d] >= (r ->> 'diskMb')::int8, false);
    END IF;
    chosen := '{}';
    IF ok AND want > 0 THEN
      chosen := ARRAY(SELECT s FROM generate_subscripts(gfree, 1) s
                       WHERE (model = '' OR position(model IN lower(gmodel[s])) > 0)
                         AND CASE WHEN mb IS NOT NULL THEN gfree[s] >= mb ELSE gcap[s] = gtotal[s] AND gfree[s] > 0 END
                       ORDER BY gfree[s], s LIMIT want);
      ok := cardinality(chosen) >= want;
    END IF;
    IF ok THEN
      FOREACH i IN ARRAY chosen LOOP
        IF mb IS NOT NULL THEN
          gfree[i] := gfree[i] - mb;
          gcap[i] := gcap[i] - mb;
        ELSE
          gfree[i] := 0;
          gcap[i] := 0;
        END IF;
      END LOOP;
      cpu := cpu - COALESCE((r ->> 'cpuMillis')::int8, 0);
      mem := mem - COALESCE((r ->> 'memoryMb')::int8, 0);
      IF d IS NOT NULL THEN
        dfree[d] := dfree[d] - (r ->> 'diskMb')::int8;
      END IF;
      placed_id := item ->> 'id';
      placed_gpus := ARRAY(SELECT gidx[s] FROM unnest(chosen) s ORDER BY 1);
      RETURN NEXT;
    END IF;
  END LOOP;
END
$fn$;

-- key_limit: an operator's limit for a concurrency key: the key's own, else its longest prefix's;
-- NULL when there is none (the items' own apply: src/domain/concurrency.ts). A function for the
-- reason agent_room is one: the claim asks it only of keyed rows, and its plan stays out of the
-- claim's.
CREATE FUNCTION {{schema}}.{{name:key_limit}}(tenant text, ckey text) RETURNS int
LANGUAGE plpgsql STABLE AS $fn$
BEGIN
  RETURN (SELECT kl.max_in_flight FROM {{table:concurrency_key}} kl
           WHERE kl.tenant_key = tenant AND kl.max_in_flight IS NOT NULL
             AND ((NOT kl.prefix AND kl.key = ckey) OR (kl.prefix AND starts_with(ckey, kl.key)))
           ORDER BY kl.prefix, length(kl.key) DESC LIMIT 1);
END
$fn$;
