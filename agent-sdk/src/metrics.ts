/**
 * The agent's own Prometheus metrics (opt-in: `metricsPort`), on a registry of its own
 * (metrics-endpoint.ts serves it). Their names are fixed: dashboards and alerts are written against
 * them.
 *
 * - `aiflow_sdk_items_handled_total{engine_kind,outcome}`: items finished on this agent, by how:
 *   completed, failed (a dead letter: not retryable, or no retries left), retried (a retryable
 *   failure with retries left: the daemon's rule, `retry_count < max_retries`, read from the item),
 *   released (given back without spending an attempt), cancelled, lease_lost, unreported.
 * - `aiflow_sdk_handler_seconds{engine_kind}`: how long handlers ran, until they settled.
 * - `aiflow_sdk_in_flight_items`, `aiflow_sdk_slots`: handlers running now, and the slots.
 * - `aiflow_sdk_claims_total{result}`: claims answered with items, answered empty, or failed (a
 *   claim the agent itself cancelled, at stop, is none of these); on the agent stream, each push
 *   is a claim answered with items.
 * - `aiflow_sdk_rpc_errors_total{method,code}`: calls of the main connection that failed, by
 *   method and gRPC code (`Unavailable`, `DeadlineExceeded`, …), streams included; calls the agent
 *   cancelled itself are not errors. The heartbeat thread's own connection is not counted here.
 * - `aiflow_sdk_reconnects_total`: times the agent lost its daemon (or its registration) and began
 *   registering again.
 *
 * This module loads prom-client; startup.ts imports it only when metrics are asked for.
 */
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import { MetricsEndpoint } from "./metrics-endpoint.js";
import type { ItemOutcome, WorkItem } from "./types.js";

/** Handler seconds: from a no-op to an hour-long job (GPU work runs minutes). */
const HANDLER_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600];

export type ClaimResult = "items" | "empty" | "error";

export class AgentMetrics {
  readonly registry = new Registry();
  readonly endpoint = new MetricsEndpoint(this.registry);
  readonly #items: Counter<"engine_kind" | "outcome">;
  readonly #handler: Histogram<"engine_kind">;
  readonly #claims: Counter<"result">;
  readonly #rpcErrors: Counter<"method" | "code">;
  readonly #reconnects: Counter;

  constructor(state: { slots: number; inFlight: () => number }) {
    const registers = [this.registry];
    this.#items = new Counter({
      name: "aiflow_sdk_items_handled_total",
      help: "Items finished on this agent, by engine kind and outcome.",
      labelNames: ["engine_kind", "outcome"],
      registers,
    });
    this.#handler = new Histogram({
      name: "aiflow_sdk_handler_seconds",
      help: "How long handlers ran, until they settled.",
      labelNames: ["engine_kind"],
      buckets: HANDLER_BUCKETS,
      registers,
    });
    new Gauge({
      name: "aiflow_sdk_in_flight_items",
      help: "Handlers running now.",
      registers,
      collect() {
        this.set(state.inFlight());
      },
    });
    new Gauge({ name: "aiflow_sdk_slots", help: "Items this agent runs at once.", registers }).set(state.slots);
    this.#claims = new Counter({ name: "aiflow_sdk_claims_total", help: "Claims, by result: items, empty, error.", labelNames: ["result"], registers });
    this.#rpcErrors = new Counter({
      name: "aiflow_sdk_rpc_errors_total",
      help: "Failed calls of the main connection, by method and gRPC code.",
      labelNames: ["method", "code"],
      registers,
    });
    this.#reconnects = new Counter({
      name: "aiflow_sdk_reconnects_total",
      help: "Times the agent lost its daemon or registration and began registering again.",
      registers,
    });
  }

  itemFinished(item: WorkItem, outcome: ItemOutcome): void {
    this.#items.inc({ engine_kind: item.engineKind, outcome: outcomeLabel(item, outcome) });
  }

  handlerSettled(item: WorkItem, ms: number): void {
    this.#handler.observe({ engine_kind: item.engineKind }, ms / 1000);
  }

  claimed(result: ClaimResult): void {
    this.#claims.inc({ result });
  }

  reconnecting(): void {
    this.#reconnects.inc();
  }

  /** Counts failed calls; outermost in the chain, so it sees what the agent's code sees. */
  readonly interceptor: Interceptor = (next) => async (req) => {
    const failed = (err: unknown) => {
      if (!req.signal.aborted) this.#rpcErrors.inc({ method: req.method.name, code: Code[ConnectError.from(err).code] ?? "Unknown" });
    };
    let res;
    try {
      res = await next(req);
    } catch (err) {
      failed(err);
      throw err;
    }
    if (!res.stream) return res;
    const messages = res.message;
    return {
      ...res,
      message: (async function* () {
        try {
          yield* messages;
        } catch (err) {
          failed(err);
          throw err;
        }
      })(),
    };
  };
}

function outcomeLabel(item: WorkItem, o: ItemOutcome): string {
  switch (o.kind) {
    case "failed":
      return o.retryable && item.attempt <= item.maxRetries ? "retried" : "failed";
    case "lease-lost":
      return "lease_lost";
    default:
      return o.kind;
  }
}
