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
 * needs), what is still free carried from one item to the next. An item that does not fit is left
 * pending. A GPU need without gpu_memory_mb takes each GPU whole: only a GPU that
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
 * Where it is computed: the free figures by the function agent_room, the placement by the function
 * place (both in migration 0008, which holds their SQL). As functions their plans are compiled once
 * per connection and stay out of the claim statement's own plan: a claim of plain work calls
 * neither, and its plan would otherwise set up every node of them on every run (most of a plain
 * claim's time, measured). agent_room is STABLE, so it reads the claim's own snapshot.
 *
 * Cost: only a claim that picks an item with requirements reads any of this. The `room` CTE runs
 * when a row of it is first asked for, and the picked scan asks only for a row that has
 * requirements, so a claim of plain items calls nothing.
 */
import { sql, type FragmentSqlToken, type IdentifierSqlToken } from "slonik";

/** What the CTEs read: the tables, the functions, the claiming agent, and the epoch ms before which a heartbeat is too old. */
export interface PlacementTerms {
  agents: IdentifierSqlToken;
  room: IdentifierSqlToken;
  place: IdentifierSqlToken;
  agent: string;
  liveEdgeMs: string;
  /**
   * The claim completes items in its own statement (its `completing` CTE): they reserve nothing for
   * it, since they end as it commits. (Its snapshot still shows them dispatched.)
   */
  completing: boolean;
}

/**
 * `room`: one row of the agent's free resources (agent_room): the agent row's version `v`, whether
 * its heartbeat is `live`, per-GPU arrays in index order (gidx, gmodel, gtotal, gcap: capacity less
 * reservations, gfree: what may be given), the most free on one GPU (gmost) and how many GPUs have
 * any (gsome), per-disk arrays in registration order, and free CPU and memory.
 */
export function roomCte(t: PlacementTerms): FragmentSqlToken {
  const ending = t.completing ? sql.fragment`COALESCE((SELECT array_agg(id) FROM completing), '{}')` : sql.fragment`'{}'::text[]`;
  return sql.fragment`room AS (
          SELECT room_v AS v, room_live AS live, room_gidx AS gidx, room_gmodel AS gmodel, room_gtotal AS gtotal, room_gcap AS gcap,
                 room_gfree AS gfree, room_gmost AS gmost, room_gsome AS gsome, room_dmount AS dmount, room_dfree AS dfree,
                 room_cpu AS cpu, room_mem AS mem
            FROM ${t.room}(${t.agent}, ${t.liveEdgeMs}::float8, ${ending})
        )`;
}

/**
 * The picked scan's test of a row `w`: no requirements, or they are within what the agent has
 * free now: a heartbeat that grants, enough GPUs with any room and one with the memory, the CPU
 * and the memory. Bounds, each a read of the row against a scalar: whether the row fits beside
 * the rest of the claim, on which GPUs, is the placement's question. They keep a backlog that
 * cannot be placed now from filling the claim's LIMIT ahead of rows that can.
 */
export function fitsNow(w: string): FragmentSqlToken {
  const r = sql.fragment`(${sql.identifier([w])}.worker_params -> 'requirements')`;
  return sql.fragment`(${r} IS NULL OR ((SELECT live FROM room)
             AND COALESCE((${r} ->> 'gpus')::int, 0) <= (SELECT gsome FROM room)
             AND COALESCE((${r} ->> 'gpuMemoryMb')::int8, 0) <= (SELECT gmost FROM room)
             AND COALESCE((${r} ->> 'cpuMillis')::int8, 0) <= (SELECT cpu FROM room)
             AND COALESCE((${r} ->> 'memoryMb')::int8, 0) <= (SELECT mem FROM room)))`;
}

/** `placed` (id, gpus: the GPU indices) for the items of `need` (id, r: requirements, n: 1.. in claim order) that fit, by place(). */
export function placedCte(t: PlacementTerms): FragmentSqlToken {
  return sql.fragment`placed AS (
          SELECT pl.placed_id AS id, pl.placed_gpus AS gpus
            FROM room, ${t.place}(room.gidx, room.gmodel, room.gtotal, room.gcap, room.gfree, room.dmount, room.dfree, room.cpu, room.mem,
                                   (SELECT jsonb_agg(jsonb_build_object('id', need.id, 'r', need.r) ORDER BY need.n) FROM need)) pl
           WHERE EXISTS (SELECT 1 FROM need) AND room.live
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
