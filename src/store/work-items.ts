/**
 * The work queue's SQL on aiflow_work_item, by statement group in ./work-items/ (the operators'
 * aggregates are ./work-item-stats.ts). The queue's guarantees live there:
 *
 * - A claim is ONE statement: a CTE picks pending items with FOR UPDATE SKIP LOCKED and an
 *   UPDATE … RETURNING dispatches them with a fresh lease token. Several daemons share the queue.
 * - Every write to a dispatched item is fenced by its lease token and status, so a zombie agent's
 *   late completion matches no row and changes nothing.
 * - Expiry, failure and release return items to `pending` in one statement each; an item is never
 *   both re-queued and completed, because both require the same row in the same state.
 * - What a claim may take is defined once (./work-items/claim-rule.ts), for the claim and for the
 *   insert that hands new items to claims already waiting.
 *
 * Times: createdon/updatedon are timestamptz from the caller's clock; the engine-written times are
 * bigint epoch nanoseconds from the same clock. Nothing here calls now().
 *
 * The groups: enqueue.ts (insert, idempotency, direct dispatch), claim.ts, fenced-writes.ts (extend,
 * complete, fail, release), sweeps.ts (expiry, an agent's items, stranded keys, due checks),
 * cancel-redrive.ts, reads.ts; columns.ts holds the row shapes they share, context.ts what they run on.
 */
import type { CommonQueryMethods } from "slonik";
import type { PreparedQueries } from "../db/prepared.js";
import type { Tables } from "../db/tables.js";
import { cancel, redrive } from "./work-items/cancel-redrive.js";
import { claim, type ClaimInput, type ClaimResult } from "./work-items/claim.js";
import type { Completed, ItemStatus, Requeued, WorkItemRow } from "./work-items/columns.js";
import { ItemsContext, type Backoff, type Sharing } from "./work-items/context.js";
import { enqueueRows, enqueueRowsOf, type EnqueueResult, type EnqueueRow, type HandoffInput, type NewItem } from "./work-items/enqueue.js";
import { complete, extend, fail, release, type Completion, type Release } from "./work-items/fenced-writes.js";
import { childCounts, find, get, list, type ListFilter } from "./work-items/reads.js";
import {
  dueKeys,
  dueSince,
  extendHeldLeases,
  failStranded,
  failUnplaceable,
  releaseAgent,
  requeueAgent,
  requeueExpired,
  requeueLeases,
} from "./work-items/sweeps.js";
import type { Page } from "./paging.js";

export {
  ITEM_COLUMNS,
  ITEM_STATUSES,
  workItemRow,
  type ClaimedRow,
  type Completed,
  type ItemStatus,
  type Requeued,
  type WorkItemRow,
} from "./work-items/columns.js";
export type { Backoff, Sharing } from "./work-items/context.js";
export type { ClaimInput } from "./work-items/claim.js";
export { plainItem } from "./work-items/enqueue.js";
export type { EnqueueResult, EnqueueRow, HandoffInput, NewItem } from "./work-items/enqueue.js";
export type { Completion } from "./work-items/fenced-writes.js";
export type { ListFilter } from "./work-items/reads.js";

/** Every statement on the work item table, each documented where it is built. */
export class WorkItemStore {
  readonly #q: ItemsContext;

  constructor(
    db: CommonQueryMethods,
    t: Tables,
    backoff: Backoff,
    /** Named prepared statements for the hot path; without it, everything runs through slonik. */
    hot?: PreparedQueries,
    /** Fair share and aging as configured (./work-items/context.ts). */
    sharing?: Sharing,
  ) {
    this.#q = new ItemsContext(db, t, backoff, hot, sharing);
  }

