/**
 * Fair share in the statements (the rules: ../../domain/fair-share.ts).
 *
 * Turns are stamped at enqueue. The insert writes each of its tenants' tenant_share rows with one
 * upsert that adds 1/weight per item (so two daemons' inserts for one tenant serialise on the row
 * and their turns never collide), starting no earlier than the queue's current turn less the
 * credit: the earliest turn among due pending items, or, with none, the latest any tenant took.
 * Each row's share_tag is its tenant's turn as the upsert returned it, counted back per row.
 *
 * A claim by an agent that serves several tenants (`sharedPicks`) takes `max` turns: the due items
 * it may take, in share_tag order (the share index), which says how many items each tenant gets. A
 * tenant's items are then its best ones by rank (the tenant index), so priority and aging decide
 * inside the tenant. A turn whose item was passed over for a better one of its tenant is not
 * spent: the passed-over item takes the turn of the item that went in its place (`retagCte`), so
 * the tenant's pending turns are what they would have been had its turns gone in order. Both scans
 * stop at `max` rows, so a claim reads at most 2 × max index entries past the ones it cannot take,
 * however many tenants have a backlog.
 *
 * The queue's current turn, from which a tenant that becomes busy starts (less the credit), is the
 * turn shared claims hand out (migration 0015): each shared claim writes the latest turn it spent to
 * its agent's pool's row in fair_share_turn (`advanceCtes`), and the enqueue's stamp_turns reads the
 * latest turn of the pools that serve the tenant. Not the earliest pending turn: an item no agent
 * takes would hold that back, and every newly busy tenant would start that far back. Limits: an
 * item an enqueue hands to a waiting claim (./enqueue.ts) advances no pool's turn (the pool's next
 * claim does), and a pool row outlives its agents, so a tenant starts from the latest turn of any
 * list of tenants that included it, even one whose agents are gone.
 */
import { sql, type FragmentSqlToken, type IdentifierSqlToken, type ValueExpression } from "slonik";
import type { ItemsContext } from "./context.js";
import { nthId } from "./sql-ids.js";

/** The enqueue's markers these CTEs read. */
export interface TurnParams {
  shareSeed: ValueExpression;
  frontierNs: ValueExpression;
  credit: ValueExpression;
  /** Per tenant of the insert: its key, how many rows it has, its configured weight (or null), and who enqueued. */
  turnTenants: ValueExpression;
  turnCounts: ValueExpression;
  turnWeights: ValueExpression;
  turnBys: ValueExpression;
  turnAts: ValueExpression;
}

/**
 * What the insert's turns need, computed here rather than per row in SQL: per tenant of the rows
 * (in first-seen order), its count, configured weight and first row's author and time; per row, its tenant's
 * place in that list (1-based) and how many later rows of its tenant the insert has.
 */
export function turnInputs(rows: readonly { tenant: string; by: string; nowMs: number }[], weights: ReadonlyMap<string, number>) {
  const index = new Map<string, number>();
  const turnTenants: string[] = [];
  const turnCounts: number[] = [];
  const turnBys: string[] = [];
  const turnAts: string[] = [];
  const turnTenant: number[] = [];
  for (const r of rows) {
    let i = index.get(r.tenant);
    if (i === undefined) {
      i = turnTenants.length;
      index.set(r.tenant, i);
      turnTenants.push(r.tenant);
      turnCounts.push(0);
      turnBys.push(r.by);
      turnAts.push(new Date(r.nowMs).toISOString());
    }
    turnCounts[i]!++;
    turnTenant.push(i + 1);
  }
  const seen = new Array<number>(turnTenants.length).fill(0);
  const turnBack = turnTenant.map((t) => turnCounts[t - 1]! - ++seen[t - 1]!);
  return { turnTenants, turnCounts, turnWeights: turnTenants.map((t) => weights.get(t) ?? null), turnBys, turnAts, turnTenant, turnBack };
}

