/**
 * The daemon's own passes over the queue: leases that ran out, an agent's items given back when it
 * goes inactive or its drain deadline passes, items stranded by their affinity key, and the due
 * checks that wake waiting claims. Each write returns items to `pending` (or fails them) in one
 * statement, and only from the state it names, so a sweep and a fenced write of one item never
 * both succeed. One more keeps items where they are: the lease carry-over after an outage.
 */
import { sql, type FragmentSqlToken } from "slonik";
import { z } from "zod";
import { msToNs } from "../../clock.js";
import { withDbErrors } from "../../db/errors.js";
import { ts } from "../../db/values.js";
import { canTakeWork } from "../agents.js";
import { agentLists, serves, tableItem } from "./claim-rule.js";
import { FREED_TENANT, requeuedRow, strandedRow, type Requeued } from "./columns.js";
import type { ItemsContext } from "./context.js";

/**
 * The expiry sweep: dispatched items whose lease ran out go back, one redelivery spent, or fail once
 * their redeliveries are spent. A lease runs out because its agent died, hung or was cut off: the
 * fleet failing, not the work, so the work's own retries (retry_count) are left as they were.
 */
export function requeueExpired(q: ItemsContext, nowMs: number, by: string, limit: number): Promise<readonly Requeued[]> {
  return requeue(q, sql.fragment`status = 'dispatched' AND lease_expires_at < ${msToNs(nowMs)}`, "lease expired", nowMs, by, true, limit);
}

/**
 * The lease carry-over after an outage: the dispatched items of these agents (those a daemon heard
 * from while the database was away) get their lease extended to nowMs + ttlMs, in one statement.
 * What must stay true: a lease is never shortened, its token never changes (the holder's later
 * writes are fenced by it), and only a holder that may still run its work is extended: an active
 * or draining agent, not one found inactive or removed (its leases are given back). Rows another
 * write holds are skipped, as the sweeps skip them: that write completes, extends or ends them.
 */
export function extendHeldLeases(q: ItemsContext, agents: readonly string[], nowMs: number, ttlMs: number, by: string): Promise<readonly { id: string }[]> {
  if (agents.length === 0) return Promise.resolve([]);
  const w = q.t.id("work_item");
  const a = q.t.id("agent");
  const until = msToNs(nowMs + ttlMs);
  return withDbErrors(() =>
    q.db.any(sql.type(z.object({ id: z.string() }))`
        WITH held AS (
          SELECT wi.id FROM ${w} wi
           WHERE wi.status = 'dispatched' AND wi.lease_expires_at < ${until}::bigint
             AND wi.agent_id = ANY(${sql.array([...agents], "text")})
             AND EXISTS (SELECT 1 FROM ${a} ag WHERE ag.name = wi.agent_id AND ag.status IN ('active', 'draining') AND ag.deletedon IS NULL)
           ORDER BY wi.id FOR UPDATE OF wi SKIP LOCKED
        )
        UPDATE ${w} w SET lease_expires_at = ${until}::bigint, updatedby = ${by}, updatedon = ${ts(nowMs)}
          FROM held
         WHERE w.id = held.id
        RETURNING w.id`),
  );
}

/** Everything an agent holds goes back at once (it went inactive), one redelivery spent on each. */
export function requeueAgent(q: ItemsContext, agent: string, nowMs: number, by: string, reason: string): Promise<readonly Requeued[]> {
  return requeue(q, sql.fragment`status = 'dispatched' AND agent_id = ${agent}`, reason, nowMs, by, true, 100_000);
}

/** Everything an agent holds goes back spending nothing (a drain deadline passed: an operator's call). */
export function releaseAgent(q: ItemsContext, agent: string, nowMs: number, by: string, reason: string): Promise<readonly Requeued[]> {
  return requeue(q, sql.fragment`status = 'dispatched' AND agent_id = ${agent}`, reason, nowMs, by, false, 100_000);
}

/**
 * These leases of an agent go back at once, one redelivery spent on each (the stream they were
 * pushed on broke: the agent may be gone). A lease already reported, or moved on, matches nothing.
 */
