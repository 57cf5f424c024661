/** Between the generated wire types and what the SDK hands out. */
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { WorkItem as WireItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import type { WorkItem } from "./types.js";

export type DaemonStatus = "active" | "draining" | "inactive" | "unknown";

export function statusFromWire(s: AgentStatus): DaemonStatus {
  switch (s) {
    case AgentStatus.ACTIVE:
      return "active";
    case AgentStatus.DRAINING:
      return "draining";
    case AgentStatus.INACTIVE:
      return "inactive";
    default:
      return "unknown";
  }
}

const opt = (s: string) => (s === "" ? undefined : s);

/** The handler's view of a claimed item. Throws when the payload is not JSON (the daemon checks it, so it never is). */
export function itemFromWire(w: WireItem): WorkItem {
  return {
    id: w.id,
    tenant: w.tenantKey,
    engineKind: w.engineKind,
    engineId: w.engineId,
    runId: opt(w.runId),
    taskId: opt(w.taskId),
    taskName: opt(w.taskName),
    parentId: opt(w.parentWorkItemId),
    payload: w.payloadJson === "" ? null : (JSON.parse(w.payloadJson) as unknown),
    attempt: w.retryCount + 1,
    redeliveries: w.redeliveryCount,
    maxRetries: w.maxRetries,
    priority: w.priority,
    selector: { ...(w.workerParams?.selector ?? {}) },
    affinityKey: opt(w.workerParams?.affinityKey ?? ""),
    idempotencyKey: opt(w.idempotencyKey),
    createdAt: w.createdOn ? timestampDate(w.createdOn) : undefined,
  };
}