  /** Inserts rows of one or many Enqueue calls in one statement, handing offered rows to waiting claims (./work-items/enqueue.ts). */
  enqueueRows(rows: readonly EnqueueRow[], handoff?: HandoffInput): Promise<EnqueueResult[]> {
    return enqueueRows(this.#q, rows, handoff);
  }

  /** Rows for enqueueRows from one call's items (sharing its traceparent); ids are made now, so they ascend in arrival order. */
  static rows(tenant: string, engineId: string, items: readonly NewItem[], nowMs: number, by: string, traceContext: string | null = null): EnqueueRow[] {
    return enqueueRowsOf(tenant, engineId, items, nowMs, by, traceContext);
  }

  /** The claim, one atomic statement, carrying the agent's completions (./work-items/claim.ts). */
  claim(c: ClaimInput): Promise<ClaimResult> {
    return claim(this.#q, c);
  }

  /** Extends the leases the agent still holds; returns their ids. */
  extend(
    agent: string,
    leases: readonly { id: string; token: string }[],
    nowMs: number,
    ttlMs: number,
    tenants: readonly string[] | null = null,
  ): Promise<readonly string[]> {
    return extend(this.#q, agent, leases, nowMs, ttlMs, tenants);
  }

  /** Completes fenced items; returns those that matched (the rest had lost their lease). */
  complete(agent: string, items: readonly Completion[], nowMs: number, tenants: readonly string[] | null = null): Promise<readonly Completed[]> {
    return complete(this.#q, agent, items, nowMs, tenants);
  }

  /** Fails fenced items: back to pending after a backoff while retries are left, else a dead letter. */
  fail(
    agent: string,
    items: readonly { id: string; token: string; error: string; retryable: boolean; delayMs: number | null }[],
    nowMs: number,
    tenants: readonly string[] | null = null,
  ): Promise<readonly Requeued[]> {
    return fail(this.#q, agent, items, nowMs, tenants);
  }

  /** Gives fenced items back without spending an attempt, counting a drain's deadline releases (see fenced-writes.ts). */
  release(agent: string, leases: readonly Release[], nowMs: number, tenants: readonly string[] | null = null): Promise<readonly string[]> {
    return release(this.#q, agent, leases, nowMs, tenants);
  }

  /** The expiry sweep: dispatched items whose lease ran out go back (an attempt spent) or fail. */
  requeueExpired(nowMs: number, by: string, limit = 1000): Promise<readonly Requeued[]> {
    return requeueExpired(this.#q, nowMs, by, limit);
  }

  /** The lease carry-over after an outage: these agents' dispatched items leased to nowMs + ttlMs at least, tokens kept (./work-items/sweeps.ts). */
  extendHeldLeases(agents: readonly string[], nowMs: number, ttlMs: number, by: string): Promise<readonly { id: string }[]> {
    return extendHeldLeases(this.#q, agents, nowMs, ttlMs, by);
  }

  /** Everything an agent holds goes back at once (it went inactive), an attempt spent. */
  requeueAgent(agent: string, nowMs: number, by: string, reason: string): Promise<readonly Requeued[]> {
    return requeueAgent(this.#q, agent, nowMs, by, reason);
  }

  /** These leases of an agent go back at once, a redelivery spent (their stream broke). */
  requeueLeases(agent: string, leases: readonly { id: string; token: string }[], nowMs: number, by: string, reason: string): Promise<readonly Requeued[]> {
    return requeueLeases(this.#q, agent, leases, nowMs, by, reason);
  }

  /** Everything an agent holds goes back without spending an attempt (a drain deadline passed). */
  releaseAgent(agent: string, nowMs: number, by: string, reason: string): Promise<readonly Requeued[]> {
    return releaseAgent(this.#q, agent, nowMs, by, reason);
  }

  /** Items stranded by their affinity key past the grace become dead letters (./work-items/sweeps.ts). */
  failUnplaceable(items: readonly { id: string; reason: string }[], nowMs: number, by: string): Promise<readonly { id: string; engine_kind: string }[]> {
    return failUnplaceable(this.#q, items, nowMs, by);
  }

  failStranded(nowMs: number, affinity: { policy: "hold" | "rebind"; graceMs: number }, by: string): Promise<readonly { id: string; engine_kind: string }[]> {
    return failStranded(this.#q, nowMs, affinity, by);
  }

  /** Cancels unfinished items (by ids, a run, or parents with their children) of one tenant. */
  cancel(
    tenant: string,
    target: { ids: string[]; runId: string | null; parentIds: string[] },
    reason: string,
    nowMs: number,
    by: string,
  ): Promise<readonly Requeued[]> {
    return cancel(this.#q, tenant, target, reason, nowMs, by);
  }

  /** Dead letters back to pending with a fresh retry budget. */
  redrive(tenant: string | null, target: { ids: string[]; runId: string | null; all: boolean }, nowMs: number, by: string): Promise<readonly string[]> {
    return redrive(this.#q, tenant, target, nowMs, by);
  }

  /** One item; tenant-qualified unless the caller is an operator (tenant null). */
  get(tenant: string | null, id: string): Promise<WorkItemRow | null> {
    return get(this.#q, tenant, id);
  }

  /** Items by ids or run, for Wait. */
  find(tenant: string, ids: readonly string[], runId: string | null): Promise<readonly WorkItemRow[]> {
    return find(this.#q, tenant, ids, runId);
  }

  /** A parent's children by status. */
  childCounts(tenant: string, parentId: string): Promise<Record<ItemStatus, number>> {
    return childCounts(this.#q, tenant, parentId);
  }

  /** One page in dispatch order (priority, createdon, id), keyset-paged, within f.limit rows and f.maxBytes. */
  list(f: ListFilter): Promise<Page<WorkItemRow>> {
    return list(this.#q, f);
  }

  /** Of these (tenant, engine kind) pairs, those with a pending item due at nowMs (the fallback re-check). */
  dueKeys(pairs: readonly { tenant: string; kind: string }[], nowMs: number): Promise<readonly { tenant_key: string; engine_kind: string }[]> {
    return dueKeys(this.#q, pairs, nowMs);
  }

  /** (tenant, engine kind) pairs with pending items that became due in (sinceMs, nowMs]: wake their claims. */
  dueSince(sinceMs: number, nowMs: number): Promise<readonly { tenant_key: string; engine_kind: string }[]> {
    return dueSince(this.#q, sinceMs, nowMs);
  }
}
