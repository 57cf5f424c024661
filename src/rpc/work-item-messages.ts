/** Work items between the store's rows and the wire. */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import {
  WorkItemStatus,
  type ItemOutcomeSchema,
  type RequirementsSchema,
  type WorkerParamsSchema,
  type WorkItemSchema,
} from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import type { Requirements } from "../domain/resources.js";
import { unplaceableReasons } from "../fleet/unplaceable-work-sweep.js";
import type { AgentStore } from "../store/agents.js";
import type { ClaimedRow, ItemStatus, WorkItemRow } from "../store/work-items.js";
import { timestampInit, type Dispatch } from "../queue/dispatch.js";

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

export function workItemToWire(r: WorkItemRow, unplaceable = ""): MessageInitShape<typeof WorkItemSchema> {
  const selector = (r.worker_params?.selector ?? {}) as Record<string, string>;
  // Written out, not spread from a shared helper: see claimedItemToWire.
  return {
    id: r.id,
    tenantKey: r.tenant_key,
    engineId: r.engine_id,
    engineKind: r.engine_kind,
    parentWorkItemId: r.parent_work_item_id ?? "",
    runId: r.run_id ?? "",
    taskId: r.task_id ?? "",
    taskName: r.task_name ?? "",
    workerParams: workerParamsToWire(selector, r.affinity_key, r.worker_params),
    payloadJson: r.payload ?? "",
    status: STATUS[r.status],
    priority: r.priority ?? 0,
    agentId: r.agent_id ?? "",
    dispatchedAtNs: r.dispatched_at ?? 0n,
    completedAtNs: r.completed_at ?? 0n,
    leaseExpiresAtNs: r.lease_expires_at ?? 0n,
    leasedBy: r.leased_by ?? "",
    // A lease token is the capability to complete, fail or release the item: only the Claim reply
    // gives it, to the holder (claimedItemToWire). Every other read leaves it empty.
    leaseToken: "",
    nextAttemptAtNs: r.next_attempt_at ?? 0n,
    retryCount: r.retry_count ?? 0,
    maxRetries: r.max_retries ?? 0,
    redeliveryCount: r.redelivery_count,
    maxRedeliveries: r.max_redeliveries,
    error: r.error ?? "",
    resultJson: r.result ?? "",
    idempotencyKey: r.idempotency_key ?? "",
    traceContext: r.trace_context ?? "",
    gpuIndices: r.gpu_indices ?? [],
    unplaceable,
    createdOn: timestampInit(r.createdon),
    updatedOn: r.updatedon === null ? undefined : timestampInit(r.updatedon),
  };
}

/**
 * Items on the wire, each pending one whose requirements no registered agent could ever meet
 * carrying why (../fleet/unplaceable-work-sweep.ts); the fleet is read only when a row states requirements.
 */
export async function itemsToWire(agents: AgentStore, rows: readonly WorkItemRow[]): Promise<MessageInitShape<typeof WorkItemSchema>[]> {
  const reasons = await unplaceableReasons(agents, rows);
  return rows.map((r, i) => workItemToWire(r, reasons[i] ?? ""));
}

/**
 * A claimed item on the wire: its row's columns plus the dispatch the claim made. One object
 * literal, on purpose: built as a spread of identity() plus the rest, the object passed
 * V8's limit of properties added after creation and fell back to dictionary mode, which made this
 * function the largest single cost of a claim in the daemon's profile and slowed every read of it
 * downstream. Keep it a literal.
 */
export function claimedItemToWire(r: ClaimedRow, d: Dispatch): MessageInitShape<typeof WorkItemSchema> {
  return {
    id: r.id,
    tenantKey: r.tenant_key,
    engineId: r.engine_id,
    engineKind: r.engine_kind,
    parentWorkItemId: r.parent_work_item_id ?? "",
    runId: r.run_id ?? "",
    taskId: r.task_id ?? "",
    taskName: r.task_name ?? "",
    workerParams:
      r.selector === null && r.affinity_key === null && r.params === null
        ? undefined
        : workerParamsToWire(
            r.selector === null ? {} : (JSON.parse(r.selector) as Record<string, string>),
            r.affinity_key,
            r.params === null ? null : (JSON.parse(r.params) as Record<string, unknown>),
          ),
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
    redeliveryCount: r.redelivery_count,
    maxRedeliveries: r.max_redeliveries,
    error: r.error ?? "",
    idempotencyKey: r.idempotency_key ?? "",
    traceContext: r.trace_context ?? "",
    gpuIndices: r.gpu_indices ?? [],
    createdOn: timestampInit(r.createdon_ms),
    updatedOn: d.updatedOn,
  };
}

/** worker_params as stored (selector, affinityKey, requirements, concurrencyKey, maxInFlight, rateLimitKey) on the wire. */
function workerParamsToWire(
  selector: Record<string, string>,
  affinityKey: string | null,
  stored: Record<string, unknown> | null,
): MessageInitShape<typeof WorkerParamsSchema> {
  const requirements = stored?.requirements as Requirements | undefined;
  return {
    selector,
    affinityKey: affinityKey ?? "",
    requirements: requirements && requirementsToWire(requirements),
    concurrencyKey: (stored?.concurrencyKey as string | undefined) ?? "",
    maxInFlight: (stored?.maxInFlight as number | undefined) ?? 0,
    rateLimitKey: (stored?.rateLimitKey as string | undefined) ?? "",
  };
}

export function requirementsToWire(r: Requirements): MessageInitShape<typeof RequirementsSchema> {
  return {
    gpus: r.gpus ?? 0,
    gpuMemoryMb: BigInt(r.gpuMemoryMb ?? 0),
    gpuModel: r.gpuModel ?? "",
    cpuMillis: BigInt(r.cpuMillis ?? 0),
    memoryMb: BigInt(r.memoryMb ?? 0),
    diskMb: BigInt(r.diskMb ?? 0),
    diskMount: r.diskMount ?? "",
  };
}

type Outcome = MessageInitShape<typeof ItemOutcomeSchema>;

/** Per-item outcomes of a fenced batch: the ids that matched took effect, the rest lost their lease. */
export function fencedOutcomes(requested: readonly string[], matched: Iterable<string>): Outcome[] {
  const ok = new Set(matched);
  return requested.map((id) =>
    ok.has(id)
      ? { workItemId: id, ok: true }
      : {
          workItemId: id,
          ok: false,
          code: Code.FailedPrecondition,
          message: `lease lost: item '${id}' is not held under this token (expired, re-dispatched or cancelled)`,
        },
  );
}
