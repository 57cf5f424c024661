/**
 * What the DAG engine keeps per run and per node attempt, as it is stored: aiflow_run.metadata
 * (RunMeta), aiflow_run.states and aiflow_task.states (histories whose last entry is the current
 * state), aiflow_task.metadata (TaskMeta). Times are epoch nanoseconds as decimal text (JSON
 * numbers would lose digits past 2^53).
 */
import type { Plan } from "./plan.js";
import type { Cause } from "../deps.js";

export type RunStatus = "running" | "completed" | "failed" | "cancelled";
export type NodeStatus = "pending" | "running" | "waiting" | "completed" | "failed" | "skipped" | "cancelled";
/** An attempt's states. Its current state is "queued" while its work item is pending or dispatched (the queue says which); "running" appears in the history, with the agent, once it ended. */
export type TaskState = "queued" | "running" | "waiting" | "completed" | "failed" | "cancelled";

export const NODE_DONE: ReadonlySet<NodeStatus> = new Set(["completed", "skipped"]);
export const TASK_ENDED: ReadonlySet<TaskState> = new Set(["completed", "failed", "cancelled"]);

/** One node's state in the run (the task list). */
export interface NodeRec {
  s: NodeStatus;
  /** Attempt number of the node's current attempt (0 before it first runs). */
  a: number;
  /** Fan-out: iterations in all, completed (ever, across attempts), failed and in flight in the current attempt. */
  n?: number;
  d?: number;
  f?: number;
  /** Attempts (iterations) of the node not ended yet. */
  fl?: number;
  /** The current attempt's task id (a node that does not fan out). */
  t?: string;
  err?: string;
}

export interface RunMeta {
  tenantKey: string;
  plan: Plan;
  nodes: Record<string, NodeRec>;
  /** run:<id> when the definition pins the run to one agent. */
  affinityKey: string | null;
  idempotencyKey?: string;
  /** Events signalled before their wait node was reached: event name → payload. */
  pendingEvents: Record<string, unknown>;
  /** Why the run failed or was cancelled. */
  reason?: string;
  /** The agent that ran each node's latest finished attempt (worker assignments). */
  workers: Record<string, string>;
  /** The trigger firing that started the run (its directory row's triggered_by and trigger_firing_id). */
  cause?: Cause;
}

export interface RunStateEntry {
  state: RunStatus;
  at: string;
  by: string;
  reason?: string;
}

export interface TaskMeta {
  node: string;
  /** -1 when the node does not fan out. */
  iteration: number;
  attempt: number;
  kind: "task" | "wait";
  workItemId?: string;
}

export interface TaskStateEntry {
  state: TaskState;
  at: string;
  agent?: string;
  error?: string;
}

/** The name of a node attempt's row: the node, or <node>[<index>] for an iteration. */
export const taskName = (node: string, iteration: number) => (iteration < 0 ? node : `${node}[${iteration}]`);

/** Iteration indices as ranges ("0-41,43,45-99"): aiflow_checkpoint.cursor. */
export function rangesOf(indices: Iterable<number>): string {
  const sorted = [...new Set(indices)].sort((a, b) => a - b);
  const out: string[] = [];
  for (let i = 0; i < sorted.length; ) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j]! + 1) j++;
    out.push(i === j ? `${sorted[i]}` : `${sorted[i]}-${sorted[j]}`);
    i = j + 1;
  }
  return out.join(",");
}

export function indicesOf(ranges: string | null): Set<number> {
  const out = new Set<number>();
  if (!ranges) return out;
  for (const part of ranges.split(",")) {
    const [a, b] = part.split("-").map(Number);
    for (let i = a!; i <= (b ?? a!); i++) out.add(i);
  }
  return out;
}