/**
 * The insert's CTE after its rows `v`: `turns`, its tenants' last turns and weights as arrays in the
 * tenants' order, from the function stamp_turns (migration 0009, which holds the upsert), read by
 * `turnOf` through an InitPlan, so every tenant row is written (and locked, in tenant order) before
 * any item row goes in: two inserts never hold one's item and wait for the other's tenant.
 */
export function turnCtes(q: ItemsContext, p: TurnParams): FragmentSqlToken {
  // The function's name carries the schema: it names it within pg_stat_activity's first 1 KiB of the statement (tests find it there).
  return sql.fragment`turns AS (
          SELECT * FROM ${q.t.routine("stamp_turns")}(${sql.array(p.turnTenants as string[], "text")}, ${sql.array(p.turnCounts as number[], "int4")},
                        ${sql.array(p.turnWeights as (number | null)[], "float8")}, ${sql.array(p.turnBys as string[], "text")},
                        ${sql.array(p.turnAts as string[], "timestamptz")}, ${p.shareSeed}, ${p.frontierNs}, ${p.credit}::float8)
        )`;
}

/** A row's turn (`v` the insert's rows): its tenant's last turn, counted back 1/weight per later row of the tenant in the insert. */
export function turnOf(v: FragmentSqlToken): FragmentSqlToken {
  return sql.fragment`(SELECT lasts FROM turns)[${v}.tord] - ${v}.back / (SELECT ws FROM turns)[${v}.tord]`;
}

/** How the claim's picked rows are chosen and ordered. */
export type ClaimShape = "priority" | "rank" | "shared";

export interface PickTerms {
  items: IdentifierSqlToken;
  /** The claim rule's tests of a row `w` (everything but order and LIMIT). */
  takeable: FragmentSqlToken;
  /** The same for a row of a tenant the agent is known to serve (a tenant of `slots`): all but that test. */
  takeableInTenant: FragmentSqlToken;
  /** The columns picked carries, over `w`. */
  columns: FragmentSqlToken;
  max: number;
}

/**
 * The claim's `picked` CTE (preceded, when shared, by `slots` and `tturns`). "priority": the claim
 * index's order, (priority, createdon, id), for an agent of one tenant without aging; "rank": that
 * tenant's items by rank on the tenant index; "shared": turns then ranks, as the header says.
 */
export function pickedCtes(shape: ClaimShape, t: PickTerms): FragmentSqlToken {
  const limit = sql.literalValue(String(t.max));
  if (shape === "priority")
    return sql.fragment`picked AS (
          SELECT ${t.columns} FROM ${t.items} w
           WHERE ${t.takeable}
           ORDER BY w.priority, w.createdon, w.id
           LIMIT ${limit}
           FOR UPDATE OF w SKIP LOCKED
        )`;
  if (shape === "rank")
    return sql.fragment`picked AS (
          SELECT ${t.columns} FROM ${t.items} w
           WHERE w.tenant_key = (SELECT tenants[1] FROM agent) AND ${t.takeableInTenant}
           ORDER BY w.rank, w.id
           LIMIT ${limit}
           FOR UPDATE OF w SKIP LOCKED
        )`;
  return sql.fragment`slots AS (
          SELECT w.id, w.tenant_key, w.share_tag FROM ${t.items} w
           WHERE ${t.takeable}
           ORDER BY w.share_tag
           LIMIT ${limit}
           FOR UPDATE OF w SKIP LOCKED
        ), tturns AS (
          SELECT tenant_key AS t, count(*) AS s FROM slots GROUP BY 1
        ), picked AS (
          SELECT x.* FROM tturns CROSS JOIN LATERAL (
            SELECT ${t.columns} FROM ${t.items} w
             WHERE w.tenant_key = tturns.t AND ${t.takeableInTenant}
             ORDER BY w.rank, w.id
             LIMIT tturns.s
             FOR UPDATE OF w SKIP LOCKED) x
        )`;
}

