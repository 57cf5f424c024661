/** Between the generated wire types and what the SDK hands out. */
import { timestampDate } from "@bufbuild/protobuf/wkt";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { Requirements as WireRequirements, WorkItem as WireItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import type { Requirements, WorkItem } from "./types.js";

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

/** Shared by the items that need nothing (most): no object per item. */
const NO_NEEDS: Readonly<Requirements> = Object.freeze({
  gpus: 0,
  gpuMemoryMb: 0,
  gpuModel: undefined,
  cpuMillis: 0,
  memoryMb: 0,
  diskMb: 0,
  diskMount: undefined,
});
const NO_GPUS: readonly number[] = Object.freeze([]);

function requirementsFromWire(r: WireRequirements | undefined): Readonly<Requirements> {
  if (r === undefined) return NO_NEEDS;
  return {
    gpus: r.gpus,
    gpuMemoryMb: Number(r.gpuMemoryMb),
    gpuModel: opt(r.gpuModel),
    cpuMillis: Number(r.cpuMillis),
    memoryMb: Number(r.memoryMb),
    diskMb: Number(r.diskMb),
    diskMount: opt(r.diskMount),
  };
}

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
    concurrencyKey: opt(w.workerParams?.concurrencyKey ?? ""),
    rateLimitKey: opt(w.workerParams?.rateLimitKey ?? ""),
    requirements: requirementsFromWire(w.workerParams?.requirements),
    gpuIndices: w.gpuIndices.length === 0 ? NO_GPUS : [...w.gpuIndices],
    cudaVisibleDevices: w.gpuIndices.join(","),
    idempotencyKey: opt(w.idempotencyKey),
    createdAt: w.createdOn ? timestampDate(w.createdOn) : undefined,
  };
}
