/**
 * The DAG engine's rows in their wire shapes (aiflow.dag.v1): a run with its nodes and attempts.
 * An attempt whose work item is still out shows the queue's view of it (queued or running, and
 * the agent holding it); one that ended shows its own row.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { AttemptStatus, NodeStatus, RunStatus, type AttemptSchema, type RunSchema } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import type { RunView } from "../engines/dag/engine.js";
import type { NodeStatus as StoredNode, RunStatus as StoredRun, TaskState } from "../engines/dag/model.js";
import type { TaskRow } from "../store/dag-runs.js";

const RUN: Record<StoredRun, RunStatus> = {
  running: RunStatus.RUNNING,
  completed: RunStatus.COMPLETED,
  failed: RunStatus.FAILED,
  cancelled: RunStatus.CANCELLED,
};
export const STATUS_FROM_WIRE: Partial<Record<RunStatus, StoredRun>> = Object.fromEntries(Object.entries(RUN).map(([k, v]) => [v, k]));

const NODE: Record<StoredNode, NodeStatus> = {
  pending: NodeStatus.PENDING,
  running: NodeStatus.RUNNING,
  waiting: NodeStatus.WAITING,
  completed: NodeStatus.COMPLETED,
  failed: NodeStatus.FAILED,
  skipped: NodeStatus.SKIPPED,
  cancelled: NodeStatus.CANCELLED,
};

const ATTEMPT: Record<TaskState, AttemptStatus> = {
  queued: AttemptStatus.QUEUED,
  running: AttemptStatus.RUNNING,
  waiting: AttemptStatus.WAITING,
  completed: AttemptStatus.COMPLETED,
  failed: AttemptStatus.FAILED,
  cancelled: AttemptStatus.CANCELLED,
};

export function runToWire(v: RunView, withNodes = true): MessageInitShape<typeof RunSchema> {
  const { run } = v;
  const byNode = new Map<string, TaskRow[]>();
  for (const t of v.tasks) {
    const list = byNode.get(t.meta.node) ?? [];
    list.push(t);
    byNode.set(t.meta.node, list);
  }
  return {
    id: run.id,
    // The same id under the name graph and machine runs use: every engine's run id reads alike.
    runId: run.id,
    tenantKey: run.meta.tenantKey,
    definitionId: run.definitionId,
    status: RUN[run.states.at(-1)!.state],
    contextJson: JSON.stringify(run.context),
    nodes: withNodes
      ? run.meta.plan.nodes.map((n) => {
          const rec = run.meta.nodes[n.name]!;
          return {
            name: n.name,
            status: NODE[rec.s],
            attempts: (byNode.get(n.name) ?? []).map((t) => attemptToWire(t, v)),
            iterations: rec.n ?? 0,
            iterationsDone: rec.d ?? 0,
            error: rec.err ?? "",
            dependsOn: n.deps,
          };
        })
      : [],
    startTime: run.startNs ?? undefined,
    endTime: run.endNs ?? undefined,
    duration: run.durationNs ?? undefined,
    createdBy: run.createdBy,
    createdOn: timestampFromMs(run.createdOn),
    reason: run.meta.reason ?? "",
  };
}

function attemptToWire(t: TaskRow, v: RunView): MessageInitShape<typeof AttemptSchema> {
  const last = t.states.at(-1)!;
  let status = ATTEMPT[last.state];
  let worker = t.worker ?? "";
  const item = t.meta.workItemId ? v.items.get(t.meta.workItemId) : undefined;
  if (last.state === "queued" && item?.status === "dispatched") {
    status = AttemptStatus.RUNNING;
    worker = item.agent_id ?? "";
  }
  return {
    taskId: t.id,
    name: t.name,
    status,
    workItemId: t.meta.workItemId ?? "",
    worker,
    startTime: t.startNs ?? undefined,
    endTime: t.endNs ?? undefined,
    error: last.error ?? "",
    iteration: t.meta.iteration,
    attempt: t.meta.attempt,
  };
}