/** Claim order of picked rows `p` under a shape (for the admissions and placement that go in that order). */
export function pickedOrder(shape: ClaimShape): FragmentSqlToken {
  if (shape === "priority") return sql.fragment`p.priority, p.createdon, p.id`;
  if (shape === "rank") return sql.fragment`p.rank, p.id`;
  return sql.fragment`p.share_tag, p.id`;
}

/**
 * The shared claim's exchange of turns (see the header): each slot row left pending takes, in turn
 * order within its tenant, the turn of a row of its tenant that was dispatched from outside the
 * slots. Slot rows that nothing replaced keep their turns.
 */
export function retagCte(items: IdentifierSqlToken): FragmentSqlToken {
  return sql.fragment`retag AS (
          UPDATE ${items} rt SET share_tag = inc.share_tag
            FROM (SELECT s.id, s.tenant_key, row_number() OVER (PARTITION BY s.tenant_key ORDER BY s.share_tag, s.id) AS n
                    FROM slots s WHERE s.id NOT IN (SELECT id FROM claimed)) dis
            JOIN (SELECT p.id, p.tenant_key, p.share_tag, row_number() OVER (PARTITION BY p.tenant_key ORDER BY p.share_tag, p.id) AS n
                    FROM picked p WHERE p.id IN (SELECT id FROM claimed) AND p.id NOT IN (SELECT id FROM slots)) inc
              ON inc.tenant_key = dis.tenant_key AND inc.n = dis.n
           WHERE rt.id = dis.id
          RETURNING rt.id
        )`;
}

/**
 * The shared claim's advance of its pool's current turn (migration 0015 says why), after `claimed`
 * and `slots`. The turns the claim spent are, per tenant, its earliest slots, as many as it
 * dispatched items of the tenant (a dispatched item from outside the slots spent the turn of a slot
 * that `retagCte` gives its turn to); the latest of them is the pool's turn now, if later than the
 * row's. The pool is the agent's list of tenants as it registered them (the `agent` CTE's). The
 * row is made by the pool's first claim (ON CONFLICT: another made it first, and the next claim
 * advances it) and then taken with SKIP LOCKED: claims never wait on one another for it, and the
 * turn only goes forward, whichever claim commits first.
 */
export function advanceCtes(t: { turns: IdentifierSqlToken; agent: ValueExpression; now: FragmentSqlToken; seed: ValueExpression }): FragmentSqlToken {
  return sql.fragment`spent AS (
          SELECT max(s.share_tag) AS t
            FROM (SELECT sl.tenant_key, sl.share_tag, row_number() OVER (PARTITION BY sl.tenant_key ORDER BY sl.share_tag, sl.id) AS n FROM slots sl) s
            JOIN (SELECT c.tenant_key, count(*) AS k FROM claimed c GROUP BY 1) c ON c.tenant_key = s.tenant_key AND s.n <= c.k
        ), tpool AS (
          SELECT md5(to_jsonb(ag.tenants)::text) AS k, ag.tenants FROM agent ag
        ), tpooled AS (
          INSERT INTO ${t.turns} (id, pool, tenants, turn, createdby, createdon, updatedby, updatedon)
          SELECT ${nthId(t.seed, sql.fragment`1`)}, tpool.k, tpool.tenants, spent.t, ${t.agent}, ${t.now}, ${t.agent}, ${t.now}
            FROM tpool, spent WHERE spent.t IS NOT NULL
          ON CONFLICT (pool) DO NOTHING
          RETURNING id
        ), tadvanced AS (
          UPDATE ${t.turns} ft SET turn = GREATEST(ft.turn, (SELECT spent.t FROM spent)), updatedby = ${t.agent}, updatedon = ${t.now}
           WHERE ft.id = (SELECT l.id FROM ${t.turns} l WHERE l.pool = (SELECT tpool.k FROM tpool) AND l.turn < (SELECT spent.t FROM spent)
                            FOR UPDATE SKIP LOCKED)
          RETURNING ft.id
        )`;
}
