/**
 * What the graph and state-machine definitions share: names, the work an agent runs for a node or
 * an action (its engine kind, payload template and worker params, validated as the queue validates
 * an Enqueue, under the definition's own names), and conditions. Each refusal is INVALID_ARGUMENT
 * naming the part of the definition it is about.
 */
import { toJson, type JsonValue } from "@bufbuild/protobuf";
import { WorkerParamsSchema, type WorkerParams } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import type { Config } from "../config.js";
import { itemOf, templateText } from "./dag/plan.js";
import { checkTemplate, TemplateError } from "./dag/template.js";
import { AppError, invalidArgument, resourceExhausted } from "../domain/errors.js";
import { inRange } from "../domain/input.js";
import type { NewItem } from "../store/work-items.js";
import { ConditionError, parseCondition } from "./condition.js";

export const NAME = /^[A-Za-z0-9_-]{1,128}$/;
export const DEFINITION_ID_MAX = 256;

export type Limits = Pick<Config, "payloadMaxBytes" | "maxRedeliveries" | "dagMaxNodes" | "dagMaxDefinitionBytes">;

/** What runs on an agent for a graph node or a machine action: enough to make its work item. */
export interface WorkPlan {
  engineKind: string;
  /** The payload template (parsed JSON), or null for none. */
  payload: unknown;
  maxRetries: number;
  /** WorkerParams as protobuf JSON, or null. */
  params: JsonValue | null;
  priority: number;
}

/** Refuses a definition larger than the DAG engine's limits allow (the same caps serve all engines). */
export function checkSize(defJson: unknown, parts: number, what: string, limits: Limits): void {
  const bytes = Buffer.byteLength(JSON.stringify(defJson));
  if (bytes > limits.dagMaxDefinitionBytes) throw resourceExhausted(`the definition is ${bytes} bytes of JSON; the limit is ${limits.dagMaxDefinitionBytes}`);
  if (parts > limits.dagMaxNodes) throw resourceExhausted(`the definition has ${parts} ${what}; the limit is ${limits.dagMaxNodes}`);
}

export function checkName(name: string, where: string): void {
  if (!NAME.test(name)) throw invalidArgument(`${where}.name`, `'${name.slice(0, 40)}' must be 1-128 of letters, digits, '_' and '-'`);
}

/** The work of a node or an action, validated; `where` names it in refusals. */
export function workPlan(
  w: { engineKind: string; payloadJson: string; maxRetries: number; workerParams?: WorkerParams; priority: number },
  where: string,
  limits: Limits,
): WorkPlan {
  if (w.engineKind.trim() === "") throw invalidArgument(`${where}.engine_kind`, "is required: the agents that serve this engine kind run it");
  let payload: unknown = null;
  const text = templateText(w.payloadJson, `${where}.payload_json`, limits);
  if (text !== null) {
    payload = JSON.parse(text);
    let roots: Set<string>;
    try {
      roots = checkTemplate(payload);
    } catch (err) {
      if (err instanceof TemplateError) throw invalidArgument(`${where}.payload_json`, `bad template: ${err.message}`);
      throw err;
    }
    if (roots.has("item") || roots.has("index")) throw invalidArgument(`${where}.payload_json`, "uses item or index: its templates read context and run_id");
  }
  inRange(w.maxRetries, `${where}.max_retries`, 0, 1000);
  const params = w.workerParams ? toJson(WorkerParamsSchema, w.workerParams) : null;
  // Validation only: this item is never queued, so its due time does not matter.
  const item = itemOf({ engineKind: w.engineKind, params, priority: w.priority, maxRetries: w.maxRetries }, null, limits, where, 0);
  return { engineKind: item.engineKind, payload, maxRetries: item.maxRetries, params: item.workerParams ? params : null, priority: item.priority };
}

/** A work item for `work` with its payload rendered, due at `nowMs` (see itemOf), or the AppError saying why the queue would not take it. */
export function itemFor(work: WorkPlan, payloadJson: string | null, limits: Limits, where: string, nowMs: number): NewItem | AppError {
  try {
    return itemOf(work, payloadJson, limits, where, nowMs);
  } catch (err) {
    if (err instanceof AppError) return err;
    throw err;
  }
}

/** A condition's text, checked to parse over `roots`; "" stays "" (always). */
export function checkCondition(text: string, roots: readonly string[], where: string): string {
  const t = text.trim();
  if (t === "") return "";
  try {
    parseCondition(t, roots);
  } catch (err) {
    if (err instanceof ConditionError) throw invalidArgument(where, `bad condition '${t.length > 80 ? `${t.slice(0, 80)}…` : t}': ${err.message}`);
    throw err;
  }
  return t;
}

/** Names reachable from `from` over `next`. */
export function reachable(from: string, next: (name: string) => readonly string[]): Set<string> {
  const seen = new Set([from]);
  const todo = [from];
  while (todo.length > 0) for (const n of next(todo.pop()!)) if (!seen.has(n)) seen.add(n), todo.push(n);
  return seen;
}
