/**
 * Placement: the claim's fit of items with requirements (worker_params.requirements, shapes in
 * ../../domain/resources.ts) to what the claiming agent has free, in the claim's own statement.
 *
 * What is free on the agent, per resource, is the least of
 *   - its registered capacity (metadata.capacity) less what all its in-flight items reserve, and
 *   - what its latest heartbeat reports free (metrics, stamped `at` on arrival) less what the items
 *     dispatched since that heartbeat reserve: those the heartbeat cannot have seen start.
 * The first keeps two in-flight items from ever sharing more of a GPU (or of the CPU, memory, a
 * disk) than the agent has; the second keeps work off what something else on the machine uses.
 * A heartbeat older than the liveness window grants nothing, and a GPU or disk that the heartbeat
 * does not report has nothing free. A reservation is the dispatched row itself (its requirements,
 * and for GPUs the indices it was placed on, gpu_indices), so whatever ends a dispatch releases it.
 *
 * The claim places its picked items in claim order, one after another, each on the GPUs with the
 * least free memory that still hold it (best fit, which keeps the roomiest GPUs for the largest
 * needs): a recursive CTE carries what is still free from one item to the next. An item that does
 * not fit is left pending. A GPU need without gpu_memory_mb takes each GPU whole: only a GPU that
 * no in-flight item reserves, and all of its memory.
 *
 * Race safety: the free figures come from the statement's snapshot, so a claim that places
 * anything also writes the agent's row, with a compare-and-set on the row's version (xmin) as the
 * snapshot read it (`reserve`). Two claims for one agent that read the same state (two daemons,
 * or two calls) serialise on that row's lock, and the second's compare-and-set then matches
 * nothing: it dispatches none of its placed items, and a later claim decides afresh. Every other
 * write of the agent row (heartbeats, drains) changes the version too, which can only make a claim
 * place less.
 *
 * Cost: only a claim that picks an item with requirements reads any of this. The CTEs are read
 * lazily (a CTE runs when a row of it is first asked for) and the picked scan asks for `room` only
 * for a row that has requirements, so a claim of plain items reads none of it.
 */
import { sql, type FragmentSqlToken, type IdentifierSqlToken } from "slonik";

/** What the CTEs read: the tables, the claiming agent, and the epoch ms before which a heartbeat is too old. */
export interface PlacementTerms {
  items: IdentifierSqlToken;
  agents: IdentifierSqlToken;
  agent: string;
  liveEdgeMs: string;
  /**
   * The claim completes items in its own statement (its `completing` CTE): they reserve nothing for
   * it, since they end as it commits. (Its snapshot still shows them dispatched.)
   */
  completing: boolean;
}

/** A resource state as the SQL names it: `room`'s columns, or a step of the recursive placement. */
interface State {
  gfree: FragmentSqlToken;
  gcap: FragmentSqlToken;
  cpu: FragmentSqlToken;
  mem: FragmentSqlToken;
  dfree: FragmentSqlToken;
}

const MIB = sql.fragment`1048576.0`;

/**
 * The CTEs that read the agent's free resources, as `ragent`, `resv`, `rgpu`, `rdisk` and `room`
 * (one row: the agent row's version `v`, whether its heartbeat is `live`, the per-GPU arrays in
 * index order, the per-disk arrays in registration order, and free CPU and memory).
 */
