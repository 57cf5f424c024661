/**
 * SQL for aiflow_work_item, all of it. The queue's guarantees live here:
 *
 * - A claim is ONE statement: a CTE picks pending items with FOR UPDATE SKIP LOCKED and an
 *   UPDATE … RETURNING dispatches them with a fresh lease token. Several daemons share the queue.
 * - Every write to a dispatched item is fenced by its lease token and status, so a zombie agent's
 *   late completion matches no row and changes nothing.
 * - Expiry, failure and release return items to `pending` in one statement each; an item is never
 *   both re-queued and completed, because both require the same row in the same state.
 *
 * Times: createdon/updatedon are timestamptz from the caller's clock; the engine-written times are
 * bigint epoch nanoseconds from the same clock. Nothing here calls now().
 */
import { sql, type CommonQueryMethods, type FragmentSqlToken, type QuerySqlToken } from "slonik";
import { msToNs } from "../clock.js";
import { ts, tsAt, tsSeconds } from "../db/values.js";
import { StatementShapes, type Markers } from "../db/statement-shapes.js";
import type { PreparedQueries } from "../db/prepared.js";
import { newId as itemId } from "../util/ids.js";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import { canTakeWork } from "./agents.js";
import { budgeted, cutPage, pageSizes, type Page } from "./paging.js";

export const ITEM_STATUSES = ["pending", "dispatched", "completed", "failed", "cancelled"] as const;
export type ItemStatus = (typeof ITEM_STATUSES)[number];

export const workItemRow = z.object({
  id: z.string(),
  tenant_key: z.string(),
  engine_id: z.string(),
  engine_kind: z.string(),
  parent_work_item_id: z.string().nullable(),
  run_id: z.string().nullable(),
  task_id: z.string().nullable(),
  task_name: z.string().nullable(),
  worker_params: z.record(z.unknown()).nullable(),
  /** JSON text as jsonb writes it (see ITEM_COLUMNS). */
  payload: z.string().nullable(),
  status: z.enum(ITEM_STATUSES),
  priority: z.number().nullable(),
  agent_id: z.string().nullable(),
  dispatched_at: z.bigint().nullable(),
  completed_at: z.bigint().nullable(),
  lease_expires_at: z.bigint().nullable(),
  leased_by: z.string().nullable(),
  next_attempt_at: z.bigint().nullable(),
  retry_count: z.number().nullable(),
  max_retries: z.number().nullable(),
  error: z.string().nullable(),
  lease_token: z.string().nullable(),
  /** JSON text as jsonb writes it (see ITEM_COLUMNS). */
  result: z.string().nullable(),
  idempotency_key: z.string().nullable(),
  affinity_key: z.string().nullable(),
  createdon: z.number(),
  updatedon: z.number().nullable(),
});
export type WorkItemRow = z.infer<typeof workItemRow>;

/**
 * workItemRow's columns. The JSON ones are read as the text jsonb writes, never parsed here: parsed
 * and written again they lose digits past 2^53 and cost a stack frame per level of nesting.
 */
export const ITEM_COLUMNS = sql.fragment`id, tenant_key, engine_id, engine_kind, parent_work_item_id, run_id, task_id, task_name, worker_params,
  payload::text AS payload, status, priority, agent_id, dispatched_at, completed_at, lease_expires_at, leased_by, next_attempt_at,
  retry_count, max_retries, error, lease_token, result::text AS result, idempotency_key, affinity_key, createdon, updatedon`;

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
  /** Epoch ns; the item is not claimable before it. */
  notBeforeNs: bigint;
  parentId: string | null;
  idempotencyKey: string | null;
  affinityKey: string | null;
}

