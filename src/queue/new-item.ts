/**
 * An item to enqueue, from its wire form: checked field by field, a bad one INVALID_ARGUMENT naming it.
 * QueueService.Enqueue takes its items through here, and so does the DAG engine for its nodes.
 */
import type { EnqueueItem } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import type { Config } from "../config.js";
import { MAX_IN_FLIGHT } from "../domain/concurrency.js";
import { invalidArgument } from "../domain/errors.js";
import { identifier, inRange, jsonOrNull, optionalText, storableTimestamp, tagMap } from "../domain/input.js";
import { MAX_KEY_CHARS } from "../domain/names.js";
import { requirementsOf } from "../domain/resource-input.js";
import type { NewItem } from "../store/work-items.js";

/** A validated item from its wire form; a bad field is INVALID_ARGUMENT naming it (QueueService.Enqueue, and the DAG engine for its nodes). */
export function newItem(it: EnqueueItem, i: number, nowMs: number, config: Pick<Config, "payloadMaxBytes" | "maxRedeliveries">): NewItem {
  const f = (name: string) => `items[${i}].${name}`;
  const payloadJson = jsonOrNull(it.payloadJson, f("payload_json"), config.payloadMaxBytes);
  const selector = tagMap(it.workerParams?.selector ?? {}, f("worker_params.selector"));
  const notBeforeMs = it.notBefore ? storableTimestamp(it.notBefore, f("not_before")) : nowMs;
  const affinityKey = optionalText(it.workerParams?.affinityKey ?? "", f("worker_params.affinity_key"), MAX_KEY_CHARS);
  const requirements = requirementsOf(it.workerParams?.requirements, f("worker_params.requirements"));
  const { concurrencyKey, maxInFlight } = concurrencyOf(it.workerParams, f);
  const rateLimitKey = optionalText(it.workerParams?.rateLimitKey ?? "", f("worker_params.rate_limit_key"), MAX_KEY_CHARS);
  const params = {
    ...(Object.keys(selector).length > 0 ? { selector } : {}),
    ...(affinityKey ? { affinityKey } : {}),
    ...(requirements ? { requirements } : {}),
    ...(concurrencyKey ? { concurrencyKey, maxInFlight } : {}),
    ...(rateLimitKey ? { rateLimitKey } : {}),
  };
  return {
    engineKind: identifier(it.engineKind, f("engine_kind")),
    runId: it.runId ? identifier(it.runId, f("run_id")) : null,
    taskId: optionalText(it.taskId, f("task_id"), 256),
    taskName: optionalText(it.taskName, f("task_name"), 256),
    workerParams: Object.keys(params).length > 0 ? params : null,
    payloadJson,
    priority: inRange(it.priority, f("priority"), 0, 1_000_000),
    maxRetries: inRange(it.maxRetries, f("max_retries"), 0, 1000),
    maxRedeliveries: it.maxRedeliveries === undefined ? config.maxRedeliveries : inRange(it.maxRedeliveries, f("max_redeliveries"), 0, 1000),
    notBeforeNs: BigInt(Math.max(notBeforeMs, 0)) * 1_000_000n,
    parentId: it.parentWorkItemId ? identifier(it.parentWorkItemId, f("parent_work_item_id")) : null,
    idempotencyKey: optionalText(it.idempotencyKey, f("idempotency_key"), 256),
    affinityKey,
    concurrencyKey,
    rateLimitKey,
  };
}

/** The item's concurrency key and the limit it states (1 when it states none); max_in_flight without a key is refused. */
function concurrencyOf(p: EnqueueItem["workerParams"], f: (name: string) => string): { concurrencyKey: string | null; maxInFlight: number } {
  const concurrencyKey = optionalText(p?.concurrencyKey ?? "", f("worker_params.concurrency_key"), MAX_KEY_CHARS);
  const stated = p?.maxInFlight ?? 0;
  if (!concurrencyKey && stated !== 0) throw invalidArgument(f("worker_params.max_in_flight"), "is set without a concurrency_key");
  return { concurrencyKey, maxInFlight: stated === 0 ? 1 : inRange(stated, f("worker_params.max_in_flight"), 1, MAX_IN_FLIGHT) };
}
