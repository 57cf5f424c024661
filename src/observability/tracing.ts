/**
 * The daemon's OpenTelemetry setup, the one place that loads an SDK. Everything else in the daemon
 * uses @opentelemetry/api alone, whose calls are no-ops until a tracer provider is registered.
 *
 * What must stay true: with no OTEL_* variable asking for traces (the rule is
 * @aiflow/wire/otel-env's), nothing is registered and the SDK's modules are not even loaded; the
 * interceptor and the per-item spans are then left out altogether (tracingActive() is false when
 * they are built). When they ask, a NodeTracerProvider is registered globally with the W3C trace
 * context propagator, a batch span processor and the OTLP/HTTP exporter of the protocol asked for
 * (which reads its endpoint, headers, timeout and compression from the standard variables itself);
 * the sampler follows OTEL_TRACES_SAMPLER. A provider the embedding process registered before the
 * daemon started is used as it is.
 */
import { diag, DiagLogLevel, ProxyTracerProvider, trace, type Attributes } from "@opentelemetry/api";
import { diagToLog, tracesFromEnv } from "@aiflow/wire/otel-env";
import { ConfigError } from "../domain/errors.js";
import type { Logger } from "../log.js";
import { LATE, within } from "../util/within.js";
import { VERSION } from "../util/package-version.js";

/** The daemon's tracer name (its instrumentation scope). */
export const TRACER_NAME = "aiflowd";

export interface Tracing {
  /** A provider is registered (this one, or the embedding process's). */
  readonly active: boolean;
  /** Exports what is buffered and stops the provider this installed (none: nothing to do); at most `timeoutMs`. */
  shutdown(timeoutMs?: number): Promise<void>;
}

let installed = false;

/**
 * A tracer provider is registered globally: by startTracing, or by whoever embeds the daemon. What
 * is built to trace (the RPC interceptor, the dispatch spans) asks this once, when it is built.
 */
export function tracingActive(): boolean {
  if (installed) return true;
  const provider = trace.getTracerProvider();
  // The global is a proxy whose delegate is what was registered; one from another copy of the API is a registration too.
  return !(provider instanceof ProxyTracerProvider) || provider.getDelegateTracer(TRACER_NAME) !== undefined;
}

export interface TracingOptions {
  log: Logger;
  /** The variables to read; default process.env. */
  env?: Readonly<Record<string, string | undefined>>;
  /** service.name unless OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) names one. */
  serviceName?: string;
  /** More resource attributes (service.instance.id, say); OTEL_RESOURCE_ATTRIBUTES wins over them. */
  resource?: Attributes;
}

/**
 * Installs the SDK when the OTEL_* variables ask for traces. A value this daemon does not ship an
 * exporter for (OTLP over gRPC, zipkin) is a ConfigError, as any other bad setting.
 */
export async function startTracing({ log, env = process.env, serviceName = "aiflowd", resource = {} }: TracingOptions): Promise<Tracing> {
  const wanted = tracesFromEnv(env);
  if (!wanted.on) {
    if (wanted.error) throw new ConfigError("OTEL_TRACES_EXPORTER", wanted.error);
    return { active: tracingActive(), shutdown: async () => {} };
  }
  if (tracingActive()) {
    log.info("a tracer provider is already registered: the daemon's spans go to it");
    return { active: true, shutdown: async () => {} };
  }
  const [node, resources] = await Promise.all([import("@opentelemetry/sdk-trace-node"), import("@opentelemetry/resources")]);
  const processors = [];
  if (wanted.otlp) {
    const { OTLPTraceExporter } =
      wanted.otlp.protocol === "http/json" ? await import("@opentelemetry/exporter-trace-otlp-http") : await import("@opentelemetry/exporter-trace-otlp-proto");
    processors.push(new node.BatchSpanProcessor(new OTLPTraceExporter()));
  }
  if (wanted.console) processors.push(new node.BatchSpanProcessor(new node.ConsoleSpanExporter()));
  // Later merges win: the SDK's defaults, then ours, then what OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES say.
  const attributes = resources
    .defaultResource()
    .merge(resources.resourceFromAttributes({ "service.name": serviceName, "service.version": VERSION, ...resource }))
    .merge(resources.detectResources({ detectors: [resources.envDetector] }));
  const provider = new node.NodeTracerProvider({ resource: attributes, spanProcessors: processors });
  diag.setLogger(diagToLog(log), DiagLogLevel.WARN);
  provider.register();
  installed = true;
  log.info(
    {
      service: attributes.attributes["service.name"],
      exporter: [wanted.otlp ? `otlp ${wanted.otlp.protocol}` : undefined, wanted.console ? "console" : undefined].filter(Boolean).join(", "),
    },
    "tracing on: exporting spans",
  );
  return {
    active: true,
    // Bounded: a collector that is away must not hold the daemon's exit. (The exporter's own retries
    // may still keep the process a little longer, up to OTEL_EXPORTER_OTLP_TIMEOUT, 10 s by default.)
    shutdown: async (timeoutMs = 5_000) => {
      const stopped = provider.shutdown().then(
        () => "done" as const,
        (err: unknown) => (err instanceof Error ? err.message : String(err)),
      );
      const outcome = await within(stopped, timeoutMs);
      if (outcome === LATE) log.warn({ timeoutMs }, "tracing: spans not exported by the shutdown deadline were dropped (is the collector reachable?)");
      else if (outcome !== "done") log.warn({ err: outcome }, "tracing: the last spans could not be exported");
    },
  };
}
