/** What handlers see and return. */
import type { Logger } from "pino";

/** A claimed work item, as a handler receives it. */
export interface WorkItem<Payload = unknown> {
  id: string;
  /** The tenant the item belongs to. */
  tenant: string;
  engineKind: string;
  /** The producer (orchestrator instance) that enqueued it. */
  engineId: string;
  runId: string | undefined;
  taskId: string | undefined;
  taskName: string | undefined;
  parentId: string | undefined;
  /** The payload, parsed from JSON; null when the producer sent none. Validate it: it is untrusted input. */
  payload: Payload;
  /** 1 on the first try, 2 on the first retry, and so on. */
  attempt: number;
  /** Retries allowed after the first attempt. */
  maxRetries: number;
  /**
   * Times the item came back after an agent running it lost its lease (died, hung, was cut off):
   * not its own failures, which `attempt` counts. Above 0, an earlier run may have done part of the work.
   */
  redeliveries: number;
  /** Lower runs first. */
  priority: number;
  /** The tag requirements the producer set. */
  selector: Readonly<Record<string, string>>;
  /** Items sharing this key all go to the agent the key is bound to (see the daemon's docs/queue.md, Affinity bindings). */
  affinityKey: string | undefined;
  /** Items of one tenant sharing this key run at most the key's limit at a time, across the fleet. */
  concurrencyKey: string | undefined;
  /** Items of one tenant sharing this key are dispatched at most at the key's rate limit, across the fleet. */
  rateLimitKey: string | undefined;
  /**
   * What the item needs of the agent (zero or undefined: no need). The daemon gave it to this agent
   * because the needs fit what the agent had free, and reserves them for it while it runs.
   */
  requirements: Readonly<Requirements>;
  /**
   * The GPUs the daemon placed the item on, by the agent's GPU indices (as nvidia-smi numbers them
   * and the agent registered them), reserved for it while it runs; empty when it needs none. Other
   * items may run on this agent's other GPUs at the same time: the item's GPU work belongs on these
   * alone (see `cudaVisibleDevices`).
   */
  gpuIndices: readonly number[];
  /**
   * `gpuIndices` joined by ",", "" when there are none: what to set `CUDA_VISIBLE_DEVICES` to in the
   * environment of the item's GPU work (a child process's `env`, not `process.env`, which items
   * running side by side share), with `CUDA_DEVICE_ORDER=PCI_BUS_ID` so that CUDA numbers the GPUs
   * as nvidia-smi does. "" hides every GPU, as befits an item that reserved none.
   */
  cudaVisibleDevices: string;
  idempotencyKey: string | undefined;
  /** When the producer enqueued it. */
  createdAt: Date | undefined;
}

/** An item's needs, as its producer stated them (WorkerParams.requirements). Memory and disk in MiB. */
export interface Requirements {
  /** GPUs, each with `gpuMemoryMb` free (0 with GPUs: each GPU whole). */
  gpus: number;
  gpuMemoryMb: number;
  /** A case-insensitive part of the GPU model name; undefined: any. */
  gpuModel: string | undefined;
  /** Thousandths of a core. */
  cpuMillis: number;
  memoryMb: number;
  diskMb: number;
  /** The mount `diskMb` is needed on; undefined: the agent's first disk (its work directory's). */
  diskMount: string | undefined;
}

export interface HandlerContext {
  /**
   * Aborts when the handler must stop: the lease was lost, the item was cancelled, or a drain
   * deadline passed. Its `reason` is a `WorkAbortedError` saying which. Pass it to fetch(), child
   * processes and timers; whatever the handler returns after it aborted is not reported.
   */
  signal: AbortSignal;
  /** The agent's logger with the item's id, tenant, engine kind, task and attempt bound. */
  log: Logger;
  /** The agent's name. */
  agent: string;
}

/**
 * Runs one item. The resolved value becomes the item's result (JSON-serialised; `undefined` means no
 * result). A thrown error fails the item: retryably, unless it is a `NonRetryableError`.
 */
export type Handler<Payload = unknown, Result = unknown> = (item: WorkItem<Payload>, ctx: HandlerContext) => Promise<Result> | Result;

/** Handlers of one engine kind by task name; `"*"` takes the tasks not named. */
export type TaskHandlers = { readonly [taskName: string]: AnyHandler };

/**
 * Handlers by engine kind: each kind maps to one handler for all its tasks, or to handlers by task
 * name. A top-level `"*"` takes the kinds (or tasks) nothing else matches. For an item of kind K and
 * task T the first that exists wins: `handlers[K]` (a function), `handlers[K][T]`, `handlers[K]["*"]`,
 * then the same lookups under `handlers["*"]`.
 *
 * ```ts
 * handlers: {
 *   dag: { resize: resizeImage, "*": runDagTask },
 *   test: async (item) => ({ echoed: item.payload }),
 * }
 * ```
 */
export type Handlers = { readonly [engineKind: string]: AnyHandler | TaskHandlers };

/**
 * A handler of any payload type. The payload is parsed JSON the SDK cannot check, so a handler
 * declares the shape it expects (`Handler<MyPayload>`) and validates it.
 */
// biome-ignore lint/suspicious/noExplicitAny: a handler of MyPayload must be assignable here, and only any is (unknown is not, parameters being contravariant)
export type AnyHandler = Handler<any, unknown>;

/** How an item ended, as the `itemFinished` event reports it. */
export type ItemOutcome =
  /** The daemon accepted the result. */
  | { kind: "completed" }
  /** The daemon accepted the failure; it retries the item when `retryable` and retries are left. */
  | { kind: "failed"; retryable: boolean; error: string }
  /** Given back to the queue without spending an attempt (a drain deadline, a drain beginning while it waited for a slot, or claimed while stopping). */
  | { kind: "released" }
  /** The lease was gone (renewal or report refused); nothing was reported. */
  | { kind: "lease-lost"; reason: string }
  /** A cancel directive stopped it; nothing was reported. */
  | { kind: "cancelled"; reason: string }
  /** The report could not be delivered (the daemon stayed unreachable, or the agent failed). */
  | { kind: "unreported"; reason: string };
