/**
 * Whether the standard OTEL_* variables ask for traces, and how to export them: one reading for the
 * daemon (src/observability/tracing.ts) and the agent SDK (agent-sdk/src/tracing.ts), so that the
 * same environment turns both on or leaves both off.
 *
 * The rule: OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none, is off. OTEL_TRACES_EXPORTER=otlp
 * (or console) is on. Unset, traces are on only when an OTLP endpoint is given
 * (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT), so a process with nothing set
 * installs no SDK at all and its tracing costs the API's no-op. OTLP goes over HTTP, as protobuf
 * (the default) or JSON (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL);
 * OTLP over gRPC and the other exporters are not shipped, and asking for them is an error that
 * says what to set instead, rather than traces silently going nowhere.
 */
import type { DiagLogFunction, DiagLogger } from "@opentelemetry/api";

export type OtlpProtocol = "http/protobuf" | "http/json";

/** Off (with why, when the variables ask for something not shipped), or on with its exporters. */
export type TracesWanted = { on: false; error?: string } | { on: true; otlp: { protocol: OtlpProtocol } | undefined; console: boolean };

const set = (v: string | undefined): v is string => v !== undefined && v.trim() !== "";

export function tracesFromEnv(env: Readonly<Record<string, string | undefined>>): TracesWanted {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === "true") return { on: false };
  const named = set(env.OTEL_TRACES_EXPORTER)
    ? env.OTEL_TRACES_EXPORTER.split(",")
        .map((s) => s.trim().toLowerCase())
        .filter((s) => s !== "")
    : set(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) || set(env.OTEL_EXPORTER_OTLP_ENDPOINT)
      ? ["otlp"]
      : [];
  const exporters = named.filter((e) => e !== "none");
  if (exporters.length === 0) return { on: false };
  const unknown = exporters.filter((e) => e !== "otlp" && e !== "console");
  if (unknown.length > 0)
    return {
      on: false,
      error: `OTEL_TRACES_EXPORTER names ${unknown.map((e) => `'${e}'`).join(", ")}: only 'otlp' (OTLP over HTTP), 'console' and 'none' are supported`,
    };
  let otlp: { protocol: OtlpProtocol } | undefined;
  if (exporters.includes("otlp")) {
    const which = set(env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL) ? "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" : "OTEL_EXPORTER_OTLP_PROTOCOL";
    const protocol = env[which]?.trim().toLowerCase() || "http/protobuf";
    if (protocol !== "http/protobuf" && protocol !== "http/json")
      return {
        on: false,
        error: `${which}=${protocol} is not supported: OTLP traces go over HTTP, as 'http/protobuf' (the default) or 'http/json' (a collector's port 4318)`,
      };
    otlp = { protocol };
  }
  return { on: true, otlp, console: exporters.includes("console") };
}

/** How often the OpenTelemetry SDK's own complaints (an unreachable collector, say) reach the log at most. */
const DIAG_EVERY_MS = 10_000;

/**
 * The OpenTelemetry SDK's diagnostics as warnings in a pino log, at most one line per DIAG_EVERY_MS
 * (with how many were suppressed since), for the daemon and the agent SDK alike.
 */
export function diagToLog(log: { warn(fields: object, message: string): void }): DiagLogger {
  let last = Number.NEGATIVE_INFINITY;
  let suppressed = 0;
  const warn: DiagLogFunction = (message, ...args) => {
    const now = performance.now();
    if (now - last < DIAG_EVERY_MS) return void suppressed++;
    last = now;
    log.warn({ detail: args.map((a) => (a instanceof Error ? a.message : String(a))).join(" "), suppressed }, `tracing: ${message}`);
    suppressed = 0;
  };
  const quiet: DiagLogFunction = () => {};
  return { error: warn, warn, info: quiet, debug: quiet, verbose: quiet };
}
