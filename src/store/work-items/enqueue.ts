/**
 * Enqueue: rows of one or many Enqueue calls go in by one INSERT, idempotency keys skipped by the
 * unique index and looked up after, and rows offered to waiting claims (../../queue/waiting-claims.ts)
 * written dispatched by that same INSERT when the claim rule (./claim-rule.ts) lets the claim take them.
 */
import { sql } from "slonik";
import { z } from "zod";
import { msToNs } from "../../clock.js";
import { withDbErrors } from "../../db/errors.js";
import type { Markers } from "../../db/statement-shapes.js";
import { tsAt, tsSeconds } from "../../db/values.js";
import { newId as itemId } from "../../util/ids.js";
import { canTakeWork } from "../agents.js";
import { agentRow, claimOrder, comesFirstSql, offeredDueUnkeyed, pendingAndDue, serves, type ItemTerms } from "./claim-rule.js";
import { HANDED_COLUMNS, idRow, type ClaimedRow } from "./columns.js";
import type { ItemsContext } from "./context.js";
import { turnCtes, turnInputs, turnOf } from "./fair-share.js";
import { rankOf } from "../../domain/fair-share.js";

export interface NewItem {
  engineKind: string;
  runId: string | null;
  taskId: string | null;
  taskName: string | null;
  workerParams: Record<string, unknown> | null;
  /** JSON text, already validated. */
  payloadJson: string | null;
  priority: number;
  maxRetries: number;
  /** Times the item may be redelivered after a lost lease (migration 0006 says why). */
  maxRedeliveries: number;
  /** Epoch ns; the item is not claimable before it. */
  notBeforeNs: bigint;
  parentId: string | null;
  idempotencyKey: string | null;
  affinityKey: string | null;
  /** worker_params.concurrencyKey, for its column (migration 0008). */
  concurrencyKey: string | null;
  /** worker_params.rateLimitKey, for its column (migration 0009). */
  rateLimitKey: string | null;
}

/** A plain item (no params, keys or parent, due at once, priority 0), with `over` on top: what tests and benchmarks enqueue. */
export const plainItem = (engineKind: string, over: Partial<NewItem> = {}): NewItem => ({
  engineKind,
  runId: null,
  taskId: null,
  taskName: null,
  workerParams: null,
  payloadJson: null,
  priority: 0,
  maxRetries: 0,
  maxRedeliveries: 3,
  notBeforeNs: 0n,
  parentId: null,
  idempotencyKey: null,
  affinityKey: null,
  concurrencyKey: null,
  rateLimitKey: null,
  ...over,
});

/** One item to insert, with the call it came from. */
export interface EnqueueRow {
  id: string;
  tenant: string;
  engineId: string;
  by: string;
  nowMs: number;
  item: NewItem;
  /** The call's W3C traceparent (version 00 text); absent or null when it carried none. Every item of one call shares it. */
  traceContext?: string | null;
}

/** What enqueueRows answers for one row. */
export interface EnqueueResult {
  id: string;
  /** The row's idempotency key named an item already there; this is its id. */
  existing: boolean;
  /** Set when the row went in dispatched to the claim it was offered to. */
  claimed?: ClaimedRow;
}

/** Rows offered to waiting claims (see enqueueRows): per row the claim's agent and lease token, or null. */
export interface HandoffInput {
  agents: (string | null)[];
  tokens: (string | null)[];
  /** The daemon instance granting the leases. */
  instance: string;
  nowMs: number;
  leaseTtlMs: number;
}
/** How many due pending items an offered row's check looks at before it gives up on the handoff. */
const HANDOFF_LOOKAHEAD = 64;
type HandoffParams = { handAgents: (string | null)[]; handTokens: (string | null)[]; instance: string; nowNs: bigint; leaseExpiresNs: bigint; now: string };

/** An inserted row, `v` of the insert, in the claim rule's terms. */
const OFFERED: ItemTerms = { tenant: sql.fragment`v.tenant`, engineKind: sql.fragment`v.engine_kind`, selector: sql.fragment`v.worker_params -> 'selector'` };