export function roomCtes(t: PlacementTerms): FragmentSqlToken {
  const firstMount = sql.fragment`(SELECT ragent.cap -> 'disks' -> 0 ->> 'mount' FROM ragent)`;
  return sql.fragment`ragent AS (
          SELECT ra.xmin::text AS v, ra.metadata -> 'capacity' AS cap, ra.metrics AS hb,
                 COALESCE((ra.metrics ->> 'at')::float8, 0) * 1e6 AS seen_ns,
                 COALESCE((ra.metrics ->> 'at')::float8 >= ${t.liveEdgeMs}::float8, false) AS live
            FROM ${t.agents} ra WHERE ra.name = ${t.agent}
        ), resv AS (
          -- What the agent's in-flight items reserve, and whether its latest heartbeat came before each started.
          SELECT wd.worker_params -> 'requirements' AS r, wd.gpu_indices AS g, wd.dispatched_at > (SELECT seen_ns FROM ragent) AS unseen
            FROM ${t.items} wd WHERE wd.agent_id = ${t.agent} AND wd.status = 'dispatched' AND wd.worker_params ? 'requirements'
             ${t.completing ? sql.fragment`AND wd.id NOT IN (SELECT id FROM completing)` : sql.fragment``}
        ), rgpu AS (
          SELECT c.idx, c.model, c.total, c.total - u.held AS cap,
                 CASE WHEN h.free IS NULL THEN 0 ELSE LEAST(c.total - u.held, h.free - u.unseen) END AS free
            FROM (SELECT (e ->> 'index')::int AS idx, COALESCE(e ->> 'model', '') AS model, (e ->> 'memoryMb')::int8 AS total
                    FROM ragent, jsonb_array_elements(COALESCE(ragent.cap -> 'gpus', '[]'::jsonb)) e) c
            LEFT JOIN (SELECT (e ->> 'index')::int AS idx, min(floor(((e -> 'memory' ->> 'total')::float8 - (e -> 'memory' ->> 'used')::float8) / ${MIB}))::int8 AS free
                         FROM ragent, jsonb_array_elements(COALESCE(ragent.hb -> 'gpus', '[]'::jsonb)) e GROUP BY 1) h ON h.idx = c.idx
            CROSS JOIN LATERAL (
              SELECT COALESCE(sum(m.mb), 0)::int8 AS held, COALESCE(sum(m.mb) FILTER (WHERE m.unseen), 0)::int8 AS unseen
                FROM (SELECT COALESCE((x.r ->> 'gpuMemoryMb')::int8, c.total) AS mb, x.unseen FROM resv x WHERE c.idx = ANY(x.g)) m) u
        ), rdisk AS (
          SELECT c.ord, c.mount, CASE WHEN h.free IS NULL THEN 0 ELSE LEAST(c.size - u.held, h.free - u.unseen) END AS free
            FROM (SELECT d.e ->> 'mount' AS mount, (d.e ->> 'sizeMb')::int8 AS size, d.ord
                    FROM ragent, jsonb_array_elements(COALESCE(ragent.cap -> 'disks', '[]'::jsonb)) WITH ORDINALITY AS d(e, ord)) c
            LEFT JOIN (SELECT e ->> 'mount' AS mount, min(floor((e ->> 'free')::float8 / ${MIB}))::int8 AS free
                         FROM ragent, jsonb_array_elements(COALESCE(ragent.hb -> 'disks', '[]'::jsonb)) e GROUP BY 1) h ON h.mount = c.mount
            CROSS JOIN LATERAL (
              SELECT COALESCE(sum(m.mb), 0)::int8 AS held, COALESCE(sum(m.mb) FILTER (WHERE m.unseen), 0)::int8 AS unseen
                FROM (SELECT (x.r ->> 'diskMb')::int8 AS mb, x.unseen FROM resv x
                       WHERE x.r ? 'diskMb' AND COALESCE(x.r ->> 'diskMount', ${firstMount}) = c.mount) m) u
        ), room AS (
          SELECT g.v, g.live,
                 ARRAY(SELECT idx FROM rgpu ORDER BY idx) AS gidx, ARRAY(SELECT model FROM rgpu ORDER BY idx) AS gmodel,
                 ARRAY(SELECT total FROM rgpu ORDER BY idx) AS gtotal, ARRAY(SELECT cap FROM rgpu ORDER BY idx) AS gcap,
                 ARRAY(SELECT free FROM rgpu ORDER BY idx) AS gfree,
                 (SELECT COALESCE(max(free), 0) FROM rgpu) AS gmost, (SELECT count(*) FROM rgpu WHERE free > 0) AS gsome,
                 ARRAY(SELECT mount FROM rdisk ORDER BY ord) AS dmount, ARRAY(SELECT free FROM rdisk ORDER BY ord) AS dfree,
                 CASE WHEN g.hb -> 'cpu' IS NULL THEN 0 ELSE
                   LEAST(g.cpucap - (SELECT COALESCE(sum((r ->> 'cpuMillis')::int8), 0) FROM resv),
                         floor(g.cpucap * (1 - (g.hb -> 'cpu' ->> 'utilization')::float8 / 100))::int8
                           - (SELECT COALESCE(sum((r ->> 'cpuMillis')::int8), 0) FROM resv WHERE unseen)) END AS cpu,
                 CASE WHEN g.hb -> 'memory' IS NULL THEN 0 ELSE
                   LEAST(g.memcap - (SELECT COALESCE(sum((r ->> 'memoryMb')::int8), 0) FROM resv),
                         floor(((g.hb -> 'memory' ->> 'total')::float8 - (g.hb -> 'memory' ->> 'used')::float8) / ${MIB})::int8
                           - (SELECT COALESCE(sum((r ->> 'memoryMb')::int8), 0) FROM resv WHERE unseen)) END AS mem
            FROM (SELECT v, live, hb, COALESCE((cap ->> 'cpuMillis')::int8, 0) AS cpucap, COALESCE((cap ->> 'memoryMb')::int8, 0) AS memcap FROM ragent) g
        )`;
}

