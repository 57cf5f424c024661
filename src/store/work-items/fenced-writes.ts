/**
 * The writes an agent makes to items it holds: extend the lease, complete, fail, release. Each is
 * fenced: it matches a row only by id and lease token together, while the row is dispatched to that
 * agent, so a zombie agent's late write (its lease expired and the item went to another) matches no
 * row and changes nothing. Completion is also carried by a claim's statement (./claim.ts).
 *
 * Each takes its rows' locks in id order, first, by a locking read in the primary key's order
 * (`lockedCte`), and updates only rows it locked so: the UPDATE's own plan promises no order (the
 * heap's is possible). Two writes of one agent's items
 * (an extension and a claim carrying completions, from two daemons) then never wait on each other
 * in a cycle, which Postgres would end by killing one as a deadlock.
 */
import { sql, type FragmentSqlToken, type QuerySqlToken } from "slonik";
import { msToNs } from "../../clock.js";
import type { Markers } from "../../db/statement-shapes.js";
import { ts, tsAt, tsSeconds } from "../../db/values.js";
import { FREED_TENANT, idRow, requeuedRow, type Completed, type Requeued } from "./columns.js";
import type { ItemsContext } from "./context.js";

/** `items` in id order (a copy): the order every multi-row write on the queue locks rows in. */
export function inIdOrder<T extends { id: string }>(items: readonly T[]): T[] {
  return [...items].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}

/** A fenced completion: the item, the token it was dispatched under, and its result as JSON text. */
export interface Completion {
  id: string;
  token: string;
  resultJson: string | null;
}

/**
 * `w.id = ANY(ids)`: the fenced writes join their input (unnest) to the table by id, and a planner
 * that believed the table empty (it was analysed when it was) drove that join from a full
 * primary-key scan with the input as the inner side, a completion's cost growing with the table.
 * Named as an index condition on w, the ids are looked up whatever the planner believes.
 */
const byIds = (ids: readonly string[]) => sql.fragment`w.id = ANY(${sql.array(ids, "text")})`;

/**
 * `locked`: the agent's dispatched rows of `ids`, locked in id order by the primary key's order. A
 * fenced write updates only rows of it: the UPDATE's own plan promises no order, and under a busy
 * claim statement's plan an extension and a completion of the same items did lock in the heap's
 * order, and deadlocked.
 */
const lockedCte = (w: ReturnType<ItemsContext["t"]["id"]>, ids: readonly string[], agent: string, name: "locked" | "completing_locked" = "locked") =>
  sql.fragment`${name === "locked" ? sql.fragment`locked` : sql.fragment`completing_locked`} AS (SELECT w.id FROM ${w} w WHERE ${byIds(ids)} AND w.status = 'dispatched' AND w.agent_id = ${agent} ORDER BY w.id FOR UPDATE OF w)`;

/**
 * A fenced write by a caller whose token is limited to some tenants touches only their items. The
 * services refuse such a caller for an agent of other tenants before any write; this holds even so.
 */
const withinTenants = (tenants: readonly string[] | null) =>
  tenants ? sql.fragment`AND w.tenant_key = ANY(${sql.array([...tenants], "text")})` : sql.fragment``;

/** A fenced completion's bound values (see completeCtes), one array per column. */
export interface CompletionParams {
  doneIds: string[];
  doneTokens: string[];
  doneResults: (string | null)[];
}
export const completionParams = (unordered: readonly Completion[]): CompletionParams => {
  const items = inIdOrder(unordered);
  return { doneIds: items.map((i) => i.id), doneTokens: items.map((i) => i.token), doneResults: items.map((i) => i.resultJson) };
};

/** Extends the leases the agent still holds; returns their ids. */
export function extend(
  q: ItemsContext,
  agent: string,
  unordered: readonly { id: string; token: string }[],
  nowMs: number,
  ttlMs: number,
  tenants: readonly string[] | null,
): Promise<readonly string[]> {
  const w = q.t.id("work_item");
  const leases = inIdOrder(unordered);
  return q.hotIds(sql.type(idRow)`
        WITH ${lockedCte(
          w,
          leases.map((l) => l.id),
          agent,
        )}
        UPDATE ${w} w SET lease_expires_at = ${msToNs(nowMs + ttlMs)}, updatedby = ${agent}, updatedon = ${ts(nowMs)}
          FROM unnest(${sql.array(
            leases.map((l) => l.id),
            "text",
          )}, ${sql.array(
            leases.map((l) => l.token),
            "text",
          )}) AS v(id, token)
         WHERE ${byIds(leases.map((l) => l.id))} AND w.id IN (SELECT id FROM locked) AND w.id = v.id AND w.lease_token = v.token AND w.status = 'dispatched' AND w.agent_id = ${agent}
           ${withinTenants(tenants)}
        RETURNING w.id`);
}

