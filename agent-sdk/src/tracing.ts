/**
 * The SDK's traces: the setup that may install an OpenTelemetry SDK, and the spans of each item.
 *
 * Setup. The SDK depends on @opentelemetry/api alone. A worker process that registered a tracer
 * provider of its own before `agent.start()` gets the item spans in it, and nothing is installed.
 * Otherwise, when the standard OTEL_* variables ask for traces (the rule is @aiflow/wire/otel-env's:
 * OTEL_TRACES_EXPORTER=otlp, or an OTLP endpoint set), start() loads the provider, the resource
 * detection and the OTLP/HTTP exporter with a dynamic import — @opentelemetry/sdk-trace-node,
 * @opentelemetry/resources and @opentelemetry/exporter-trace-otlp-proto (or -http for http/json),
 * optional peer dependencies the worker installs — and registers them once per process with the
 * W3C propagator, service.name "aiflow-agent" unless OTEL_SERVICE_NAME says otherwise. Missing
 * packages, or a value the SDK ships no exporter for, are one warning naming what to do, and the
 * agent runs untraced: telemetry never stops work. With nothing asked, nothing is loaded, and the
 * spans are not even started (itemTracer() is undefined), so an untraced agent pays a variable read
 * per item.
 *
 * Item spans, per attempt, all in the trace the item was enqueued in (its stored traceparent):
 *   `queued <kind>`   from when the item was due (created, not-before, or a retry's backoff end)
 *                     to its dispatch, with the wait in ms;
 *   `handle <kind>`   the handler, a consumer span whose parent is the stored context and which is
 *                     the active span while the handler runs (its own spans nest under it);
 *   `complete <kind>` / `fail <kind>` / `release <kind>`, a child of the handler span from its end
 *                     until the daemon took the report.
 * A later attempt of the same item has the same parent, so retries and redeliveries are further
 * spans of the one trace. An item without a stored context gets a trace of its own.
 */
import {
  context,
  diag,
  DiagLogLevel,
  ProxyTracerProvider,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  type Context,
  type HrTime,
  type Span,
  type Tracer,
} from "@opentelemetry/api";
import type { Logger } from "pino";
import { diagToLog, tracesFromEnv, type TracesWanted } from "@aiflow/wire/otel-env";
import { parseTraceparent } from "@aiflow/wire/traceparent";
import type { WorkItem as WireItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import type { Report } from "./report.js";
import type { ItemOutcome } from "./types.js";

const TRACER_NAME = "@aiflow/agent-sdk";

let setup: Promise<void> | undefined;
let installed: { forceFlush(): Promise<void> } | undefined;
let tracer: ItemTracer | undefined;

/** A tracer provider is registered globally (this module's, or the worker's own). */
function providerRegistered(): boolean {
  const provider = trace.getTracerProvider();
  return !(provider instanceof ProxyTracerProvider) || provider.getDelegateTracer(TRACER_NAME) !== undefined;
}

/** The item spans' maker, once a provider is registered; undefined leaves items untraced. */
export function itemTracer(): ItemTracer | undefined {
  return tracer;
}

/**
 * Finds the worker's provider, or installs the SDK if OTEL_* asks for one: once per process,
 * whichever agent starts first, and never throws. While neither holds, each start() looks again.
 */
export function setupTracing(log: Logger, env: Readonly<Record<string, string | undefined>> = process.env): Promise<void> {
  if (setup) return setup;
  const wanted = tracesFromEnv(env);
  if (!wanted.on && !providerRegistered()) {
    if (wanted.error) log.warn(`tracing off: ${wanted.error}`);
    return Promise.resolve();
  }
  return (setup = (wanted.on && !providerRegistered() ? install(wanted, log) : Promise.resolve())
    .catch((err: unknown) => log.warn({ err }, "tracing off: the OpenTelemetry SDK could not be set up"))
    .then(() => {
      if (providerRegistered()) tracer = new ItemTracer(trace.getTracer(TRACER_NAME));
    }));
}

/** Exports the spans the SDK's own provider still holds (none installed: nothing to do); at most `timeoutMs`. */
export async function flushTracing(timeoutMs: number): Promise<void> {
  if (!installed) return;
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([installed.forceFlush().catch(() => undefined), new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs)))]);
  clearTimeout(timer);
}

const PACKAGES = "@opentelemetry/sdk-trace-node, @opentelemetry/resources and @opentelemetry/exporter-trace-otlp-proto (or -http for http/json)";

async function install(wanted: Extract<TracesWanted, { on: true }>, log: Logger): Promise<void> {
  let node: typeof import("@opentelemetry/sdk-trace-node");
  let resources: typeof import("@opentelemetry/resources");
  let exporter: { OTLPTraceExporter: new () => import("@opentelemetry/sdk-trace-node").SpanExporter } | undefined;
  try {
    [node, resources] = await Promise.all([import("@opentelemetry/sdk-trace-node"), import("@opentelemetry/resources")]);
    if (wanted.otlp)
      exporter =
        wanted.otlp.protocol === "http/json"
          ? await import("@opentelemetry/exporter-trace-otlp-http")
          : await import("@opentelemetry/exporter-trace-otlp-proto");
  } catch (err) {
    log.warn(
      { err: err instanceof Error ? err.message : String(err) },
      `tracing off: OTEL_* asks for traces, but the worker does not have the OpenTelemetry SDK: npm install ${PACKAGES}`,
    );
    return;
  }
  const processors = [];
  if (exporter) processors.push(new node.BatchSpanProcessor(new exporter.OTLPTraceExporter()));
  if (wanted.console) processors.push(new node.BatchSpanProcessor(new node.ConsoleSpanExporter()));
  // Later merges win: the SDK's defaults, then ours, then OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES.
  const resource = resources
    .defaultResource()
    .merge(resources.resourceFromAttributes({ "service.name": "aiflow-agent" }))
    .merge(resources.detectResources({ detectors: [resources.envDetector] }));
  const provider = new node.NodeTracerProvider({ resource, spanProcessors: processors });
  diag.setLogger(diagToLog(log), DiagLogLevel.WARN);
  provider.register();
  installed = provider;
  log.info({ service: resource.attributes["service.name"] }, "tracing on: exporting spans");
}