/** `room`'s state, as a subquery per column (InitPlans, read once and only when asked). */
const ROOM: State & { gidx: FragmentSqlToken; gmodel: FragmentSqlToken; gtotal: FragmentSqlToken; dmount: FragmentSqlToken; live: FragmentSqlToken } = {
  gfree: sql.fragment`(SELECT gfree FROM room)`,
  gcap: sql.fragment`(SELECT gcap FROM room)`,
  cpu: sql.fragment`(SELECT cpu FROM room)`,
  mem: sql.fragment`(SELECT mem FROM room)`,
  dfree: sql.fragment`(SELECT dfree FROM room)`,
  gidx: sql.fragment`(SELECT gidx FROM room)`,
  gmodel: sql.fragment`(SELECT gmodel FROM room)`,
  gtotal: sql.fragment`(SELECT gtotal FROM room)`,
  dmount: sql.fragment`(SELECT dmount FROM room)`,
  live: sql.fragment`(SELECT live FROM room)`,
};

/** GPU subscript `i` of state `s` can hold one GPU share of requirements `r`. */
function gpuHolds(s: State, r: FragmentSqlToken, i: FragmentSqlToken): FragmentSqlToken {
  return sql.fragment`(COALESCE(${r} ->> 'gpuModel', '') = '' OR position(lower(${r} ->> 'gpuModel') IN lower(${ROOM.gmodel}[${i}])) > 0)
                 AND CASE WHEN ${r} ? 'gpuMemoryMb' THEN ${s.gfree}[${i}] >= (${r} ->> 'gpuMemoryMb')::int8
                          ELSE ${s.gcap}[${i}] = ${ROOM.gtotal}[${i}] AND ${s.gfree}[${i}] > 0 END`;
}

/** The subscripts of the GPUs state `s` would place `r` on (best fit), as an int[]: fewer than it needs when it does not fit. */
function gpuChoice(s: State, r: FragmentSqlToken): FragmentSqlToken {
  return sql.fragment`ARRAY(SELECT i FROM generate_subscripts(${s.gfree}, 1) i WHERE ${gpuHolds(s, r, sql.fragment`i`)}
                             ORDER BY ${s.gfree}[i], i LIMIT COALESCE((${r} ->> 'gpus')::int, 0))`;
}

/** The subscript of the disk `r` needs (NULL when the agent has no such mount). */
const diskOf = (r: FragmentSqlToken) => sql.fragment`CASE WHEN ${r} ? 'diskMount' THEN array_position(${ROOM.dmount}, ${r} ->> 'diskMount') ELSE 1 END`;

/** Requirements `r` fit state `s`, given the GPU subscripts `chosen` (gpuChoice). */
function fits(s: State, r: FragmentSqlToken, chosen: FragmentSqlToken): FragmentSqlToken {
  return sql.fragment`(COALESCE((${r} ->> 'cpuMillis')::int8, 0) <= ${s.cpu}
             AND COALESCE((${r} ->> 'memoryMb')::int8, 0) <= ${s.mem}
             AND (NOT ${r} ? 'diskMb' OR COALESCE(${s.dfree}[${diskOf(r)}] >= (${r} ->> 'diskMb')::int8, false))
             AND cardinality(${chosen}) >= COALESCE((${r} ->> 'gpus')::int, 0))`;
}

/**
 * The picked scan's test of a row `w`: no requirements, or they fit what the agent has free now
 * (alone: whether they fit beside the rest of the claim is the placement's question). It keeps rows
 * that cannot be placed from filling the claim's LIMIT ahead of rows that can.
 */