/** Completes fenced items; returns those that matched (the rest had lost their lease). */
export function complete(
  q: ItemsContext,
  agent: string,
  items: readonly Completion[],
  nowMs: number,
  tenants: readonly string[] | null,
): Promise<readonly Completed[]> {
  const params = { agent, nowNs: msToNs(nowMs), now: tsSeconds(nowMs), ...completionParams(items), ...(tenants ? { tenants: [...tenants] } : {}) };
  return q.hotRowsUnchecked<Completed>(
    q.shapes.token(
      tenants ? "complete:tenants" : "complete",
      params,
      (p) => sql.unsafe`
        WITH ${completeCtes(q, p)}
        SELECT ${COMPLETED_COLUMNS} FROM completing UNION ALL SELECT ${RECOMPLETED_COLUMNS} FROM recompleted`,
    ) as QuerySqlToken,
  );
}

/** What `completing` and `recompleted` answer, as Completed rows (see completeCtes). */
export const COMPLETED_COLUMNS = sql.fragment`id, engine_kind, run_s, freed`;
export const RECOMPLETED_COLUMNS = sql.fragment`id, NULL::text AS engine_kind, NULL::float8 AS run_s, NULL::text AS freed`;

/**
 * The fenced completion as two CTEs (of its own statement, or of a claim's): `completing` completes
 * the items still held under their tokens, `recompleted` finds those this agent already completed
 * under the same tokens. A completion is idempotent, so a report whose answer was lost (the call
 * failed after the commit: a daemon restart, a dropped connection, a claim carrying it cut short)
 * is answered ok when it is sent again, not "lease lost". Both read the statement's snapshot, so an
 * item completed by `completing` is not found again by `recompleted`. The completed row keeps its
 * token for that; no fenced write matches a row that is not dispatched.
 */
export function completeCtes(
  q: ItemsContext,
  p: Markers<CompletionParams & { agent: string; nowNs: bigint; now: string; tenants?: string[] }>,
): FragmentSqlToken {
  const w = q.t.id("work_item");
  const v = sql.fragment`unnest(${sql.array(p.doneIds, "text")}, ${sql.array(p.doneTokens, "text")}, ${sql.array(p.doneResults, "jsonb")}) AS v(id, token, result)`;
  const ids = byIds(p.doneIds);
  const within = p.tenants ? sql.fragment`AND w.tenant_key = ANY(${sql.array(p.tenants as unknown as readonly string[], "text")})` : sql.fragment``;
  return sql.fragment`${lockedCte(w, p.doneIds, p.agent, "completing_locked")}, completing AS (
        UPDATE ${w} w SET status = 'completed', completed_at = ${p.nowNs}, result = v.result, lease_expires_at = NULL,
                          updatedby = ${p.agent}, updatedon = ${tsAt(p.now)}
          FROM ${v}
         WHERE ${ids} AND w.id IN (SELECT id FROM completing_locked) AND w.id = v.id AND w.lease_token = v.token AND w.status = 'dispatched' AND w.agent_id = ${p.agent} ${within}
        RETURNING w.id, w.engine_kind, ((${p.nowNs}::bigint - w.dispatched_at) / 1e9)::float8 AS run_s,
                  ${FREED_TENANT} AS freed
        ), recompleted AS (
        SELECT w.id FROM ${w} w JOIN ${v} ON w.id = v.id AND w.lease_token = v.token
         WHERE ${ids} AND w.status = 'completed' AND w.agent_id = ${p.agent} ${within}
        )`;
}

/**
 * Fails fenced items. A retryable failure with budget left goes back to pending with retry_count+1
 * and next_attempt_at = now + delay (the asked delay, else the backoff); otherwise the item becomes
 * failed (a dead letter) and keeps the error.
 */
