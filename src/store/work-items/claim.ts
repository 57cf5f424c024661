/**
 * The claim: one atomic statement. A CTE picks the items the claim rule (./claim-rule.ts) lets this
 * agent take, in claim order, with FOR UPDATE SKIP LOCKED, binds or moves their affinity keys, and an
 * UPDATE … RETURNING dispatches them under one fresh lease token. Several daemons share the queue;
 * no read here is followed by a write in another statement.
 */
import { sql } from "slonik";
import { msToNs } from "../../clock.js";
import type { Markers } from "../../db/statement-shapes.js";
import { tsAt, tsSeconds } from "../../db/values.js";
import { claimingAgentCte, CLAIMING_AGENT, keyAllows, movable, pendingAndDue, serves, servesInTenant, tableItem } from "./claim-rule.js";
import { CLAIMED_COLUMNS, claimedCompletionColumns, claimedNulls, type ClaimedRow, type Completed } from "./columns.js";
import type { ItemsContext } from "./context.js";
import { nthId } from "./sql-ids.js";
import { keyCtes, keyDispatchable, keyHasRoom, keySetCtes, keysLost } from "./concurrency.js";
import { fitsNow, placedCte, placementLost, reserveCte, roomCte } from "./placement.js";
import { advanceCtes, pickedCtes, pickedOrder, retagCte, type ClaimShape } from "./fair-share.js";
import { nextOpening, rateAdmitCte, rateDispatchable, rateHasRoom, rateHeld, rateSetCtes } from "./rate-limits.js";
import { COMPLETED_COLUMNS, completeCtes, completionParams, RECOMPLETED_COLUMNS, type Completion, type CompletionParams } from "./fenced-writes.js";

export interface ClaimInput {
  agent: string;
  /** The daemon instance granting the lease (stored in leased_by). */
  instance: string;
  max: number;
  nowMs: number;
  leaseTtlMs: number;
  affinity: { policy: "hold" | "rebind"; graceMs: number };
  /** A fresh ULID: the bindings this claim creates take their ids from it (see ./sql-ids.ts). */
  bindingSeed: string;
  /**
   * The fencing token of this dispatch, shared by the items it takes: a token names one dispatch of
   * an item (every write checks id and token together), and a redispatch is another claim with
   * another token. One per claim rather than one per row keeps a random draw per item out of the
   * statement.
   */
  leaseToken: string;
  /** Epoch ms before which the agent's latest heartbeat is too old to place work by (the liveness window's start). */
  liveEdgeMs: number;
  /** Items the agent finished, completed (fenced, as complete() does) in the claim's statement. */
  completions?: readonly Completion[];
  /**
   * How many tenants the agent serves (1 when not given): an agent of several takes turns between
   * them by fair share (./fair-share.ts); an agent of one takes its tenant's items in rank order.
   */
  tenants?: number;
}

export interface ClaimResult {
  claimed: ClaimedRow[];
  completed: Completed[];
  /**
   * The claim admitted work that another claim, committed first, raced it for (a concurrency key's
   * slots, or the agent's resources): it dispatched none of that, though it may be there for the
   * taking now. A caller with room left asks again at once rather than wait for a wake-up.
   */
  contended: boolean;
  /**
   * Rows a rate limit held back took places in the claim's batch (their key is closed now): a
   * caller that wanted more asks again at once for the rest.
   */
  heldBack: boolean;
  /**
   * The claim took nothing and some rate limit key is closed: when (epoch ms) the first one opens.
   * A caller that waits for work looks again then, since nothing else would wake it (that work
   * was pending all along).
   */
  nextSlotMs: number | null;
}

/**
 * A row of the claim statement's result, one of three kinds told apart by `done`, each with columns
 * of its own and NULL in the others' (the claimed columns are NULL but for id and engine_kind in a
 * completion row, and all NULL in the status row):
 * - a claimed item (`done` false): the ClaimedRow columns;
 * - a completion the statement made (`done` true): a Completed, in id, engine_kind, run_s, freed;
 * - the status row (`done` NULL), at most one, present when the claim lost a race, a rate limit held
 *   rows back, or it took nothing while some rate limit key is closed: next_slot_ns and verdict.
 * run_s and freed mean only what they mean for a completion (Completed): the status row does not
 * borrow them, and Completed rows are handed on as they are (WorkQueue.freed reads `freed`).
 */