export function fitsNow(w: string): FragmentSqlToken {
  const r = sql.fragment`(${sql.identifier([w])}.worker_params -> 'requirements')`;
  // Bounds first, each a read of the row and a scalar: with the agent's GPUs taken, a backlog of GPU
  // work fails them at the cost of a jsonb read per row, before the walk over the GPUs.
  const bounds = sql.fragment`COALESCE((${r} ->> 'gpus')::int, 0) <= (SELECT gsome FROM room) AND COALESCE((${r} ->> 'gpuMemoryMb')::int8, 0) <= (SELECT gmost FROM room)`;
  return sql.fragment`(${r} IS NULL OR (${ROOM.live} AND ${bounds} AND ${fits(ROOM, r, gpuChoice(ROOM, r))}))`;
}

/**
 * The recursive placement over `need` (id, r: requirements, n: 1.. in claim order), as `fitting`,
 * and `placed` (id, gpus: the GPU indices) for the items that fit.
 */
export function placementCtes(): FragmentSqlToken {
  const s: State = { gfree: sql.fragment`s.gfree`, gcap: sql.fragment`s.gcap`, cpu: sql.fragment`s.cpu`, mem: sql.fragment`s.mem`, dfree: sql.fragment`s.dfree` };
  const r = sql.fragment`nd.r`;
  const take = (col: FragmentSqlToken, whole: FragmentSqlToken) =>
    sql.fragment`CASE WHEN f.ok THEN ARRAY(SELECT CASE WHEN i = ANY(c.sub) THEN CASE WHEN ${r} ? 'gpuMemoryMb' THEN ${col}[i] - (${r} ->> 'gpuMemoryMb')::int8 ELSE ${whole} END ELSE ${col}[i] END
                                           FROM generate_subscripts(${col}, 1) i ORDER BY i) ELSE ${col} END`;
  return sql.fragment`fitting (n, id, gpus, gfree, gcap, cpu, mem, dfree) AS (
          SELECT 0::int8, NULL::text, NULL::int[], room.gfree, room.gcap, room.cpu, room.mem, room.dfree
            FROM room WHERE room.live AND EXISTS (SELECT 1 FROM need)
          UNION ALL
          SELECT s.n + 1, CASE WHEN f.ok THEN nd.id END, CASE WHEN f.ok THEN ARRAY(SELECT ${ROOM.gidx}[i] FROM unnest(c.sub) i ORDER BY 1) END,
                 ${take(s.gfree, sql.fragment`0`)}, ${take(s.gcap, sql.fragment`0`)},
                 s.cpu - CASE WHEN f.ok THEN COALESCE((${r} ->> 'cpuMillis')::int8, 0) ELSE 0 END,
                 s.mem - CASE WHEN f.ok THEN COALESCE((${r} ->> 'memoryMb')::int8, 0) ELSE 0 END,
                 CASE WHEN f.ok AND ${r} ? 'diskMb'
                      THEN ARRAY(SELECT CASE WHEN i = ${diskOf(r)} THEN s.dfree[i] - (${r} ->> 'diskMb')::int8 ELSE s.dfree[i] END FROM generate_subscripts(s.dfree, 1) i ORDER BY i)
                      ELSE s.dfree END
            FROM fitting s JOIN need nd ON nd.n = s.n + 1
            CROSS JOIN LATERAL (SELECT ${gpuChoice(s, r)} AS sub) c
            CROSS JOIN LATERAL (SELECT ${fits(s, r, sql.fragment`c.sub`)} AS ok) f
        ), placed AS (
          SELECT id, gpus FROM fitting WHERE id IS NOT NULL
        )`;
}

/** The claim placed items but another claim wrote the agent's row first: it lost the race for the agent's resources. */
export const placementLost = sql.fragment`(EXISTS (SELECT 1 FROM placed) AND NOT EXISTS (SELECT 1 FROM reserve))`;

/**
 * The compare-and-set that makes a claim's placements its own (see the header): the agent row,
 * written only when something was placed, and only at the version the free figures were read at.
 */
export function reserveCte(t: PlacementTerms, now: FragmentSqlToken): FragmentSqlToken {
  return sql.fragment`reserve AS (
          UPDATE ${t.agents} ra SET updatedon = GREATEST(ra.updatedon, ${now})
           WHERE EXISTS (SELECT 1 FROM placed) AND ra.name = ${t.agent} AND ra.xmin::text = (SELECT v FROM room)
          RETURNING 1
        )`;
}