/** One item to insert, with the call it came from. */
export interface EnqueueRow {
  id: string;
  tenant: string;
  engineId: string;
  by: string;
  nowMs: number;
  item: NewItem;
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

export interface Backoff {
  baseMs: number;
  capMs: number;
  /** Full jitter (rand(0, bound)) when true; the bound itself when false (deterministic tests). */
  jitter: boolean;
}

/** An item given back to the queue or finished by a sweep, with what its holder had. */
export interface Requeued {
  id: string;
  status: ItemStatus;
  agent: string | null;
  token: string | null;
}

/**
 * `w.id = ANY(ids)`: the fenced writes join their input (unnest) to the table by id, and a planner
 * that believed the table empty (it was analysed when it was) drove that join from a full
 * primary-key scan with the input as the inner side: 7 ms per completion at 13,000 rows. Named as
 * an index condition on w, the ids are looked up whatever the planner believes.
 */
const byIds = (ids: readonly string[]) => sql.fragment`w.id = ANY(${sql.array(ids, "text")})`;

/**
 * A fenced write by a caller whose token is limited to some tenants touches only their items. The
 * services refuse such a caller for an agent of other tenants before any write; this holds even so.
 */
const withinTenants = (tenants: readonly string[] | null) => (tenants ? sql.fragment`AND w.tenant_key = ANY(${sql.array([...tenants], "text")})` : sql.fragment``);

/**
 * The id of a claim's n-th new binding (n from 1, at most 32,767): the claim's fresh ULID with the
 * three leading characters of its random part replaced by n in Crockford base 32, so a claim draws
 * one ULID rather than one for every item it might bind (it cannot know before the statement how
 * many keys it binds, and drawing `max` ids per claim was about a tenth of a busy daemon's allocations).
 * Still a ULID of the claim's time; distinct within the claim by n, and from other claims' ids by
 * the time and the remaining 65 random bits (a monotonic factory's ids of one millisecond differ in
 * their last characters, which stay).
 */
const CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
const bindingId = (seed: string, n: ReturnType<typeof sql.fragment>) =>
  sql.fragment`overlay(${seed}::text placing substr(${CROCKFORD}, (${n} / 1024 % 32)::int + 1, 1) || substr(${CROCKFORD}, (${n} / 32 % 32)::int + 1, 1) || substr(${CROCKFORD}, (${n} % 32)::int + 1, 1) from 11 for 3)`;

/** A fenced completion's bound values (see #completeCtes), one array per column. */
interface CompletionParams {
  doneIds: string[];
  doneTokens: string[];
  doneResults: (string | null)[];
}
const completionParams = (items: readonly Completion[]): CompletionParams => ({
  doneIds: items.map((i) => i.id),
  doneTokens: items.map((i) => i.token),
  doneResults: items.map((i) => i.resultJson),
});

const requeuedRow = z.object({ id: z.string(), status: z.enum(ITEM_STATUSES), agent: z.string().nullable(), token: z.string().nullable() });
const idRow = z.object({ id: z.string() });

export interface ClaimInput {
  agent: string;
  /** The daemon instance granting the lease (stored in leased_by). */
  instance: string;
  max: number;
  nowMs: number;
  leaseTtlMs: number;
  affinity: { policy: "hold" | "rebind"; graceMs: number };
  /** A fresh ULID: the bindings this claim creates take their ids from it (see bindingId). */
  bindingSeed: string;
  /**
   * The fencing token of this dispatch, shared by the items it takes: a token names one dispatch of
   * an item (every write checks id and token together), and a redispatch is another claim with
   * another token. One per claim rather than one per row keeps a random draw per item out of the
   * statement.
   */
  leaseToken: string;
  /** Items the agent finished, completed (fenced, as complete() does) in the claim's statement. */
  completions?: readonly Completion[];
}

/** A fenced completion: the item, the token it was dispatched under, and its result as JSON text. */
export interface Completion {
  id: string;
  token: string;
  resultJson: string | null;
}

/**
 * What a claim reads back: only the columns the claimed item's wire form needs and the claim did not
 * set itself (status, holder, lease and times are the claim's own values). JSON comes back as text,
 * which goes on the wire as it is (no parse and re-stringify per item), and these rows skip the zod
 * check: the statement's casts fix every column's type, and this runs once per dispatched item.
 */
export interface ClaimedRow {
  id: string;
  tenant_key: string;
  engine_id: string;
  engine_kind: string;
  parent_work_item_id: string | null;
  run_id: string | null;
  task_id: string | null;
  task_name: string | null;
  /** worker_params -> 'selector' as JSON text. */
  selector: string | null;
  /** payload as JSON text. */
  payload: string | null;
  priority: number | null;
  next_attempt_at: bigint | null;
  retry_count: number | null;
  max_retries: number | null;
  error: string | null;
  idempotency_key: string | null;
  affinity_key: string | null;
  /** createdon in epoch milliseconds. */
  createdon_ms: number;
}

/** The claim's RETURNING list: per ClaimedRow column its expression over `w` and its name, `id` first. */
const CLAIMED: readonly [FragmentSqlToken, string][] = [
  [sql.fragment`w.id`, "id"],
  [sql.fragment`w.tenant_key`, "tenant_key"],
  [sql.fragment`w.engine_id`, "engine_id"],
  [sql.fragment`w.engine_kind`, "engine_kind"],
  [sql.fragment`w.parent_work_item_id`, "parent_work_item_id"],
  [sql.fragment`w.run_id`, "run_id"],
  [sql.fragment`w.task_id`, "task_id"],
  [sql.fragment`w.task_name`, "task_name"],
  [sql.fragment`(w.worker_params -> 'selector')::text`, "selector"],
  [sql.fragment`w.payload::text`, "payload"],
  [sql.fragment`w.priority`, "priority"],
  [sql.fragment`w.next_attempt_at`, "next_attempt_at"],
  [sql.fragment`w.retry_count`, "retry_count"],
  [sql.fragment`w.max_retries`, "max_retries"],
  [sql.fragment`w.error`, "error"],
  [sql.fragment`w.idempotency_key`, "idempotency_key"],
  [sql.fragment`w.affinity_key`, "affinity_key"],
  [sql.fragment`(extract(epoch FROM w.createdon) * 1000)::float8`, "createdon_ms"],
];
const CLAIMED_COLUMNS = sql.join(
  CLAIMED.map(([expr, name]) => sql.fragment`${expr} AS ${sql.identifier([name])}`),
  sql.fragment`, `,
);
/** A completion's row in the claim's result: its id, then a NULL for each other claimed column. */
const CLAIMED_NULLS = sql.join(CLAIMED.slice(1).map(() => sql.fragment`NULL`), sql.fragment`, `);
/**
 * An insert's RETURNING list: the id, whether the row went in handed over, and the claimed columns
 * of those that did only (a bulk Enqueue would otherwise read back every payload it just sent).
 */
const HANDED_COLUMNS = sql.join(
  [
    sql.fragment`w.id`,
    sql.fragment`w.status = 'dispatched' AS handed`,
    ...CLAIMED.slice(1).map(([expr, name]) => sql.fragment`CASE WHEN w.status = 'dispatched' THEN ${expr} END AS ${sql.identifier([name])}`),
  ],
  sql.fragment`, `,
);

export interface ListFilter {
  /** Undefined: every tenant (operators without a tenant limit only). */
  tenants?: readonly string[];
  statuses: ItemStatus[];
  engineKind?: string;
  runId?: string;
  parentId?: string;
  agent?: string;
  /** Keyset cursor: the last row of the previous page. */
  after?: { priority: number; createdon: number; id: string };
  limit: number;
  /**
   * The page's payload and result bytes: rows are taken while they fit, and always at least one
   * (./paging.ts).
   */
  maxBytes: number;
}



export class WorkItemStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
    private readonly backoff: Backoff,
    /** Named prepared statements for the hot path; without it, everything runs through slonik. */
    private readonly hot?: PreparedQueries,
  ) {}

  /** The hot statements (enqueue, claim, completion), built once per shape. */
  readonly #shapes = new StatementShapes();

  /** Runs a hot-path statement as a prepared statement when a PreparedQueries is given. */
  #hot<T extends z.ZodTypeAny>(token: QuerySqlToken<T>): Promise<readonly z.infer<T>[]> {
    return this.hot ? this.hot.any(token) : withDbErrors(() => this.db.any(token));
  }

  /** A hot-path statement whose rows skip the zod check (see ClaimedRow for when that is right). */
  #hotRaw<T>(token: QuerySqlToken): Promise<readonly T[]> {
    return this.hot ? this.hot.raw<T>(token) : withDbErrors(() => this.db.any(token)) as Promise<readonly T[]>;
  }

  /** Ids a fenced write matched: one text column, read without a schema check (once per item). */
  #hotIds(token: QuerySqlToken<typeof idRow>): Promise<readonly string[]> {
    return this.#hotRaw<{ id: string }>(token).then((rows) => rows.map((r) => r.id));
  }

  /**
   * Inserts rows (of one or many Enqueue calls) in one statement. Rows whose (tenant, idempotency
   * key) already exists are skipped by the unique index; a second statement (a fresh snapshot, so it
   * sees rows another daemon committed meanwhile) reads their ids. Returns one result per row, in order.
   *
   * With `handoff`, rows offered to a waiting claim go in already dispatched to its agent, under its
   * lease, in this same statement, when the claim would have taken them: the agent is active and
   * serves the row's tenant and engine kind, and no pending item it could take comes first (one due
   * now, of that tenant and kind, at the same or a higher priority; the statement's own rows are not
   * in its snapshot, and the offers are made in claim order). Otherwise the row goes in pending, as
   * any other. Such a row comes back with its claimed columns (`claimed`).
   */
  async enqueueRows(rows: readonly EnqueueRow[], handoff?: HandoffInput): Promise<EnqueueResult[]> {
    const w = this.t.id("work_item");
    const a = this.t.id("agent");
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
      idems: col((r) => r.item.idempotencyKey),
      affinities: col((r) => r.item.affinityKey),
    };
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
    const token = this.#shapes.token(offered ? "enqueue:handoff" : "enqueue", params, (p) => {
      const h = offered ? (p as Markers<typeof params & HandoffParams>) : undefined;
      const handArrays = h ? sql.fragment`, ${sql.array(h.handAgents, "text")}, ${sql.array(h.handTokens, "text")}` : sql.fragment``;
      const handNames = h ? sql.fragment`, hand_agent, hand_token` : sql.fragment``;
      // The claim's conditions for the offered rows, read in this statement's snapshot. Whether a
      // pending item comes first is asked once per tenant, engine kind and priority of the batch (an
      // uncorrelated subquery, run once), by a walk in the claim index's order that stops after
      // HANDOFF_LOOKAHEAD due items: a batch behind a backlog that long is not handed over, so a
      // backlog of work the agent cannot take (another tenant's) costs the insert a bounded walk.
      const check = h
        ? sql.fragment`
          LEFT JOIN LATERAL (
            SELECT true AS ok
             WHERE v.hand_agent IS NOT NULL
               AND (v.tenant, v.engine_kind, v.priority) IN (
                     SELECT k.tenant, k.engine_kind, k.priority
                       FROM (SELECT DISTINCT o.tenant, o.engine_kind, o.priority FROM v o WHERE o.hand_agent IS NOT NULL) k
                      WHERE (SELECT count(*) < ${sql.literalValue(String(HANDOFF_LOOKAHEAD))} AND NOT bool_or(ahead.tenant_key = k.tenant AND ahead.engine_kind = k.engine_kind)
                               FROM (SELECT older.tenant_key, older.engine_kind FROM ${w} older
                                      WHERE older.status = 'pending' AND older.priority <= k.priority AND older.next_attempt_at + 0 <= ${h.nowNs}
                                      ORDER BY older.priority, older.createdon, older.id
                                      LIMIT ${sql.literalValue(String(HANDOFF_LOOKAHEAD))}) ahead) IS NOT FALSE)
               AND EXISTS (SELECT 1 FROM ${a} ha WHERE ha.name = v.hand_agent AND ${canTakeWork("ha")}
                              AND ha.metadata -> 'tenants' ? v.tenant AND ha.metadata -> 'engineKinds' ? v.engine_kind)
          ) hd ON true`
        : sql.fragment``;
      const handed = sql.fragment`hd.ok IS TRUE`;
      const values = h
        ? sql.fragment`CASE WHEN ${handed} THEN 'dispatched' ELSE 'pending' END, v.priority, v.next_attempt_at, 0, v.max_retries, v.idem, v.affinity,
               v.by, v.at, CASE WHEN ${handed} THEN v.hand_agent ELSE v.by END, CASE WHEN ${handed} THEN ${tsAt(h.now)} ELSE v.at END,
               CASE WHEN ${handed} THEN v.hand_agent END, CASE WHEN ${handed} THEN ${h.instance} END, CASE WHEN ${handed} THEN ${h.nowNs}::bigint END,
               CASE WHEN ${handed} THEN ${h.leaseExpiresNs}::bigint END, CASE WHEN ${handed} THEN v.hand_token END`
        : sql.fragment`'pending', v.priority, v.next_attempt_at, 0, v.max_retries, v.idem, v.affinity, v.by, v.at, v.by, v.at`;
      const handColumns = h ? sql.fragment`, agent_id, leased_by, dispatched_at, lease_expires_at, lease_token` : sql.fragment``;
      const returning = h ? HANDED_COLUMNS : sql.fragment`w.id`;
      return sql.type(idRow)`
        WITH v AS (
          SELECT * FROM unnest(${sql.array(p.ids, "text")}, ${sql.array(p.tenants, "text")}, ${sql.array(p.engineIds, "text")},
            ${sql.array(p.bys, "text")}, ${sql.array(p.ats, "timestamptz")}, ${sql.array(p.kinds, "text")}, ${sql.array(p.parents, "text")},
            ${sql.array(p.runIds, "text")}, ${sql.array(p.taskIds, "text")}, ${sql.array(p.taskNames, "text")},
            ${sql.array(p.workerParams, "jsonb")}, ${sql.array(p.payloads, "jsonb")}, ${sql.array(p.priorities, "int4")}, ${sql.array(p.notBefores, "int8")},
            ${sql.array(p.maxRetries, "int4")}, ${sql.array(p.idems, "text")}, ${sql.array(p.affinities, "text")}${handArrays})
          WITH ORDINALITY AS v(id, tenant, engine_id, by, at, engine_kind, parent, run_id, task_id, task_name, worker_params, payload,
                               priority, next_attempt_at, max_retries, idem, affinity${handNames}, ord)
        )
        -- The table is named within pg_stat_activity's first 1 KiB of the statement (tests find it there).
        INSERT INTO ${w} AS w (id, tenant_key, engine_id, engine_kind, parent_work_item_id, run_id, task_id, task_name, worker_params, payload,
                          status, priority, next_attempt_at, retry_count, max_retries, idempotency_key, affinity_key, createdby, createdon, updatedby, updatedon${handColumns})
        SELECT v.id, v.tenant, v.engine_id, v.engine_kind, v.parent, v.run_id, v.task_id, v.task_name, v.worker_params, v.payload,
               ${values}
          FROM v${check}
         -- Rows go in in (tenant, idempotency key) order: two batches sharing keys (on any daemons)
         -- then wait on each other's keys in one order, never in a cycle (a deadlock). Dispatch order
         -- is by (priority, createdon, id), and ids ascend in arrival order, so this order is free.
         ORDER BY v.tenant COLLATE "C", v.idem COLLATE "C" NULLS LAST, v.ord
        ON CONFLICT (tenant_key, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING ${returning}`;
    });
    const inserted = await this.#hotRaw<ClaimedRow & { handed?: boolean }>(token);
    const fresh = new Map(inserted.map((r) => [r.id, r]));
    const missing = rows.filter((r) => !fresh.has(r.id) && r.item.idempotencyKey !== null);
    const existing = new Map<string, string>();
    if (missing.length > 0) {
      const found = await withDbErrors(() =>
        this.db.any(sql.type(z.object({ id: z.string(), tenant_key: z.string(), idempotency_key: z.string() }))`
          SELECT w.id, w.tenant_key, w.idempotency_key FROM ${w} w
            JOIN unnest(${sql.array(missing.map((r) => r.tenant), "text")}, ${sql.array(missing.map((r) => r.item.idempotencyKey!), "text")}) AS k(tenant, idem)
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

  /** Rows for enqueueRows from one call's items; ids are made now, so they ascend in arrival order. */
  static rows(tenant: string, engineId: string, items: readonly NewItem[], nowMs: number, by: string): EnqueueRow[] {
    return items.map((item) => ({ id: itemId(nowMs), tenant, engineId, by, nowMs, item }));
  }

  /**
   * The claim: one atomic statement. Only an ACTIVE agent claims; it takes pending items of the
   * tenants and engine kinds it registered with, whose next attempt is due, and whose selector its
   * tags satisfy (jsonb containment: every selector pair must be among the agent's tags), in
   * priority, creation order.
   *
   * Affinity, in the same statement: an item whose key is unbound binds it to this agent
   * (INSERT … ON CONFLICT DO NOTHING — of two racing claims, one insert wins and the loser dispatches
   * none of the key's items); an item whose key is bound to this agent is taken only after this
   * statement has updated the binding row (bumping updatedon), and an item whose key is bound to
   * another agent only when that agent cannot take work, the grace has passed since the key's last
   * dispatch, none of the key's items is in flight, and the policy is rebind — by moving the binding
   * row. Both paths write the binding row, so they serialise on its lock, and Postgres re-checks the
   * UPDATE's conditions against the committed row: a dispatch and a move of one key can never both
   * succeed, and no two agents ever hold items of one key at once.
   *
   * A move is a compare-and-swap on the binding row's version (xmin) as this statement's snapshot
   * read it. After a lock wait the re-check sees the new row but answers the agent and in-flight
   * subqueries from the old snapshot, and `updatedon` cannot stand in for a version: it is the
   * writer's clock reading, taken before its statement ran, so a dispatch that waited on this lock
   * past the grace stamps a time already older than the grace (as does one from a daemon whose clock
   * lags). Any write to the row since the snapshot changes xmin, so such a move matches nothing and a
   * later claim decides afresh.
   */
  async claim(c: ClaimInput): Promise<{ claimed: ClaimedRow[]; completed: string[] }> {
    const w = this.t.id("work_item");
    const a = this.t.id("agent");
    const b = this.t.id("affinity_binding");
    const completions = c.completions ?? [];
    const max = Math.trunc(c.max);
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
      ...(completions.length > 0 ? completionParams(completions) : {}),
    };
    const token = this.#shapes.token(`claim:${completions.length > 0 ? "completing" : "plain"}:${max}`, params, (p) => {
      // Completions ride in the same statement: a data-modifying CTE sees the claim's snapshot, and the
      // items it completes are dispatched ones, which the claim's scan (pending only) never reads.
      const done =
        "doneIds" in p
          ? sql.fragment`${this.#completeCtes(p as Markers<typeof params & CompletionParams>)}, done AS (SELECT id FROM completing UNION ALL SELECT id FROM recompleted), `
          : sql.fragment``;
      const graceEdge = tsAt(p.graceEdge);
      return sql.unsafe`
        WITH ${done}agent AS MATERIALIZED (
          SELECT ARRAY(SELECT jsonb_array_elements_text(metadata -> 'tenants')) AS tenants,
                 ARRAY(SELECT jsonb_array_elements_text(metadata -> 'engineKinds')) AS kinds,
                 COALESCE(metadata -> 'tags', '{}'::jsonb) AS tags
            FROM ${a} WHERE name = ${p.agent} AND ${canTakeWork()}
        ), picked AS (
          -- A single-table scan in the claim index's order, so LIMIT stops it early; the agent's
          -- lists are computed once (InitPlans) and an agent that may not claim scans nothing.
          -- "+ 0" keeps the planner off the due index (when most pending items wait on a backoff, it
          -- would otherwise fetch every due row and sort them all) and matches the claim index's last
          -- key, so items not yet due are passed over on their index entries (migration 0005).
          SELECT w.id, w.affinity_key FROM ${w} w
           WHERE EXISTS (SELECT 1 FROM agent)
             AND w.status = 'pending'
             AND w.next_attempt_at + 0 <= ${p.nowNs}
             AND w.tenant_key = ANY((SELECT tenants FROM agent)::text[])
             AND w.engine_kind = ANY((SELECT kinds FROM agent)::text[])
             AND (w.worker_params -> 'selector' IS NULL OR (SELECT tags FROM agent) @> (w.worker_params -> 'selector'))
             AND (w.affinity_key IS NULL OR NOT EXISTS (
                   SELECT 1 FROM ${b} bb
                    WHERE bb.affinity_key = w.affinity_key AND bb.agent_id <> ${p.agent}
                      AND NOT (${p.rebind} AND bb.updatedon < ${graceEdge}
                               AND NOT EXISTS (SELECT 1 FROM ${a} ba WHERE ba.name = bb.agent_id AND ${canTakeWork("ba")})
                               AND NOT EXISTS (SELECT 1 FROM ${w} wd WHERE wd.affinity_key = w.affinity_key AND wd.status = 'dispatched'))))
           ORDER BY w.priority, w.createdon, w.id
           LIMIT ${sql.literalValue(String(max))}
           FOR UPDATE OF w SKIP LOCKED
        ), keys AS (
          -- v: the binding row's version in this statement's snapshot (NULL when the key is unbound).
          SELECT d.k, bk.xmin::text AS v, row_number() OVER (ORDER BY d.k) AS n
            FROM (SELECT DISTINCT affinity_key AS k FROM picked WHERE affinity_key IS NOT NULL) d
            LEFT JOIN ${b} bk ON bk.affinity_key = d.k
        ), pinned AS (
          INSERT INTO ${b} (id, affinity_key, agent_id, createdby, createdon, updatedby, updatedon)
          SELECT ${bindingId(p.bindingSeed, sql.fragment`keys.n`)}, keys.k, ${p.agent}, ${p.agent}, ${tsAt(p.now)}, ${p.agent}, ${tsAt(p.now)} FROM keys
          ON CONFLICT (affinity_key) DO NOTHING
          RETURNING affinity_key
        ), held AS (
          UPDATE ${b} bb SET agent_id = ${p.agent}, updatedby = ${p.agent}, updatedon = ${tsAt(p.now)}
            FROM keys
           WHERE bb.affinity_key = keys.k
             AND (bb.agent_id = ${p.agent}
                  OR (${p.rebind} AND bb.xmin::text = keys.v AND bb.updatedon < ${graceEdge}
                      AND NOT EXISTS (SELECT 1 FROM ${a} ba WHERE ba.name = bb.agent_id AND ${canTakeWork("ba")})
                      AND NOT EXISTS (SELECT 1 FROM ${w} wd WHERE wd.affinity_key = bb.affinity_key AND wd.status = 'dispatched')))
          RETURNING bb.affinity_key
        ), claimed AS (
        UPDATE ${w} w
           SET status = 'dispatched', agent_id = ${p.agent}, leased_by = ${p.instance}, dispatched_at = ${p.nowNs},
               lease_expires_at = ${p.leaseExpiresNs}, lease_token = ${p.leaseToken},
               updatedby = ${p.agent}, updatedon = ${tsAt(p.now)}
          FROM picked
         WHERE w.id = picked.id
           AND (picked.affinity_key IS NULL
                OR picked.affinity_key IN (SELECT affinity_key FROM pinned)
                OR picked.affinity_key IN (SELECT affinity_key FROM held))
        RETURNING ${CLAIMED_COLUMNS}
        )
        SELECT false AS done, claimed.* FROM claimed
        ${"doneIds" in p ? sql.fragment`UNION ALL SELECT true, done.id, ${CLAIMED_NULLS} FROM done` : sql.fragment``}`;
    });
    const rows = await this.#hotRaw<ClaimedRow & { done: boolean }>(token);
    const claimed: ClaimedRow[] = [];
    const completed: string[] = [];
    for (const r of rows) if (r.done) completed.push(r.id);
    else claimed.push(r);
    return { claimed, completed };
  }

  /**
   * Items stranded by their affinity key become dead letters once they have waited longer than the
   * grace: always when the key's agent is active but may not run the item (another tenant, engine
   * kind or selector — a binding never routes work to an agent that may not run it, and the key does
   * not move while its agent is active); under the hold policy also when the agent cannot take work.
   */
  failStranded(nowMs: number, affinity: { policy: "hold" | "rebind"; graceMs: number }, by: string): Promise<readonly string[]> {
    const w = this.t.id("work_item");
    const a = this.t.id("agent");
    const b = this.t.id("affinity_binding");
    const hold = affinity.policy === "hold";
    // The key's agent exists and may take work (ba is LEFT JOINed: the name test keeps a missing
    // agent false rather than NULL, so NOT of it holds).
    const holderCanWork = sql.fragment`(ba.name IS NOT NULL AND ${canTakeWork("ba")})`;
    return withDbErrors(() =>
      this.db.anyFirst(sql.type(idRow)`
        UPDATE ${w} w
           SET status = 'failed', completed_at = ${msToNs(nowMs)}::bigint, updatedby = ${by}, updatedon = ${ts(nowMs)},
               error = format('affinity key %s is bound to agent %s, which %s', w.affinity_key, bb.agent_id,
                              CASE WHEN NOT ${holderCanWork}
                                   THEN 'cannot take work (policy hold); unbind or rebind the key, then redrive'
                                   ELSE 'may not run it (tenant, engine kind or selector); rebind the key, then redrive' END)
          FROM ${b} bb LEFT JOIN ${a} ba ON ba.name = bb.agent_id
         WHERE w.status = 'pending' AND w.affinity_key = bb.affinity_key
           AND w.next_attempt_at < ${msToNs(nowMs - affinity.graceMs)}::bigint
           AND ((${holderCanWork}
                 AND NOT (w.tenant_key = ANY(ARRAY(SELECT jsonb_array_elements_text(ba.metadata -> 'tenants')))
                          AND w.engine_kind = ANY(ARRAY(SELECT jsonb_array_elements_text(ba.metadata -> 'engineKinds')))
                          AND (w.worker_params -> 'selector' IS NULL OR COALESCE(ba.metadata -> 'tags', '{}'::jsonb) @> (w.worker_params -> 'selector'))))
                OR (${hold} AND NOT ${holderCanWork} AND bb.updatedon < ${ts(nowMs - affinity.graceMs)}))
        RETURNING w.id`),
    );
  }

  /** Extends the leases the agent still holds; returns their ids. */
  extend(agent: string, leases: readonly { id: string; token: string }[], nowMs: number, ttlMs: number, tenants: readonly string[] | null = null): Promise<readonly string[]> {
    const w = this.t.id("work_item");
    return this.#hotIds(sql.type(idRow)`
        UPDATE ${w} w SET lease_expires_at = ${msToNs(nowMs + ttlMs)}, updatedby = ${agent}, updatedon = ${ts(nowMs)}
          FROM unnest(${sql.array(leases.map((l) => l.id), "text")}, ${sql.array(leases.map((l) => l.token), "text")}) AS v(id, token)
         WHERE ${byIds(leases.map((l) => l.id))} AND w.id = v.id AND w.lease_token = v.token AND w.status = 'dispatched' AND w.agent_id = ${agent}
           ${withinTenants(tenants)}
        RETURNING w.id`);
  }

  /** Completes fenced items; returns the ids that matched (the rest had lost their lease). */
  complete(agent: string, items: readonly Completion[], nowMs: number, tenants: readonly string[] | null = null): Promise<readonly string[]> {
    const params = { agent, nowNs: msToNs(nowMs), now: tsSeconds(nowMs), ...completionParams(items), ...(tenants ? { tenants: [...tenants] } : {}) };
    return this.#hotIds(
      this.#shapes.token(tenants ? "complete:tenants" : "complete", params, (p) => sql.type(idRow)`
        WITH ${this.#completeCtes(p)}
        SELECT id FROM completing UNION ALL SELECT id FROM recompleted`) as QuerySqlToken<typeof idRow>,
    );
  }

  /**
   * The fenced completion as two CTEs (of its own statement, or of a claim's): `completing` completes
   * the items still held under their tokens, `recompleted` finds those this agent already completed
   * under the same tokens. A completion is idempotent, so a report whose answer was lost (the call
   * failed after the commit: a daemon restart, a dropped connection, a claim carrying it cut short)
   * is answered ok when it is sent again, not "lease lost". Both read the statement's snapshot, so an
   * item completed by `completing` is not found again by `recompleted`. The completed row keeps its
   * token for that; no fenced write matches a row that is not dispatched.
   */
  #completeCtes(p: Markers<CompletionParams & { agent: string; nowNs: bigint; now: string; tenants?: string[] }>): FragmentSqlToken {
    const w = this.t.id("work_item");
    const v = sql.fragment`unnest(${sql.array(p.doneIds, "text")}, ${sql.array(p.doneTokens, "text")}, ${sql.array(p.doneResults, "jsonb")}) AS v(id, token, result)`;
    const ids = byIds(p.doneIds);
    const within = p.tenants ? sql.fragment`AND w.tenant_key = ANY(${sql.array(p.tenants as unknown as readonly string[], "text")})` : sql.fragment``;
    return sql.fragment`completing AS (
        UPDATE ${w} w SET status = 'completed', completed_at = ${p.nowNs}, result = v.result, lease_expires_at = NULL,
                          updatedby = ${p.agent}, updatedon = ${tsAt(p.now)}
          FROM ${v}
         WHERE ${ids} AND w.id = v.id AND w.lease_token = v.token AND w.status = 'dispatched' AND w.agent_id = ${p.agent} ${within}
        RETURNING w.id
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
  fail(
    agent: string,
    items: readonly { id: string; token: string; error: string; retryable: boolean; delayMs: number | null }[],
    nowMs: number,
    tenants: readonly string[] | null = null,
  ): Promise<readonly Requeued[]> {
    const w = this.t.id("work_item");
    const retry = sql.fragment`(v.retryable AND w.retry_count < w.max_retries)`;
    return this.#hot(sql.type(requeuedRow)`
        UPDATE ${w} w SET
               status = CASE WHEN ${retry} THEN 'pending' ELSE 'failed' END,
               retry_count = CASE WHEN ${retry} THEN w.retry_count + 1 ELSE w.retry_count END,
               next_attempt_at = CASE WHEN ${retry} THEN ${msToNs(nowMs)}::bigint + COALESCE(v.delay_ns, ${this.#backoffNs(sql.fragment`w.retry_count`)}) ELSE w.next_attempt_at END,
               completed_at = CASE WHEN ${retry} THEN NULL ELSE ${msToNs(nowMs)}::bigint END,
               agent_id = CASE WHEN ${retry} THEN NULL ELSE w.agent_id END,
               error = v.error, lease_expires_at = NULL, lease_token = NULL, updatedby = ${agent}, updatedon = ${ts(nowMs)}
          FROM unnest(${sql.array(items.map((i) => i.id), "text")}, ${sql.array(items.map((i) => i.token), "text")}, ${sql.array(items.map((i) => i.error), "text")},
                      ${sql.array(items.map((i) => i.retryable), "bool")}, ${sql.array(items.map((i) => (i.delayMs === null ? null : String(msToNs(i.delayMs)))), "int8")})
               AS v(id, token, error, retryable, delay_ns)
         WHERE ${byIds(items.map((i) => i.id))} AND w.id = v.id AND w.lease_token = v.token AND w.status = 'dispatched' AND w.agent_id = ${agent}
           ${withinTenants(tenants)}
        RETURNING w.id, w.status, ${agent}::text AS agent, v.token`);
  }

  /** Gives fenced items back without spending an attempt. */
  release(agent: string, leases: readonly { id: string; token: string }[], nowMs: number, tenants: readonly string[] | null = null): Promise<readonly string[]> {
    const w = this.t.id("work_item");
    return this.#hotIds(sql.type(idRow)`
        UPDATE ${w} w SET status = 'pending', agent_id = NULL, lease_expires_at = NULL, lease_token = NULL, dispatched_at = NULL,
                          next_attempt_at = ${msToNs(nowMs)}, updatedby = ${agent}, updatedon = ${ts(nowMs)}
          FROM unnest(${sql.array(leases.map((l) => l.id), "text")}, ${sql.array(leases.map((l) => l.token), "text")}) AS v(id, token)
         WHERE ${byIds(leases.map((l) => l.id))} AND w.id = v.id AND w.lease_token = v.token AND w.status = 'dispatched' AND w.agent_id = ${agent}
           ${withinTenants(tenants)}
        RETURNING w.id`);
  }

  /** The expiry sweep: dispatched items whose lease ran out go back (an attempt spent) or fail. */
  requeueExpired(nowMs: number, by: string, limit = 1000): Promise<readonly Requeued[]> {
    return this.#requeue(sql.fragment`status = 'dispatched' AND lease_expires_at < ${msToNs(nowMs)}`, "lease expired", nowMs, by, true, limit);
  }

  /** Everything an agent holds goes back at once (it went inactive), an attempt spent. */
  requeueAgent(agent: string, nowMs: number, by: string, reason: string): Promise<readonly Requeued[]> {
    return this.#requeue(sql.fragment`status = 'dispatched' AND agent_id = ${agent}`, reason, nowMs, by, true, 100_000);
  }

  /** Everything an agent holds goes back without spending an attempt (a drain deadline passed). */
  releaseAgent(agent: string, nowMs: number, by: string, reason: string): Promise<readonly Requeued[]> {
    return this.#requeue(sql.fragment`status = 'dispatched' AND agent_id = ${agent}`, reason, nowMs, by, false, 100_000);
  }

  #requeue(where: FragmentSqlToken, reason: string, nowMs: number, by: string, spendAttempt: boolean, limit: number): Promise<readonly Requeued[]> {
    const w = this.t.id("work_item");
    const retry = spendAttempt ? sql.fragment`(w.retry_count < w.max_retries)` : sql.fragment`true`;
    const nowNs = msToNs(nowMs);
    return withDbErrors(() =>
      this.db.any(sql.type(requeuedRow)`
        WITH gone AS (
          SELECT id, agent_id, lease_token FROM ${w} WHERE ${where} ORDER BY id LIMIT ${limit} FOR UPDATE SKIP LOCKED
        )
        UPDATE ${w} w SET
               status = CASE WHEN ${retry} THEN 'pending' ELSE 'failed' END,
               retry_count = CASE WHEN ${retry} AND ${spendAttempt} THEN w.retry_count + 1 ELSE w.retry_count END,
               next_attempt_at = CASE WHEN ${retry} THEN ${nowNs}::bigint + ${spendAttempt ? this.#backoffNs(sql.fragment`w.retry_count`) : sql.fragment`0`} ELSE w.next_attempt_at END,
               completed_at = CASE WHEN ${retry} THEN NULL ELSE ${nowNs}::bigint END,
               agent_id = CASE WHEN ${retry} THEN NULL ELSE w.agent_id END,
               error = CASE WHEN ${spendAttempt} THEN ${reason} ELSE w.error END,
               lease_expires_at = NULL, lease_token = NULL, dispatched_at = NULL, updatedby = ${by}, updatedon = ${ts(nowMs)}
          FROM gone
         WHERE w.id = gone.id
        RETURNING w.id, w.status, gone.agent_id AS agent, gone.lease_token AS token`),
    );
  }

  /**
   * Backoff in ns for an item that has been retried `retries` times: exponential with full jitter,
   * rand(0, min(cap, base × 2^retries)). Computed in SQL so a batch needs one statement.
   */
  #backoffNs(retries: FragmentSqlToken): FragmentSqlToken {
    const { baseMs, capMs, jitter } = this.backoff;
    const bound = sql.fragment`least(${capMs}::float8, ${baseMs}::float8 * power(2::float8, least(${retries}, 60)))`;
    return sql.fragment`(floor(${jitter ? sql.fragment`random()` : sql.fragment`1`} * ${bound}) * 1000000)::bigint`;
  }

  /** Cancels unfinished items (by ids, a run, or parents with their children) of one tenant. */
  cancel(
    tenant: string,
    target: { ids: string[]; runId: string | null; parentIds: string[] },
    reason: string,
    nowMs: number,
    by: string,
  ): Promise<readonly Requeued[]> {
    const w = this.t.id("work_item");
    const runClause = target.runId ? sql.fragment`OR run_id = ${target.runId}` : sql.fragment``;
    return withDbErrors(() =>
      this.db.any(sql.type(requeuedRow)`
        WITH doomed AS (
          SELECT id, agent_id, lease_token, status FROM ${w}
           WHERE tenant_key = ${tenant} AND status IN ('pending', 'dispatched')
             AND (id = ANY(${sql.array(target.ids, "text")})
                  OR id = ANY(${sql.array(target.parentIds, "text")})
                  OR parent_work_item_id = ANY(${sql.array(target.parentIds, "text")})
                  ${runClause})
           FOR UPDATE
        )
        UPDATE ${w} w SET status = 'cancelled', completed_at = ${msToNs(nowMs)}, error = ${reason}, lease_expires_at = NULL, lease_token = NULL,
                          updatedby = ${by}, updatedon = ${ts(nowMs)}
          FROM doomed
         WHERE w.id = doomed.id
        RETURNING w.id, w.status, CASE WHEN doomed.status = 'dispatched' THEN doomed.agent_id END AS agent, doomed.lease_token AS token`),
    );
  }

  /** Dead letters back to pending with a fresh retry budget. */
  redrive(tenant: string | null, target: { ids: string[]; runId: string | null; all: boolean }, nowMs: number, by: string): Promise<readonly string[]> {
    const w = this.t.id("work_item");
    const tenantClause = tenant ? sql.fragment`AND tenant_key = ${tenant}` : sql.fragment``;
    const which = target.all
      ? sql.fragment`true`
      : sql.fragment`(id = ANY(${sql.array(target.ids, "text")}) ${target.runId ? sql.fragment`OR run_id = ${target.runId}` : sql.fragment``})`;
    return withDbErrors(() =>
      this.db.anyFirst(sql.type(idRow)`
        UPDATE ${w} SET status = 'pending', retry_count = 0, next_attempt_at = ${msToNs(nowMs)}, completed_at = NULL, agent_id = NULL,
                        updatedby = ${by}, updatedon = ${ts(nowMs)}
         WHERE status = 'failed' ${tenantClause} AND ${which}
        RETURNING id`),
    );
  }

  /** One item; tenant-qualified unless the caller is an operator (tenant null). */
  get(tenant: string | null, id: string): Promise<WorkItemRow | null> {
    const w = this.t.id("work_item");
    const scope = tenant === null ? sql.fragment`true` : sql.fragment`tenant_key = ${tenant}`;
    return withDbErrors(() => this.db.maybeOne(sql.type(workItemRow)`SELECT ${ITEM_COLUMNS} FROM ${w} WHERE ${scope} AND id = ${id}`));
  }

  /** Items by ids or run, for Wait. */
  find(tenant: string, ids: readonly string[], runId: string | null): Promise<readonly WorkItemRow[]> {
    const w = this.t.id("work_item");
    return withDbErrors(() =>
      this.db.any(sql.type(workItemRow)`
        SELECT ${ITEM_COLUMNS} FROM ${w} WHERE tenant_key = ${tenant}
           AND (id = ANY(${sql.array([...ids], "text")}) ${runId ? sql.fragment`OR run_id = ${runId}` : sql.fragment``})
         ORDER BY priority, createdon, id`),
    );
  }

  childCounts(tenant: string, parentId: string): Promise<Record<ItemStatus, number>> {
    const w = this.t.id("work_item");
    return withDbErrors(async () => {
      const rows = await this.db.any(sql.type(z.object({ status: z.enum(ITEM_STATUSES), n: z.number() }))`
        SELECT status, count(*)::int AS n FROM ${w} WHERE tenant_key = ${tenant} AND parent_work_item_id = ${parentId} GROUP BY status`);
      const counts = { pending: 0, dispatched: 0, completed: 0, failed: 0, cancelled: 0 };
      for (const r of rows) counts[r.status] = r.n;
      return counts;
    });
  }

  /** One page in dispatch order (priority, createdon, id), keyset-paged, within f.limit rows and f.maxBytes. */
  list(f: ListFilter): Promise<Page<WorkItemRow>> {
    const w = this.t.id("work_item");
    const conds = [
      f.tenants === undefined ? sql.fragment`true` : f.tenants.length === 1 ? sql.fragment`tenant_key = ${f.tenants[0]!}` : sql.fragment`tenant_key = ANY(${sql.array([...f.tenants], "text")})`,
    ];
    if (f.statuses.length > 0) conds.push(sql.fragment`status = ANY(${sql.array(f.statuses, "text")})`);
    if (f.engineKind) conds.push(sql.fragment`engine_kind = ${f.engineKind}`);
    if (f.runId) conds.push(sql.fragment`run_id = ${f.runId}`);
    if (f.parentId) conds.push(sql.fragment`parent_work_item_id = ${f.parentId}`);
    if (f.agent) conds.push(sql.fragment`agent_id = ${f.agent}`);
    if (f.after) conds.push(sql.fragment`(priority, createdon, id) > (${f.after.priority}, ${ts(f.after.createdon)}, ${f.after.id})`);
    const order = sql.fragment`priority, createdon, id`;
    const inner = sql.fragment`SELECT ${ITEM_COLUMNS} FROM ${w} WHERE ${sql.join(conds, sql.fragment` AND `)} ORDER BY ${order} LIMIT ${f.limit + 1}`;
    const size = sql.fragment`coalesce(octet_length(payload), 0) + coalesce(octet_length(result), 0)`;
    return withDbErrors(async () => cutPage(await this.db.any(sql.type(workItemRow.merge(pageSizes))`${budgeted(inner, order, size, f.maxBytes)}`), f.limit, f.maxBytes));
  }

  /**
   * Of these (tenant, engine kind) pairs, those with a pending item due at nowMs: one statement for
   * every claim this daemon has waiting (the fallback re-check), however many there are.
   */
  dueKeys(pairs: readonly { tenant: string; kind: string }[], nowMs: number): Promise<readonly { tenant_key: string; engine_kind: string }[]> {
    if (pairs.length === 0) return Promise.resolve([]);
    const w = this.t.id("work_item");
    return withDbErrors(() =>
      this.db.any(sql.type(z.object({ tenant_key: z.string(), engine_kind: z.string() }))`
        SELECT k.t AS tenant_key, k.e AS engine_kind
          FROM unnest(${sql.array(pairs.map((p) => p.tenant), "text")}, ${sql.array(pairs.map((p) => p.kind), "text")}) AS k(t, e)
         WHERE EXISTS (SELECT 1 FROM ${w} WHERE status = 'pending' AND tenant_key = k.t AND engine_kind = k.e AND next_attempt_at <= ${msToNs(nowMs)})`),
    );
  }

  /** (tenant, engine kind) pairs with pending items that became due in (sinceMs, nowMs]: wake their claims. */
  dueSince(sinceMs: number, nowMs: number): Promise<readonly { tenant_key: string; engine_kind: string }[]> {
    const w = this.t.id("work_item");
    return withDbErrors(() =>
      this.db.any(sql.type(z.object({ tenant_key: z.string(), engine_kind: z.string() }))`
        SELECT DISTINCT tenant_key, engine_kind FROM ${w}
         WHERE status = 'pending' AND next_attempt_at > ${msToNs(sinceMs)} AND next_attempt_at <= ${msToNs(nowMs)}`),
    );
  }
}
