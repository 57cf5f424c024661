/** Work items between the store's rows and the wire. */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import { WorkItemStatus, type ItemOutcomeSchema, type WorkItemSchema } from "../gen/aiflow/cluster/v1/work_item_pb.js";
import type { ClaimedRow, ItemStatus, WorkItemRow } from "../store/work-items.js";

const STATUS: Record<ItemStatus, WorkItemStatus> = {
  pending: WorkItemStatus.PENDING,
  dispatched: WorkItemStatus.DISPATCHED,
  completed: WorkItemStatus.COMPLETED,
  failed: WorkItemStatus.FAILED,
  cancelled: WorkItemStatus.CANCELLED,
};

export const itemStatusToWire = (s: ItemStatus) => STATUS[s];

export function itemStatusFromWire(s: WorkItemStatus): ItemStatus | undefined {
  return (Object.keys(STATUS) as ItemStatus[]).find((k) => STATUS[k] === s);
}

export const TERMINAL: ReadonlySet<ItemStatus> = new Set(["completed", "failed", "cancelled"]);

type IdentityColumns = Pick<WorkItemRow, "id" | "tenant_key" | "engine_id" | "engine_kind" | "parent_work_item_id" | "run_id" | "task_id" | "task_name">;

/** What names an item and where it came from, the same in every row shape. */
const identity = (r: IdentityColumns) => ({
  id: r.id,
  tenantKey: r.tenant_key,
  engineId: r.engine_id,
  engineKind: r.engine_kind,
  parentWorkItemId: r.parent_work_item_id ?? "",
  runId: r.run_id ?? "",
  taskId: r.task_id ?? "",
  taskName: r.task_name ?? "",
});

export function workItemToWire(r: WorkItemRow): MessageInitShape<typeof WorkItemSchema> {
  const selector = (r.worker_params?.selector ?? {}) as Record<string, string>;
  return {
    ...identity(r),
    workerParams: { selector, affinityKey: r.affinity_key ?? "" },
    payloadJson: r.payload === null || r.payload === undefined ? "" : JSON.stringify(r.payload),
    status: STATUS[r.status],
    priority: r.priority ?? 0,
    agentId: r.agent_id ?? "",
    dispatchedAtNs: r.dispatched_at ?? 0n,
    completedAtNs: r.completed_at ?? 0n,
    leaseExpiresAtNs: r.lease_expires_at ?? 0n,
    leasedBy: r.leased_by ?? "",
    leaseToken: r.lease_token ?? "",
    nextAttemptAtNs: r.next_attempt_at ?? 0n,
    retryCount: r.retry_count ?? 0,
    maxRetries: r.max_retries ?? 0,
    error: r.error ?? "",
    resultJson: r.result === null || r.result === undefined ? "" : JSON.stringify(r.result),
    idempotencyKey: r.idempotency_key ?? "",
    createdOn: timestampFromMs(r.createdon),
    updatedOn: r.updatedon === null ? undefined : timestampFromMs(r.updatedon),
  };
}

/** What a claim set on every item it took, so the rows need not read it back. */
export interface Dispatch {
  agent: string;
  instance: string;
  leaseToken: string;
  dispatchedAtNs: bigint;
  leaseExpiresAtNs: bigint;
  nowMs: number;
}

/** A claimed item on the wire: its row's columns plus the dispatch the claim made. */
export function claimedItemToWire(r: ClaimedRow, d: Dispatch): MessageInitShape<typeof WorkItemSchema> {
  return {
    ...identity(r),
    workerParams: r.selector === null && r.affinity_key === null ? undefined : { selector: r.selector === null ? {} : (JSON.parse(r.selector) as Record<string, string>), affinityKey: r.affinity_key ?? "" },
    payloadJson: r.payload ?? "",
    status: WorkItemStatus.DISPATCHED,
    priority: r.priority ?? 0,
    agentId: d.agent,
    dispatchedAtNs: d.dispatchedAtNs,
    leaseExpiresAtNs: d.leaseExpiresAtNs,
    leasedBy: d.instance,
    leaseToken: d.leaseToken,
    nextAttemptAtNs: r.next_attempt_at ?? 0n,
    retryCount: r.retry_count ?? 0,
    maxRetries: r.max_retries ?? 0,
    error: r.error ?? "",
    idempotencyKey: r.idempotency_key ?? "",
    createdOn: timestampFromMs(r.createdon_ms),
    updatedOn: timestampFromMs(d.nowMs),
  };
}

type Outcome = MessageInitShape<typeof ItemOutcomeSchema>;

/** Per-item outcomes of a fenced batch: the ids that matched took effect, the rest lost their lease. */
export function fencedOutcomes(requested: readonly string[], matched: Iterable<string>): Outcome[] {
  const ok = new Set(matched);
  return requested.map((id) =>
    ok.has(id)
      ? { workItemId: id, ok: true }
      : { workItemId: id, ok: false, code: Code.FailedPrecondition, message: `lease lost: item '${id}' is not held under this token (expired, re-dispatched or cancelled)` },
  );
}