export function fail(
  q: ItemsContext,
  agent: string,
  unordered: readonly { id: string; token: string; error: string; retryable: boolean; delayMs: number | null }[],
  nowMs: number,
  tenants: readonly string[] | null,
): Promise<readonly Requeued[]> {
  const w = q.t.id("work_item");
  const items = inIdOrder(unordered);
  const retry = sql.fragment`(v.retryable AND w.retry_count < w.max_retries)`;
  return q.hotRows(sql.type(requeuedRow)`
        WITH ${lockedCte(
          w,
          items.map((i) => i.id),
          agent,
        )}
        UPDATE ${w} w SET
               status = CASE WHEN ${retry} THEN 'pending' ELSE 'failed' END,
               retry_count = CASE WHEN ${retry} THEN w.retry_count + 1 ELSE w.retry_count END,
               next_attempt_at = CASE WHEN ${retry} THEN ${msToNs(nowMs)}::bigint + COALESCE(v.delay_ns, ${q.backoffNs(sql.fragment`w.retry_count`)}) ELSE w.next_attempt_at END,
               completed_at = CASE WHEN ${retry} THEN NULL ELSE ${msToNs(nowMs)}::bigint END,
               agent_id = CASE WHEN ${retry} THEN NULL ELSE w.agent_id END,
               error = v.error, lease_expires_at = NULL, lease_token = NULL, updatedby = ${agent}, updatedon = ${ts(nowMs)}
          FROM unnest(${sql.array(
            items.map((i) => i.id),
            "text",
          )}, ${sql.array(
            items.map((i) => i.token),
            "text",
          )}, ${sql.array(
            items.map((i) => i.error),
            "text",
          )},
                      ${sql.array(
                        items.map((i) => i.retryable),
                        "bool",
                      )}, ${sql.array(
                        items.map((i) => (i.delayMs === null ? null : String(msToNs(i.delayMs)))),
                        "int8",
                      )})
               AS v(id, token, error, retryable, delay_ns)
         WHERE ${byIds(items.map((i) => i.id))} AND w.id IN (SELECT id FROM locked) AND w.id = v.id AND w.lease_token = v.token AND w.status = 'dispatched' AND w.agent_id = ${agent}
           ${withinTenants(tenants)}
        RETURNING w.id, w.status, ${agent}::text AS agent, v.token, w.engine_kind, ((${msToNs(nowMs)}::bigint - w.dispatched_at) / 1e9)::float8 AS run_s,
                  ${FREED_TENANT} AS freed`);
}

/** A lease given back; `atDrainDeadline` when the agent says a drain deadline made it stop the work. */
export interface Release {
  id: string;
  token: string;
  atDrainDeadline?: boolean;
}

/**
 * Gives fenced items back without spending an attempt. While the agent is being drained, the same
 * statement counts in its drain's releasedAtDeadline each item released at or after the drain's
 * deadline (by `nowMs`) or marked `atDrainDeadline`: the agent's own deadline timer usually gives
 * the work back before the daemon's drain-deadline task would, and the drain's result must say work
 * was given back whoever did it. One statement, so nobody sees the items gone but not counted (the
 * drain-deadline task commits its release and count together for the same reason). It locks the
 * items, then the agent's row, as that task does; only a draining agent's row is written.
 */
export function release(
  q: ItemsContext,
  agent: string,
  unordered: readonly Release[],
  nowMs: number,
  tenants: readonly string[] | null,
): Promise<readonly string[]> {
  const w = q.t.id("work_item");
  const a = q.t.id("agent");
  const leases = inIdOrder(unordered);
  return q.hotIds(sql.type(idRow)`
        WITH ${lockedCte(
          w,
          leases.map((l) => l.id),
          agent,
        )},
        released AS (
        UPDATE ${w} w SET status = 'pending', agent_id = NULL, lease_expires_at = NULL, lease_token = NULL, dispatched_at = NULL,
                          next_attempt_at = ${msToNs(nowMs)}, updatedby = ${agent}, updatedon = ${ts(nowMs)}
          FROM unnest(${sql.array(
            leases.map((l) => l.id),
            "text",
          )}, ${sql.array(
            leases.map((l) => l.token),
            "text",
          )},
                      ${sql.array(
                        leases.map((l) => l.atDrainDeadline === true),
                        "bool",
                      )}) AS v(id, token, at_deadline)
         WHERE ${byIds(leases.map((l) => l.id))} AND w.id IN (SELECT id FROM locked) AND w.id = v.id AND w.lease_token = v.token AND w.status = 'dispatched' AND w.agent_id = ${agent}
           ${withinTenants(tenants)}
        RETURNING w.id, v.at_deadline),
        counted AS (
          SELECT d.id, count(*) FILTER (WHERE r.at_deadline OR (d.metadata -> 'drain' ->> 'deadline')::bigint <= ${nowMs}::bigint)::int AS n
            FROM released r CROSS JOIN ${a} d
           WHERE d.name = ${agent} AND d.deletedon IS NULL AND jsonb_typeof(d.metadata -> 'drain') = 'object'
           GROUP BY d.id),
        drain AS (
          UPDATE ${a} d SET metadata = jsonb_set(d.metadata, '{drain,releasedAtDeadline}',
                                                 to_jsonb(COALESCE((d.metadata -> 'drain' ->> 'releasedAtDeadline')::int, 0) + c.n))
            FROM counted c WHERE d.id = c.id AND c.n > 0)
        SELECT id FROM released`);
}