interface ClaimRow extends ClaimedRow {
  done: boolean | null;
  /** Completion rows: seconds the item ran (Completed.run_s). */
  run_s: number | null;
  /** Completion rows: the tenant whose dispatch slot or resources it gave back (Completed.freed). */
  freed: string | null;
  /** Status row: epoch ns (float8, as aiflow_rate_limit.open_ns) when the first closed rate limit key opens; NULL when none is closed. */
  next_slot_ns: number | null;
  /** Status row: 'contended' (the claim lost a race: ClaimResult.contended), 'held' (a rate limit held picked rows back: ClaimResult.heldBack), or NULL (only next_slot_ns to say). */
  verdict: "contended" | "held" | null;
}

/**
 * The claim. Only an ACTIVE agent claims; it takes pending items of the tenants and engine kinds it
 * registered with, whose next attempt is due, and whose selector its tags satisfy, in claim order
 * (the claim rule, ./claim-rule.ts).
 *
 * Affinity, in the same statement (a key is bound per tenant: "the key" below is the item's tenant
 * and key, migration 0016): an item whose key is unbound binds it to this agent
 * (INSERT … ON CONFLICT DO NOTHING — of two racing claims, one insert wins and the loser dispatches
 * none of the key's items); an item whose key is bound to this agent is taken only after this
 * statement has updated the binding row (bumping updatedon), and an item whose key is bound to
 * another agent only when the key is movable (claim-rule.ts: that agent cannot take work, the grace
 * has passed since the key's last dispatch, none of the key's items is in flight, and the policy is
 * rebind) — by moving the binding row. Both paths write the binding row, so they serialise on its
 * lock, and Postgres re-checks the UPDATE's conditions against the committed row: a dispatch and a
 * move of one key can never both succeed, and no two agents ever hold items of one key at once.
 *
 * A move is a compare-and-swap on the binding row's version (xmin) as this statement's snapshot
 * read it. After a lock wait the re-check sees the new row but answers the agent and in-flight
 * subqueries from the old snapshot, and `updatedon` cannot stand in for a version: it is the
 * writer's clock reading, taken before its statement ran, so a dispatch that waited on this lock
 * past the grace stamps a time already older than the grace (as does one from a daemon whose clock
 * lags). Any write to the row since the snapshot changes xmin, so such a move matches nothing and a
 * later claim decides afresh.
 */