/** Rows for enqueueRows from one call's items; ids are made now, so they ascend in arrival order. */
export function enqueueRowsOf(
  tenant: string,
  engineId: string,
  items: readonly NewItem[],
  nowMs: number,
  by: string,
  traceContext: string | null = null,
): EnqueueRow[] {
  return items.map((item) => ({ id: itemId(nowMs), tenant, engineId, by, nowMs, item, traceContext }));
}

/**
 * Inserts rows (of one or many Enqueue calls) in one statement. Rows whose (tenant, idempotency
 * key) already exists are skipped by the unique index; a second statement (a fresh snapshot, so it
 * sees rows another daemon committed meanwhile) reads their ids. Returns one result per row, in order.
 *
 * With `handoff`, rows offered to a waiting claim go in already dispatched to its agent, under its
 * lease, in this same statement, when the claim would have taken them (./claim-rule.ts): the agent
 * may take work and serves the row's tenant, engine kind and selector, the row is due and has no
 * affinity key, and no pending item it could take comes first (one due now, of that tenant and kind,
 * at the same or a higher priority; the statement's own rows are not in its snapshot, and the offers
 * are made in claim order). Otherwise the row goes in pending, as any other. Such a row comes back
 * with its claimed columns (`claimed`).
 */
export async function enqueueRows(q: ItemsContext, rows: readonly EnqueueRow[], handoff?: HandoffInput): Promise<EnqueueResult[]> {
  const w = q.t.id("work_item");
  const a = q.t.id("agent");
  const col = <T>(f: (r: EnqueueRow) => T) => rows.map(f);
  const base = {
    ids: col((r) => r.id),
    tenants: col((r) => r.tenant),
    engineIds: col((r) => r.engineId),
    bys: col((r) => r.by),
    ats: col((r) => new Date(r.nowMs).toISOString()),
    kinds: col((r) => r.item.engineKind),
    parents: col((r) => r.item.parentId),
    runIds: col((r) => r.item.runId),
    taskIds: col((r) => r.item.taskId),
    taskNames: col((r) => r.item.taskName),
    workerParams: col((r) => (r.item.workerParams ? JSON.stringify(r.item.workerParams) : null)),
    payloads: col((r) => r.item.payloadJson),
    priorities: col((r) => r.item.priority),
    notBefores: col((r) => String(r.item.notBeforeNs)),
    maxRetries: col((r) => r.item.maxRetries),
    maxRedeliveries: col((r) => r.item.maxRedeliveries),
    idems: col((r) => r.item.idempotencyKey),
    affinities: col((r) => r.item.affinityKey),
    concurrencyKeys: col((r) => r.item.concurrencyKey),
    rateKeys: col((r) => r.item.rateLimitKey),
    traces: col((r) => r.traceContext ?? null),
    ranks: col((r) => rankOf(r.item.priority, r.nowMs, q.sharing.agingMs)),
    ...turnInputs(rows, q.sharing.weights),
    shareSeed: itemId(rows[0]?.nowMs ?? 0),
    frontierNs: msToNs(rows[0]?.nowMs ?? 0),
    credit: q.sharing.credit,
  };
  // biome-ignore lint/complexity/useOptionalChain: a boolean, so that `offered` narrows handoff to defined below
  const offered = handoff !== undefined && handoff.agents.some((x) => x !== null);
  const params = offered
    ? {
        ...base,
        handAgents: handoff.agents,
        handTokens: handoff.tokens,
        instance: handoff.instance,
        nowNs: msToNs(handoff.nowMs),
        leaseExpiresNs: msToNs(handoff.nowMs) + msToNs(handoff.leaseTtlMs),
        now: tsSeconds(handoff.nowMs),
      }
    : base;
  // Built once per shape (src/db/statement-shapes.ts): every batch has the same text, only its arrays differ.
  const token = q.shapes.token(offered ? "enqueue:handoff" : "enqueue", params, (p) => {
    const h = offered ? (p as Markers<typeof params & HandoffParams>) : undefined;
    const handArrays = h ? sql.fragment`, ${sql.array(h.handAgents, "text")}, ${sql.array(h.handTokens, "text")}` : sql.fragment``;
    const handNames = h ? sql.fragment`, hand_agent, hand_token` : sql.fragment``;
    // The claim rule for the offered rows, read in this statement's snapshot. Whether a pending item
    // comes first is asked once per tenant, engine kind and priority of the batch (an uncorrelated
    // subquery, run once), by a walk in claim order that stops after HANDOFF_LOOKAHEAD due items: a
    // batch behind a backlog that long is not handed over, so a backlog of work the agent cannot
    // take (another tenant's) costs the insert a bounded walk.
    const check = h
      ? sql.fragment`
          LEFT JOIN LATERAL (
            SELECT true AS ok
             WHERE v.hand_agent IS NOT NULL
               AND ${offeredDueUnkeyed(sql.fragment`v.next_attempt_at`, sql.fragment`v.affinity`, h.nowNs)}
               AND (v.tenant, v.engine_kind, v.priority) IN (
                     SELECT k.tenant, k.engine_kind, k.priority
                       FROM (SELECT DISTINCT o.tenant, o.engine_kind, o.priority FROM v o WHERE o.hand_agent IS NOT NULL) k
                      WHERE (SELECT count(*) < ${sql.literalValue(String(HANDOFF_LOOKAHEAD))} AND NOT bool_or(ahead.tenant_key = k.tenant AND ahead.engine_kind = k.engine_kind)
                               FROM (SELECT older.tenant_key, older.engine_kind FROM ${w} older
                                      WHERE ${pendingAndDue("older", h.nowNs)} AND ${comesFirstSql(sql.fragment`older.priority`, sql.fragment`k.priority`)}
                                      ORDER BY ${claimOrder("older")}
                                      LIMIT ${sql.literalValue(String(HANDOFF_LOOKAHEAD))}) ahead) IS NOT FALSE)
               AND EXISTS (SELECT 1 FROM ${a} ha WHERE ha.name = v.hand_agent AND ${canTakeWork("ha")}
                              AND ${serves(agentRow("ha"), OFFERED)})
          ) hd ON true`
      : sql.fragment``;
    const handed = sql.fragment`hd.ok IS TRUE`;
    const values = h
      ? sql.fragment`CASE WHEN ${handed} THEN 'dispatched' ELSE 'pending' END, v.priority, v.next_attempt_at, 0, v.max_retries, v.max_redeliveries, v.idem, v.affinity,
               v.by, v.at, CASE WHEN ${handed} THEN v.hand_agent ELSE v.by END, CASE WHEN ${handed} THEN ${tsAt(h.now)} ELSE v.at END,
               CASE WHEN ${handed} THEN v.hand_agent END, CASE WHEN ${handed} THEN ${h.instance} END, CASE WHEN ${handed} THEN ${h.nowNs}::bigint END,
               CASE WHEN ${handed} THEN ${h.leaseExpiresNs}::bigint END, CASE WHEN ${handed} THEN v.hand_token END`
      : sql.fragment`'pending', v.priority, v.next_attempt_at, 0, v.max_retries, v.max_redeliveries, v.idem, v.affinity, v.by, v.at, v.by, v.at`;
    const handColumns = h ? sql.fragment`, agent_id, leased_by, dispatched_at, lease_expires_at, lease_token` : sql.fragment``;
    const returning = h ? HANDED_COLUMNS : sql.fragment`w.id`;
    return sql.type(idRow)`
        WITH v AS (
          SELECT * FROM unnest(${sql.array(p.ids, "text")}, ${sql.array(p.tenants, "text")}, ${sql.array(p.engineIds, "text")},
            ${sql.array(p.bys, "text")}, ${sql.array(p.ats, "timestamptz")}, ${sql.array(p.kinds, "text")}, ${sql.array(p.parents, "text")},
            ${sql.array(p.runIds, "text")}, ${sql.array(p.taskIds, "text")}, ${sql.array(p.taskNames, "text")},
            ${sql.array(p.workerParams, "jsonb")}, ${sql.array(p.payloads, "jsonb")}, ${sql.array(p.priorities, "int4")}, ${sql.array(p.notBefores, "int8")},
            ${sql.array(p.maxRetries, "int4")}, ${sql.array(p.maxRedeliveries, "int4")}, ${sql.array(p.idems, "text")}, ${sql.array(p.affinities, "text")}, ${sql.array(p.concurrencyKeys, "text")}, ${sql.array(p.traces, "text")},
            ${sql.array(p.rateKeys, "text")}, ${sql.array(p.ranks, "float8")}, ${sql.array(p.turnTenant, "int4")}, ${sql.array(p.turnBack, "int4")}${handArrays})
          WITH ORDINALITY AS v(id, tenant, engine_id, by, at, engine_kind, parent, run_id, task_id, task_name, worker_params, payload,
                               priority, next_attempt_at, max_retries, max_redeliveries, idem, affinity, ckey, trace, rkey, rank, tord, back${handNames}, ord)
        ), ${turnCtes(q, p)}
        -- The table is named within pg_stat_activity's first 1 KiB of the statement (tests find it there).
        INSERT INTO ${w} AS w (id, tenant_key, engine_id, engine_kind, parent_work_item_id, run_id, task_id, task_name, worker_params, payload, trace_context,
                          concurrency_key, rate_limit_key, rank, share_tag, status, priority, next_attempt_at, retry_count, max_retries, max_redeliveries, idempotency_key, affinity_key, createdby, createdon, updatedby, updatedon${handColumns})
        SELECT v.id, v.tenant, v.engine_id, v.engine_kind, v.parent, v.run_id, v.task_id, v.task_name, v.worker_params, v.payload, v.trace, v.ckey,
               v.rkey, v.rank, ${turnOf(sql.fragment`v`)}, ${values}
          FROM v${check}
         -- Rows go in in (tenant, idempotency key) order: two batches sharing keys (on any daemons)
         -- then wait on each other's keys in one order, never in a cycle (a deadlock). Dispatch order
         -- is by (priority, createdon, id), and ids ascend in arrival order, so this order is free.
         ORDER BY v.tenant COLLATE "C", v.idem COLLATE "C" NULLS LAST, v.ord
        ON CONFLICT (tenant_key, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING ${returning}`;
  });
  const inserted = await q.hotRowsUnchecked<ClaimedRow & { handed?: boolean }>(token);
  const fresh = new Map(inserted.map((r) => [r.id, r]));
  const missing = rows.filter((r) => !fresh.has(r.id) && r.item.idempotencyKey !== null);
  const existing = new Map<string, string>();
  if (missing.length > 0) {
    const found = await withDbErrors(() =>
      q.db.any(sql.type(z.object({ id: z.string(), tenant_key: z.string(), idempotency_key: z.string() }))`
          SELECT w.id, w.tenant_key, w.idempotency_key FROM ${w} w
            JOIN unnest(${sql.array(
              missing.map((r) => r.tenant),
              "text",
            )}, ${sql.array(
              missing.map((r) => r.item.idempotencyKey!),
              "text",
            )}) AS k(tenant, idem)
              ON w.tenant_key = k.tenant AND w.idempotency_key = k.idem`),
    );
    for (const f of found) existing.set(`${f.tenant_key}\u0000${f.idempotency_key}`, f.id);
  }
  return rows.map((r, i) => {
    const row = fresh.get(r.id);
    if (row) {
      if (!row.handed) return { id: r.id, existing: false };
      const { handed: _, ...claimed } = row;
      return { id: r.id, existing: false, claimed };
    }
    const id = r.item.idempotencyKey !== null ? existing.get(`${r.tenant}\u0000${r.item.idempotencyKey}`) : undefined;
    if (!id) throw new Error(`enqueue: row ${i} was neither inserted nor found by its idempotency key`);
    return { id, existing: true };
  });
}
