/**
 * A DAG definition, validated into the plan a run executes. The plan is what a run stores (in
 * aiflow_run.metadata) and follows to the end: a stored definition changed later does not change
 * a run already started.
 *
 * Validation refuses, naming the node: a duplicate or bad name, a dependency on an unknown node or
 * on itself, a cycle, a bad template or fan-out path, a wait node without an event or a task
 * without an engine kind, and worker params the queue would refuse. Over the caps (nodes, bytes) is
 * RESOURCE_EXHAUSTED.
 */
import { create, fromJson, toJson, type JsonValue } from "@bufbuild/protobuf";
import { durationMs } from "@bufbuild/protobuf/wkt";
import { EnqueueItemSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { WorkerParamsSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { Affinity, DefinitionSchema, NodeKind, OnFailure, type Definition } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import type { Config } from "../../config.js";
import { invalidArgument, resourceExhausted } from "../../domain/errors.js";
import { inRange, jsonOrNull, optionalText } from "../../domain/input.js";
import { newItem } from "../../queue/new-item.js";
import type { NewItem } from "../../store/work-items.js";
import { checkTemplate, parsePath, TemplateError, type Path } from "./template.js";

export interface PlanNode {
  name: string;
  kind: "task" | "wait";
  engineKind: string;
  /** The payload template, parsed; null: no payload. */
  payload: unknown;
  deps: string[];
  maxRetries: number;
  /** The node's WorkerParams as protobuf JSON (made into a NewItem again when it is queued). */
  params: JsonValue | null;
  timeoutMs: number | null;
  /** The fan-out path's text (it starts at `context`), or null. */
  fanOut: string | null;
  onFailure: "fail" | "skip";
  priority: number;
  event: string | null;
}

export interface Plan {
  definitionId: string;
  affinity: "none" | "run";
  nodes: PlanNode[];
}

export type PlanLimits = Pick<Config, "dagMaxNodes" | "dagMaxDefinitionBytes" | "payloadMaxBytes" | "maxRedeliveries">;

const NODE_NAME = /^[A-Za-z0-9_-]{1,128}$/;
const NAME_MAX = 256;

/** The plan of a definition, or the refusal (AppError) that names what is wrong. */
export function planOf(def: Definition, limits: PlanLimits, inline: boolean): Plan {
  const bytes = Buffer.byteLength(JSON.stringify(toJson(DefinitionSchema, def)));
  if (bytes > limits.dagMaxDefinitionBytes) throw resourceExhausted(`the definition is ${bytes} bytes of JSON; the limit is ${limits.dagMaxDefinitionBytes}`);
  if (def.nodes.length > limits.dagMaxNodes) throw resourceExhausted(`the definition has ${def.nodes.length} nodes; the limit is ${limits.dagMaxNodes}`);
  if (def.nodes.length === 0) throw invalidArgument("definition.nodes", "needs at least one node");
  const definitionId = optionalText(def.id, "definition.id", NAME_MAX) ?? (inline ? "inline" : null);
  if (definitionId === null) throw invalidArgument("definition.id", "is required");
  if (def.affinity !== Affinity.UNSPECIFIED && def.affinity !== Affinity.RUN) throw invalidArgument("definition.affinity", `unknown value ${def.affinity}`);
  const affinity = def.affinity === Affinity.RUN ? "run" : "none";
  const names = new Set<string>();
  const nodes = def.nodes.map((n, i) => {
    const where = NODE_NAME.test(n.name) ? `node '${n.name}'` : `nodes[${i}]`;
    if (!NODE_NAME.test(n.name)) throw invalidArgument(`${where}.name`, `'${n.name.slice(0, 40)}' must be 1-128 of letters, digits, '_' and '-'`);
    if (names.has(n.name)) throw invalidArgument(where, "is a duplicate name: node names are unique in a definition");
    names.add(n.name);
    return planNode(n, where, affinity, limits);
  });
  for (const n of nodes)
    for (const d of n.deps) {
      if (d === n.name) throw invalidArgument(`node '${n.name}'.depends_on`, "names the node itself");
      if (!names.has(d)) throw invalidArgument(`node '${n.name}'.depends_on`, `names '${d}', which is not a node of the definition`);
    }
  const cycle = findCycle(nodes);
  if (cycle) throw invalidArgument(`node '${cycle[0]}'`, `is on a cycle: ${cycleText(cycle)}`);
  return { definitionId, affinity, nodes };
}

function planNode(n: Definition["nodes"][number], where: string, affinity: "none" | "run", limits: PlanLimits): PlanNode {
  if (![NodeKind.UNSPECIFIED, NodeKind.TASK, NodeKind.WAIT].includes(n.kind)) throw invalidArgument(`${where}.kind`, `unknown value ${n.kind}`);
  if (![OnFailure.UNSPECIFIED, OnFailure.FAIL_RUN, OnFailure.SKIP].includes(n.onFailure))
    throw invalidArgument(`${where}.on_failure`, `unknown value ${n.onFailure}`);
  const kind = n.kind === NodeKind.WAIT ? "wait" : "task";
  let payload: unknown = null;
  let roots = new Set<string>();
  const text = templateText(n.payloadJson, `${where}.payload_json`, limits);
  if (text !== null) {
    payload = JSON.parse(text);
    try {
      roots = checkTemplate(payload);
    } catch (err) {
      if (err instanceof TemplateError) throw invalidArgument(`${where}.payload_json`, `bad template: ${err.message}`);
      throw err;
    }
  }
  let fanOut: string | null = null;
  if (n.fanOut.trim() !== "") {
    let path: Path;
    try {
      path = parsePath(n.fanOut);
    } catch (err) {
      throw invalidArgument(`${where}.fan_out`, (err as Error).message);
    }
    if (path.root !== "context") throw invalidArgument(`${where}.fan_out`, `'${n.fanOut.trim()}' must be a path into the run context (context.…)`);
    fanOut = n.fanOut.trim();
  }
  if (!fanOut && (roots.has("item") || roots.has("index"))) throw invalidArgument(`${where}.payload_json`, "uses item or index, which only a fan-out node has");
  const deps = [...new Set(n.dependsOn.map((d) => d.trim()))];
  const timeoutMs = n.timeout ? durationMs(n.timeout) : null;
  if (timeoutMs !== null && (timeoutMs <= 0 || timeoutMs > 366 * 86_400_000))
    throw invalidArgument(`${where}.timeout`, `${timeoutMs} ms is outside 1 ms..366 days`);
  const common = { name: n.name, deps, timeoutMs, onFailure: n.onFailure === OnFailure.SKIP ? ("skip" as const) : ("fail" as const) };
  if (kind === "wait") {
    const event = optionalText(n.event, `${where}.event`, NAME_MAX);
    if (event === null) throw invalidArgument(`${where}.event`, "is required for a wait node");
    if (fanOut) throw invalidArgument(`${where}.fan_out`, "a wait node does not fan out");
    return { ...common, kind, engineKind: "", payload: null, maxRetries: 0, params: null, fanOut: null, priority: 0, event };
  }
  if (n.event.trim() !== "") throw invalidArgument(`${where}.event`, "only a wait node has an event");
  if (n.workerParams?.affinityKey && affinity === "run")
    throw invalidArgument(`${where}.worker_params.affinity_key`, "is set, but the definition pins the run to one agent (affinity: run)");
  // The queue's own validation of what becomes the node's work item, under the node's name.
  inRange(n.maxRetries, `${where}.max_retries`, 0, 1000);
  const params = n.workerParams ? toJson(WorkerParamsSchema, n.workerParams) : null;
  // Validation only: this item is never queued, so its due time does not matter.
  const item = itemOf({ engineKind: n.engineKind, params, priority: n.priority, maxRetries: n.maxRetries }, null, limits, where, 0);
  return {
    ...common,
    kind,
    engineKind: item.engineKind,
    payload,
    maxRetries: item.maxRetries,
    params: item.workerParams ? params : null,
    fanOut,
    priority: item.priority,
    event: null,
  };
}

/**
 * A node's work item (its payload rendered), validated as QueueService.Enqueue validates one; errors
 * name the node. It is due at `nowMs`, the engine's clock when it queues the item: next_attempt_at is
 * the time the queue's readers (the age gauge, QueueStats' dispatch wait, the dead-letter grace)
 * count an item's wait from, so an engine's item must carry the time it was queued, never 0 (which
 * read as a wait since 1970).
 */
export function itemOf(
  n: Pick<PlanNode, "engineKind" | "params" | "priority" | "maxRetries">,
  payloadJson: string | null,
  limits: Pick<Config, "payloadMaxBytes" | "maxRedeliveries">,
  where: string,
  nowMs: number,
): NewItem {
  const it = create(EnqueueItemSchema, { engineKind: n.engineKind, payloadJson: payloadJson ?? "", priority: n.priority, maxRetries: n.maxRetries });
  // The params were made by toJson of a valid message, so fromJson restores them exactly.
  if (n.params !== null) it.workerParams = fromJson(WorkerParamsSchema, n.params);
  try {
    return newItem(it, 0, nowMs, limits);
  } catch (err) {
    if (err instanceof Error) err.message = err.message.replace(/^items\[0\]\./, `${where}.`);
    throw err;
  }
}

/** A cycle's names as a refusal shows them: a long one by its ends and its length, so the message stays readable (and fits a gRPC trailer). */
function cycleText(cycle: readonly string[]): string {
  if (cycle.length <= 12) return cycle.join(" -> ");
  return `${cycle.slice(0, 6).join(" -> ")} -> … (${cycle.length - 11} more) … -> ${cycle.slice(-5).join(" -> ")}`;
}

/**
 * A payload template's JSON text, checked as a payload is (json-text.ts: nesting, NUL, lone
 * surrogates, duplicate keys, numbers jsonb holds) within the definition's own byte cap; null when
 * empty. The plan keeps the template in jsonb and walks it, so what the queue would refuse in a
 * payload is refused here, naming the field.
 */
export function templateText(raw: string, field: string, limits: Pick<PlanLimits, "dagMaxDefinitionBytes">): string | null {
  return jsonOrNull(raw, field, limits.dagMaxDefinitionBytes);
}

/**
 * A cycle among the nodes as the names along it (first = last), or null. A depth-first search with
 * a stack of its own: a chain as long as --dag-max-nodes allows must not cost the call stack a frame
 * per node (a recursive walk overflowed at some thousands, and the refusal became INTERNAL).
 */
function findCycle(nodes: readonly PlanNode[]): string[] | null {
  const deps = new Map(nodes.map((n) => [n.name, n.deps]));
  // 1: on the current path; 2: finished (no cycle through it).
  const state = new Map<string, 1 | 2>();
  for (const n of nodes) {
    if (state.has(n.name)) continue;
    // The current path, each entry with the index of the next dependency to look at.
    const path: { name: string; next: number }[] = [{ name: n.name, next: 0 }];
    state.set(n.name, 1);
    while (path.length > 0) {
      const top = path.at(-1)!;
      const ds = deps.get(top.name) ?? [];
      if (top.next >= ds.length) {
        path.pop();
        state.set(top.name, 2);
        continue;
      }
      const d = ds[top.next++]!;
      if (state.get(d) === 1) return [...path.slice(path.findIndex((p) => p.name === d)).map((p) => p.name), d];
      if (!state.has(d)) {
        state.set(d, 1);
        path.push({ name: d, next: 0 });
      }
    }
  }
  return null;
}