export async function claim(q: ItemsContext, c: ClaimInput): Promise<ClaimResult> {
  const w = q.t.id("work_item");
  const a = q.t.id("agent");
  const b = q.t.id("affinity_binding");
  const k = q.t.id("concurrency_key");
  const completions = c.completions ?? [];
  const max = Math.trunc(c.max);
  const shape: ClaimShape = (c.tenants ?? 1) > 1 ? "shared" : q.sharing.agingMs > 0 ? "rank" : "priority";
  const params = {
    agent: c.agent,
    instance: c.instance,
    leaseToken: c.leaseToken,
    bindingSeed: c.bindingSeed,
    nowNs: msToNs(c.nowMs),
    leaseExpiresNs: msToNs(c.nowMs) + msToNs(c.leaseTtlMs),
    now: tsSeconds(c.nowMs),
    graceEdge: tsSeconds(c.nowMs - c.affinity.graceMs),
    rebind: c.affinity.policy === "rebind",
    liveEdgeMs: String(c.liveEdgeMs),
    ...(completions.length > 0 ? completionParams(completions) : {}),
  };
  const token = q.shapes.token(`claim:${shape}:${completions.length > 0 ? "completing" : "plain"}:${max}`, params, (p) => {
    // Completions ride in the same statement: a data-modifying CTE sees the claim's snapshot, and the
    // items it completes are dispatched ones, which the claim's scan (pending only) never reads.
    const done =
      "doneIds" in p
        ? sql.fragment`${completeCtes(q, p as Markers<typeof params & CompletionParams>)}, done AS (SELECT ${COMPLETED_COLUMNS} FROM completing UNION ALL SELECT ${RECOMPLETED_COLUMNS} FROM recompleted), `
        : sql.fragment``;
    const graceEdge = tsAt(p.graceEdge);
    const now = tsAt(p.now);
    const completing = "doneIds" in p;
    const order = pickedOrder(shape);
    const keyTerms = { items: w, keys: k, completing, keyLimit: q.t.routine("key_limit") };
    const placeTerms = { agents: a, room: q.t.routine("agent_room"), place: q.t.routine("place"), agent: p.agent, liveEdgeMs: p.liveEdgeMs, completing };
    const rateTerms = { limits: q.t.id("rate_limit"), admit: q.t.routine("rate_admit"), nowNs: sql.fragment`${p.nowNs}` };
    // The claim rule (claim-rule.ts) over a row `w`, and what the scans pass over: rows whose
    // requirements do not fit the agent now, whose concurrency key is full or whose rate limit key
    // is closed (placement.ts, concurrency.ts, rate-limits.ts); a plain row asks none of them.
    const takeable = (scope: "agent" | "tenant") => sql.fragment`EXISTS (SELECT 1 FROM agent)
             AND ${pendingAndDue("w", p.nowNs)}
             AND ${scope === "agent" ? serves(CLAIMING_AGENT, tableItem("w")) : servesInTenant(CLAIMING_AGENT, tableItem("w"))}
             AND ${keyAllows("w", { items: w, bindings: b, agents: a, agent: p.agent, rebind: p.rebind, graceEdge })}
             AND ${fitsNow("w")}
             AND ${keyHasRoom("w")}
             AND ${rateHasRoom("w")}`;
    const columns = sql.fragment`w.id, w.affinity_key, w.tenant_key, w.concurrency_key, w.rate_limit_key, w.worker_params -> 'requirements' AS req,
                 (w.worker_params ->> 'maxInFlight')::int AS own_limit, w.priority, w.createdon, w.rank, w.share_tag`;
    const keyAdmitted = sql.fragment`(p.concurrency_key IS NULL OR p.id IN (SELECT id FROM kadmit))`;
    const rateAdmitted = sql.fragment`(p.rate_limit_key IS NULL OR p.id IN (SELECT id FROM radmit))`;
    const lost = sql.fragment`(${keysLost} OR ${placementLost})`;
    // The result is claimed rows, completion rows and the status row, in one column list (ClaimRow):
    // each kind has columns of its own and NULLs in the others'. The status row's two facts go in
    // next_slot_ns (epoch ns, as open_ns is) and verdict ('contended' | 'held'), never in run_s or
    // freed, which a completion's metrics and wake-ups read as seconds run and a freed tenant. A
    // column added for one kind is added, as a typed NULL in the first branch, to every branch.
    const status = sql.fragment`UNION ALL SELECT NULL, ${claimedNulls}, NULL, NULL, ${nextOpening}, CASE WHEN ${lost} THEN 'contended' WHEN ${rateHeld(keyAdmitted)} THEN 'held' END
         WHERE ${lost} OR ${rateHeld(keyAdmitted)} OR (NOT EXISTS (SELECT 1 FROM claimed) AND EXISTS (SELECT 1 FROM rclosed))`;
    return sql.unsafe`
        WITH ${done}agent AS MATERIALIZED (
          ${claimingAgentCte(a, p.agent)}
        ), ${roomCte(placeTerms)}, ${keySetCtes(keyTerms)}, ${rateSetCtes(rateTerms)}, ${pickedCtes(shape, { items: w, takeable: takeable("agent"), takeableInTenant: takeable("tenant"), columns, max })}, keys AS (
          -- A key is bound per tenant (t, k). v: the binding row's version in this statement's
          -- snapshot (NULL when the key is unbound).
          SELECT d.t, d.k, bk.xmin::text AS v, row_number() OVER (ORDER BY d.t, d.k) AS n
            FROM (SELECT DISTINCT tenant_key AS t, affinity_key AS k FROM picked WHERE affinity_key IS NOT NULL) d
            LEFT JOIN ${b} bk ON bk.tenant_key = d.t AND bk.affinity_key = d.k
        ), pinned AS (
          INSERT INTO ${b} (id, tenant_key, affinity_key, agent_id, createdby, createdon, updatedby, updatedon)
          SELECT ${nthId(p.bindingSeed, sql.fragment`keys.n`)}, keys.t, keys.k, ${p.agent}, ${p.agent}, ${now}, ${p.agent}, ${now} FROM keys
          ON CONFLICT (tenant_key, affinity_key) DO NOTHING
          RETURNING tenant_key, affinity_key
        ), held AS (
          UPDATE ${b} bb SET agent_id = ${p.agent}, updatedby = ${p.agent}, updatedon = ${now}
            FROM keys
           WHERE bb.tenant_key = keys.t AND bb.affinity_key = keys.k
             AND (bb.agent_id = ${p.agent}
                  OR ${movable({ agents: a, items: w, rebind: p.rebind, graceEdge, version: sql.fragment`keys.v` })})
          RETURNING bb.tenant_key, bb.affinity_key
        ), ${keyCtes(keyTerms, { agent: p.agent, now, rowId: (n) => nthId(p.bindingSeed, n), order })}, ${rateAdmitCte(rateTerms, { eligible: keyAdmitted, order, agent: p.agent, now, seed: p.bindingSeed })}, need AS (
          SELECT p.id, p.req AS r, row_number() OVER (ORDER BY ${order}) AS n
            FROM picked p WHERE p.req IS NOT NULL AND ${keyAdmitted} AND ${rateAdmitted}
        ), ${placedCte(placeTerms)}, ${reserveCte(placeTerms, now)}, claimed AS (
        UPDATE ${w} w
           SET status = 'dispatched', agent_id = ${p.agent}, leased_by = ${p.instance}, dispatched_at = ${p.nowNs},
               lease_expires_at = ${p.leaseExpiresNs}, lease_token = ${p.leaseToken}, gpu_indices = placed.gpus,
               updatedby = ${p.agent}, updatedon = ${now}
          FROM picked LEFT JOIN placed ON placed.id = picked.id
         WHERE w.id = picked.id
           AND (picked.affinity_key IS NULL
                OR (picked.tenant_key, picked.affinity_key) IN (SELECT tenant_key, affinity_key FROM pinned)
                OR (picked.tenant_key, picked.affinity_key) IN (SELECT tenant_key, affinity_key FROM held))
           AND ${keyDispatchable}
           AND ${rateDispatchable}
           AND (picked.req IS NULL OR (placed.id IS NOT NULL AND EXISTS (SELECT 1 FROM reserve)))
        RETURNING ${CLAIMED_COLUMNS}
        )${shape === "shared" ? sql.fragment`, ${retagCte(w)}, ${advanceCtes({ turns: q.t.id("fair_share_turn"), agent: p.agent, now, seed: p.bindingSeed })}` : sql.fragment``}
        SELECT false AS done, claimed.*, NULL::float8 AS run_s, NULL::text AS freed, NULL::float8 AS next_slot_ns, NULL::text AS verdict FROM claimed
        ${"doneIds" in p ? sql.fragment`UNION ALL SELECT true, ${claimedCompletionColumns("done")}, done.run_s, done.freed, NULL, NULL FROM done` : sql.fragment``}
        ${status}`;
  });
  const rows = await q.hotRowsUnchecked<ClaimRow>(token);
  const claimed: ClaimedRow[] = [];
  const completed: Completed[] = [];
  let contended = false;
  let nextSlotMs: number | null = null;
  let heldBack = false;
  for (const r of rows) {
    if (r.done === null) {
      contended = r.verdict === "contended";
      heldBack = r.verdict === "held";
      nextSlotMs = r.next_slot_ns === null ? null : Math.ceil(r.next_slot_ns / 1e6);
    } else if (r.done) completed.push({ id: r.id, engine_kind: r.engine_kind, run_s: r.run_s, freed: r.freed });
    else claimed.push(r);
  }
  // In claim order: the UPDATE returns its rows in whatever order its join produced them.
  claimed.sort((x, y) => (x.priority ?? 0) - (y.priority ?? 0) || x.createdon_ms - y.createdon_ms || (x.id < y.id ? -1 : x.id > y.id ? 1 : 0));
  return { claimed, completed, contended, heldBack, nextSlotMs };
}