export function requeueLeases(
  q: ItemsContext,
  agent: string,
  leases: readonly { id: string; token: string }[],
  nowMs: number,
  by: string,
  reason: string,
): Promise<readonly Requeued[]> {
  if (leases.length === 0) return Promise.resolve([]);
  const held = sql.fragment`(id, lease_token) IN (SELECT * FROM unnest(${sql.array(
    leases.map((l) => l.id),
    "text",
  )}, ${sql.array(
    leases.map((l) => l.token),
    "text",
  )}))`;
  return requeue(q, sql.fragment`status = 'dispatched' AND agent_id = ${agent} AND ${held}`, reason, nowMs, by, true, leases.length);
}

function requeue(
  q: ItemsContext,
  where: FragmentSqlToken,
  reason: string,
  nowMs: number,
  by: string,
  lostLease: boolean,
  limit: number,
): Promise<readonly Requeued[]> {
  const w = q.t.id("work_item");
  const retry = lostLease ? sql.fragment`(w.redelivery_count < w.max_redeliveries)` : sql.fragment`true`;
  // A dead letter says what happened: every agent that ran it lost it (a poison item, or a fleet
  // that keeps dying); the last holder's reason is kept in the sentence.
  const spent = sql.fragment`format('lost its lease %s times (%s): the agents running it died, hung or were cut off', w.redelivery_count + 1, ${reason}::text)`;
  const nowNs = msToNs(nowMs);
  return withDbErrors(() =>
    q.db.any(sql.type(requeuedRow)`
        WITH gone AS (
          SELECT id, agent_id, lease_token, dispatched_at FROM ${w} WHERE ${where} ORDER BY id LIMIT ${limit} FOR UPDATE SKIP LOCKED
        )
        UPDATE ${w} w SET
               status = CASE WHEN ${retry} THEN 'pending' ELSE 'failed' END,
               redelivery_count = CASE WHEN ${lostLease} THEN w.redelivery_count + 1 ELSE w.redelivery_count END,
               next_attempt_at = CASE WHEN ${retry} THEN ${nowNs}::bigint + ${lostLease ? q.backoffNs(sql.fragment`w.redelivery_count`) : sql.fragment`0`} ELSE w.next_attempt_at END,
               completed_at = CASE WHEN ${retry} THEN NULL ELSE ${nowNs}::bigint END,
               agent_id = CASE WHEN ${retry} THEN NULL ELSE w.agent_id END,
               error = CASE WHEN NOT ${lostLease} THEN w.error WHEN ${retry} THEN ${reason} ELSE ${spent} END,
               lease_expires_at = NULL, lease_token = NULL, dispatched_at = NULL, updatedby = ${by}, updatedon = ${ts(nowMs)}
          FROM gone
         WHERE w.id = gone.id
        RETURNING w.id, w.status, gone.agent_id AS agent, gone.lease_token AS token, w.engine_kind,
                  ((${nowNs}::bigint - gone.dispatched_at) / 1e9)::float8 AS run_s, ${FREED_TENANT} AS freed`),
  );
}

/**
 * Items stranded by their affinity key (bound in their own tenant: another tenant's binding of the
 * same key never strands them) become dead letters once they have waited longer than the
 * grace: always when the key's agent is active but may not run the item (terms 3 and 4 of the claim
 * rule, ./claim-rule.ts: a binding never routes work to an agent that may not run it, and the key
 * does not move while its agent is active); under the hold policy also when the agent cannot take work.
 */
