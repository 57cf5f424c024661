/**
 * What start() prepares before the first registration: the metrics endpoint, when `metricsPort`
 * asks for one (prom-client is loaded only then), and the capacity every registration sends.
 */
import type { Logger } from "pino";
import { AgentFailedError } from "./errors.js";
import { detectCapacity, type Capacity } from "./liveness/capacity.js";
import { errorText } from "./link.js";
import type { AgentMetrics } from "./metrics.js";
import type { ResolvedOptions } from "./options.js";

/**
 * Opens the metrics endpoint when `metricsPort` asks for one. `made` gets the metrics before they
 * listen, so that a failure closes them with the rest. Rejects with an AgentFailedError that says in
 * words why it cannot listen.
 */
export async function serveMetrics(o: ResolvedOptions, log: Logger, inFlight: () => number, made: (metrics: AgentMetrics) => void): Promise<void> {
  const at = o.metrics;
  if (!at) return;
  try {
    const { AgentMetrics } = await import("./metrics.js");
    const metrics = new AgentMetrics({ slots: o.slots, inFlight });
    made(metrics);
    await metrics.endpoint.listen(at.host, at.port);
    log.info({ address: metrics.endpoint.address }, "serving metrics at /metrics");
  } catch (err) {
    throw new AgentFailedError(`agent '${o.name}' cannot serve metrics on ${at.host}:${at.port}: ${listenError(err)}`, { cause: err });
  }
}

/**
 * The capacity to register; undefined with `capacity: false`. Never fails: what cannot be detected
 * is not offered (./liveness/capacity.ts).
 */
export async function capacityToRegister(o: ResolvedOptions, log: Logger): Promise<Capacity | undefined> {
  const given = o.capacity;
  if (given === false) return undefined;
  const capacity = await detectCapacity({ workDir: o.workDir, mounts: o.mounts, override: given, warn: (message) => log.warn(message) });
  log.info({ capacity }, "capacity to register");
  return capacity;
}

/** A listen error in words: the port taken, not allowed, or an address this host does not have. */
function listenError(err: unknown): string {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === "EADDRINUSE") return "the port is in use (EADDRINUSE): give metricsPort a free one, or 0 for any";
  if (code === "EACCES") return "not allowed to listen there (EACCES)";
  if (code === "EADDRNOTAVAIL") return "this host has no such address (EADDRNOTAVAIL): check metricsHost";
  return errorText(err);
}
