/**
 * The work item's row as the statements read it back: the full row (reads, stats), the claimed
 * columns (a claim's or a handing insert's RETURNING list), and the small rows of the writes.
 */
import { sql, type FragmentSqlToken } from "slonik";
import { z } from "zod";

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
  redelivery_count: z.number(),
  max_redeliveries: z.number(),
  error: z.string().nullable(),
  lease_token: z.string().nullable(),
  /** JSON text as jsonb writes it (see ITEM_COLUMNS). */
  result: z.string().nullable(),
  idempotency_key: z.string().nullable(),
  affinity_key: z.string().nullable(),
  /** W3C traceparent of the span that enqueued it (migration 0007). */
  trace_context: z.string().nullable(),
  /** The GPUs the current or last dispatch placed it on (migration 0008). */
  gpu_indices: z.array(z.number()).nullable(),
  concurrency_key: z.string().nullable(),
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
  retry_count, max_retries, redelivery_count, max_redeliveries, error, lease_token, result::text AS result, idempotency_key, affinity_key, trace_context, gpu_indices, concurrency_key, createdon, updatedon`;

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
  redelivery_count: number;
  max_redeliveries: number;
  error: string | null;
  idempotency_key: string | null;
  affinity_key: string | null;
  /** W3C traceparent of the span that enqueued it: handed to the agent as it is. */
  trace_context: string | null;
  /** worker_params minus the selector, as JSON text: requirements and concurrency key (null when neither). */
  params: string | null;
  /** The GPUs this dispatch placed it on. */
  gpu_indices: number[] | null;
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
  [sql.fragment`w.redelivery_count`, "redelivery_count"],
  [sql.fragment`w.max_redeliveries`, "max_redeliveries"],
  [sql.fragment`w.error`, "error"],
  [sql.fragment`w.idempotency_key`, "idempotency_key"],
  [sql.fragment`w.affinity_key`, "affinity_key"],
  [sql.fragment`w.trace_context`, "trace_context"],
  [sql.fragment`(NULLIF(w.worker_params - 'selector' - 'affinityKey', '{}'::jsonb))::text`, "params"],
  [sql.fragment`w.gpu_indices`, "gpu_indices"],
  [sql.fragment`(extract(epoch FROM w.createdon) * 1000)::float8`, "createdon_ms"],
];
export const CLAIMED_COLUMNS = sql.join(
  CLAIMED.map(([expr, name]) => sql.fragment`${expr} AS ${sql.identifier([name])}`),
  sql.fragment`, `,
);
/**
 * A completion's row in the claim's result, from the `done` CTE's row `d` (a Completed): its id and
 * engine kind in their claimed columns, a NULL for each other one; its run_s and freed follow
 * (claimed rows and the status row put NULLs there; see ClaimRow in claim.ts).
 */
export const claimedCompletionColumns = (d: string) =>
  sql.join(
    CLAIMED.map(([, name]) => (name === "id" || name === "engine_kind" ? sql.identifier([d, name]) : sql.fragment`NULL`)),
    sql.fragment`, `,
  );
/** A row of NULLs in the claimed columns: the claim's status row has them (ClaimRow in claim.ts). */
export const claimedNulls = sql.join(
  CLAIMED.map(() => sql.fragment`NULL`),
  sql.fragment`, `,
);
/**
 * An insert's RETURNING list: the id, whether the row went in handed over, and the claimed columns
 * of those that did only (a bulk Enqueue would otherwise read back every payload it just sent).
 */
export const HANDED_COLUMNS = sql.join(
  [
    sql.fragment`w.id`,
    sql.fragment`w.status = 'dispatched' AS handed`,
    ...CLAIMED.slice(1).map(([expr, name]) => sql.fragment`CASE WHEN w.status = 'dispatched' THEN ${expr} END AS ${sql.identifier([name])}`),
  ],
  sql.fragment`, `,
);

/**
 * An item given back to the queue or finished by a sweep or a failure, with what its holder had:
 * its engine kind and how long it had been dispatched (for the metrics of what became of it).
 */
export interface Requeued {
  id: string;
  status: ItemStatus;
  agent: string | null;
  token: string | null;
  engine_kind: string;
  /** Seconds from its dispatch to now. */
  run_s: number | null;
  /** As Completed.freed, for a dispatch this ended. */
  freed: string | null;
}
export const requeuedRow = z.object({
  id: z.string(),
  status: z.enum(ITEM_STATUSES),
  agent: z.string().nullable(),
  token: z.string().nullable(),
  engine_kind: z.string(),
  run_s: z.number().nullable(),
  freed: z.string().nullable(),
});

/**
 * A fenced completion that matched: its engine kind and seconds from dispatch to completion, both
 * null when the item had already been completed under the same token (a report sent again, which
 * is answered ok but is not a second completion).
 */
export interface Completed {
  id: string;
  engine_kind: string | null;
  run_s: number | null;
  /** The item's tenant when it held a concurrency key's slot or reserved resources (FREED_TENANT): its end gives them back, which claims waiting on (tenant, engine kind) may now take. */
  freed: string | null;
}
/**
 * `freed` of an item `w` whose dispatch ends (Completed.freed, Requeued.freed): its tenant when it
 * held a concurrency key's slot or reserved resources, which its end gives back.
 */
export const FREED_TENANT = sql.fragment`CASE WHEN w.concurrency_key IS NOT NULL OR w.worker_params ? 'requirements' THEN w.tenant_key END`;

/** A stranded item made a dead letter. */
export const strandedRow = z.object({ id: z.string(), engine_kind: z.string() });
export const idRow = z.object({ id: z.string() });