const hrTime = (ns: bigint): HrTime => [Number(ns / 1_000_000_000n), Number(ns % 1_000_000_000n)];

export class ItemTracer {
  constructor(private readonly tracer: Tracer) {}

  /** The spans of one attempt, as it is accepted: its queue wait is recorded at once. */
  begin(w: WireItem, agent: string): ItemSpans {
    const stored = parseTraceparent(w.traceContext);
    const parent = stored ? trace.setSpanContext(ROOT_CONTEXT, { ...stored, isRemote: true }) : ROOT_CONTEXT;
    return new ItemSpans(this.tracer, parent, w, agent);
  }
}

/**
 * One attempt's spans. handler() runs the handler in its span; handled() ends that span and opens
 * the report's; finished() ends whichever is still open with the item's outcome. An abort (lease
 * lost, cancelled) may finish the item before its handler settles: the handler span then ends when
 * the handler does, marked with the outcome.
 */
export class ItemSpans {
  readonly #tracer: Tracer;
  readonly #parent: Context;
  readonly #kind: string;
  readonly #attributes: Record<string, string | number>;
  #handler: Span | undefined;
  #report: Span | undefined;
  #outcome: ItemOutcome | undefined;

  constructor(tracer: Tracer, parent: Context, w: WireItem, agent: string) {
    this.#tracer = tracer;
    this.#parent = parent;
    this.#kind = w.engineKind;
    const dispatchedNs = w.dispatchedAtNs;
    const createdNs = w.createdOn ? w.createdOn.seconds * 1_000_000_000n + BigInt(w.createdOn.nanos) : dispatchedNs;
    const readyNs = w.nextAttemptAtNs > 0n ? w.nextAttemptAtNs : createdNs;
    // Due after its dispatch only by clock steps between daemons: no wait, then.
    const fromNs = readyNs < dispatchedNs ? readyNs : dispatchedNs;
    const waitMs = Number(dispatchedNs - fromNs) / 1e6;
    this.#attributes = {
      "messaging.system": "aiflow",
      "messaging.destination.name": w.engineKind,
      "aiflow.tenant": w.tenantKey,
      "aiflow.work_item.id": w.id,
      "aiflow.work_item.attempt": w.retryCount + 1,
      "aiflow.work_item.redelivery_count": w.redeliveryCount,
      "aiflow.agent.name": agent,
      "aiflow.daemon.instance": w.leasedBy,
      "aiflow.queue.wait_ms": waitMs,
      ...(w.taskName ? { "aiflow.task.name": w.taskName } : {}),
    };
    if (dispatchedNs > 0n)
      tracer
        .startSpan(`queued ${w.engineKind}`, { kind: SpanKind.INTERNAL, startTime: hrTime(fromNs), attributes: this.#attributes }, parent)
        .end(hrTime(dispatchedNs));
  }

  /** Runs the handler with its span active, so the spans it makes are its children. */
  handler<T>(run: () => T): T {
    const span = this.#tracer.startSpan(
      `handle ${this.#kind}`,
      { kind: SpanKind.CONSUMER, attributes: { ...this.#attributes, "messaging.operation.type": "process", "messaging.operation.name": "handle" } },
      this.#parent,
    );
    this.#handler = span;
    return context.with(trace.setSpan(this.#parent, span), run);
  }

  /** The handler settled with this report; `aborted`: its outcome was settled already, and nothing is reported. */
  handled(report: Report, aborted: boolean): void {
    const span = this.#handler;
    if (!span) return;
    this.#handler = undefined;
    if (report.kind === "fail") {
      span.setAttribute("aiflow.work_item.retryable", report.retryable);
      span.setStatus({ code: SpanStatusCode.ERROR, message: report.error });
    }
    if (aborted || this.#outcome) {
      if (this.#outcome) span.setAttribute("aiflow.outcome", this.#outcome.kind);
      span.end();
      return;
    }
    span.end();
    this.#report = this.#tracer.startSpan(
      `${report.kind} ${this.#kind}`,
      { kind: SpanKind.INTERNAL, attributes: { "aiflow.work_item.id": this.#attributes["aiflow.work_item.id"]! } },
      trace.setSpan(this.#parent, span),
    );
  }

  /** The item's outcome is settled: the report's span (or a handler span still running) ends with it. */
  finished(outcome: ItemOutcome): void {
    this.#outcome = outcome;
    const span = this.#report;
    if (!span) return;
    this.#report = undefined;
    span.setAttribute("aiflow.outcome", outcome.kind);
    if (outcome.kind === "lease-lost" || outcome.kind === "unreported" || outcome.kind === "cancelled")
      span.setStatus({ code: SpanStatusCode.ERROR, message: outcome.reason });
    span.end();
  }
}
