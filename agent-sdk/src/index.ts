/**
 * @aiflow/agent-sdk: embed in a worker binary to run aiflowd work items.
 *
 * ```ts
 * const agent = createAgent({
 *   address: "127.0.0.1:7400",
 *   token: process.env.AIFLOW_AGENT_TOKEN,
 *   name: "gpu-worker-1",
 *   tenants: ["acme"],
 *   handlers: { dag: async (item, ctx) => ({ ok: true }) },
 *   handleSignals: true,
 * });
 * await agent.run();
 * ```
 */
import { Agent } from "./agent.js";
import type { AgentOptions } from "./options.js";

export function createAgent(options: AgentOptions): Agent {
  return new Agent(options);
}

export { Agent, type AgentEvents, type DrainOptions, type Registration } from "./agent.js";
export type { BackoffOptions } from "./backoff.js";
export { AgentFailedError, NonRetryableError, RetryableError, WorkAbortedError, type AbortKind } from "./errors.js";
export type { AgentState } from "./lifecycle.js";
export type { Capacity, DiskCapacity, GpuCapacity } from "./liveness/capacity.js";
export type { AgentOptions } from "./options.js";
export type { HeartbeatMetrics } from "./resource-options.js";
export type { AnyHandler, Handler, HandlerContext, Handlers, ItemOutcome, Requirements, TaskHandlers, WorkItem } from "./types.js";
export type { DaemonStatus } from "./wire.js";