export function failStranded(
  q: ItemsContext,
  nowMs: number,
  affinity: { policy: "hold" | "rebind"; graceMs: number },
  by: string,
): Promise<readonly { id: string; engine_kind: string }[]> {
  const w = q.t.id("work_item");
  const a = q.t.id("agent");
  const b = q.t.id("affinity_binding");
  const hold = affinity.policy === "hold";
  // The key's agent exists and may take work (ba is LEFT JOINed: the name test keeps a missing
  // agent false rather than NULL, so NOT of it holds).
  const holderCanWork = sql.fragment`(ba.name IS NOT NULL AND ${canTakeWork("ba")})`;
  const holderMayRun = sql.fragment`(${serves(agentLists("ba"), tableItem("w"))})`;
  return withDbErrors(() =>
    q.db.any(sql.type(strandedRow)`
        UPDATE ${w} w
           SET status = 'failed', completed_at = ${msToNs(nowMs)}::bigint, updatedby = ${by}, updatedon = ${ts(nowMs)},
               error = format('affinity key %s is bound to agent %s, which %s', w.affinity_key, bb.agent_id,
                              CASE WHEN NOT ${holderCanWork}
                                   THEN 'cannot take work (policy hold); unbind or rebind the key, then redrive'
                                   ELSE 'may not run it (tenant, engine kind or selector); rebind the key, then redrive' END)
          FROM ${b} bb LEFT JOIN ${a} ba ON ba.name = bb.agent_id
         WHERE w.status = 'pending' AND w.tenant_key = bb.tenant_key AND w.affinity_key = bb.affinity_key
           -- Due for the grace, counted from no earlier than the item's creation: a row queued with
           -- next_attempt_at 0 (the engines' items before issue 52) has not waited since 1970.
           AND greatest(w.next_attempt_at, (extract(epoch FROM w.createdon) * 1e9)::int8) < ${msToNs(nowMs - affinity.graceMs)}::bigint
           AND ((${holderCanWork} AND NOT ${holderMayRun})
                OR (${hold} AND NOT ${holderCanWork} AND bb.updatedon < ${ts(nowMs - affinity.graceMs)}))
        RETURNING w.id, w.engine_kind`),
  );
}

const dueKeyRow = z.object({ tenant_key: z.string(), engine_kind: z.string() });

/**
 * Of these (tenant, engine kind) pairs, those with a pending item due at nowMs: one statement for
 * every claim this daemon has waiting (the fallback re-check), however many there are.
 */
export function dueKeys(
  q: ItemsContext,
  pairs: readonly { tenant: string; kind: string }[],
  nowMs: number,
): Promise<readonly { tenant_key: string; engine_kind: string }[]> {
  if (pairs.length === 0) return Promise.resolve([]);
  const w = q.t.id("work_item");
  return withDbErrors(() =>
    q.db.any(sql.type(dueKeyRow)`
        SELECT k.t AS tenant_key, k.e AS engine_kind
          FROM unnest(${sql.array(
            pairs.map((p) => p.tenant),
            "text",
          )}, ${sql.array(
            pairs.map((p) => p.kind),
            "text",
          )}) AS k(t, e)
         WHERE EXISTS (SELECT 1 FROM ${w} WHERE status = 'pending' AND tenant_key = k.t AND engine_kind = k.e AND next_attempt_at <= ${msToNs(nowMs)})`),
  );
}

/** (tenant, engine kind) pairs with pending items that became due in (sinceMs, nowMs]: wake their claims. */
export function dueSince(q: ItemsContext, sinceMs: number, nowMs: number): Promise<readonly { tenant_key: string; engine_kind: string }[]> {
  const w = q.t.id("work_item");
  return withDbErrors(() =>
    q.db.any(sql.type(dueKeyRow)`
        SELECT DISTINCT tenant_key, engine_kind FROM ${w}
         WHERE status = 'pending' AND next_attempt_at > ${msToNs(sinceMs)} AND next_attempt_at <= ${msToNs(nowMs)}`),
  );
}

/**
 * Pending items no agent could ever run (src/fleet/unplaceable-work-sweep.ts decides which) become dead letters
 * naming why. Only from pending: one claimed meanwhile is left to run.
 */
export function failUnplaceable(
  q: ItemsContext,
  items: readonly { id: string; reason: string }[],
  nowMs: number,
  by: string,
): Promise<readonly { id: string; engine_kind: string }[]> {
  const w = q.t.id("work_item");
  return withDbErrors(() =>
    q.db.any(sql.type(strandedRow)`
      UPDATE ${w} w SET status = 'failed', error = 'unplaceable: ' || v.reason, updatedby = ${by}, updatedon = ${ts(nowMs)}
        FROM unnest(${sql.array(
          items.map((i) => i.id),
          "text",
        )}, ${sql.array(
          items.map((i) => i.reason),
          "text",
        )}) AS v(id, reason)
       WHERE w.id = v.id AND w.status = 'pending'
      RETURNING w.id, w.engine_kind`),
  );
}
