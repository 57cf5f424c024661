/**
 * The conventional gRPC server metrics (go-grpc-prometheus' names and labels, which dashboards and
 * alerts across the ecosystem are written against): calls started, handled by code, handling
 * seconds, and calls in flight.
 *
 * The interceptor runs second in the chain, inside the tracing one and outside the error one, on
 * both server paths; so it sees every call that got past the header checks, with the gRPC code the
 * caller receives (the error interceptor has already turned whatever the handler threw into one).
 * Calls refused on their headers (no token, too many failed attempts, over a limit) never reach it:
 * aiflow_server_refused_total counts those by reason. A stream counts as handled when it ends,
 * with the code ./stream-end.ts gives it.
 */
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import { observeStreamEnd } from "./stream-end.js";

const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

type GrpcType = "unary" | "client_stream" | "server_stream" | "bidi_stream";
const GRPC_TYPE: Record<string, GrpcType> = {
  unary: "unary",
  client_streaming: "client_stream",
  server_streaming: "server_stream",
  bidi_streaming: "bidi_stream",
};

/** Go's names of the codes (Code.String() there), as grpc_code spells them: "OK", "Canceled", "InvalidArgument", … */
const codeName = (code: Code | undefined) => (code === undefined ? "OK" : (Code[code] ?? "Unknown"));

/** One method's children of each metric, made on its first call (labels() hashes its arguments on every use). */
interface MethodMetrics {
  started: { inc(): void };
  handling: { observe(v: number): void };
  inFlight: { inc(): void; dec(): void };
  handled: Map<string, { inc(): void }>;
  labels: { grpc_type: GrpcType; grpc_service: string; grpc_method: string };
}

export function rpcMetricsInterceptor(registry: Registry): Interceptor {
  const started = new Counter({
    name: "grpc_server_started_total",
    help: "RPCs started on the server",
    labelNames: ["grpc_type", "grpc_service", "grpc_method"],
    registers: [registry],
  });
  const handled = new Counter({
    name: "grpc_server_handled_total",
    help: "RPCs completed on the server, by gRPC code",
    labelNames: ["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
    registers: [registry],
  });
  const handling = new Histogram({
    name: "grpc_server_handling_seconds",
    help: "Seconds from an RPC's start to its end on the server (a stream's: to its last message)",
    labelNames: ["grpc_type", "grpc_service", "grpc_method"],
    buckets: LATENCY_BUCKETS,
    registers: [registry],
  });
  const inFlight = new Gauge({
    name: "grpc_server_in_flight_calls",
    help: "RPCs being handled now",
    labelNames: ["grpc_service", "grpc_method"],
    registers: [registry],
  });

  const byMethod = new Map<string, MethodMetrics>();
  const metricsOf = (service: string, method: string, kind: string): MethodMetrics => {
    const key = `${service}/${method}`;
    let m = byMethod.get(key);
    if (!m) {
      const labels = { grpc_type: GRPC_TYPE[kind] ?? "unary", grpc_service: service, grpc_method: method };
      m = {
        started: started.labels(labels),
        handling: handling.labels(labels),
        inFlight: inFlight.labels({ grpc_service: service, grpc_method: method }),
        handled: new Map(),
        labels,
      };
      byMethod.set(key, m);
    }
    return m;
  };
  const end = (m: MethodMetrics, t0: number, err: unknown) => {
    const code = codeName(err === undefined ? undefined : ConnectError.from(err).code);
    let h = m.handled.get(code);
    if (!h) m.handled.set(code, (h = handled.labels({ ...m.labels, grpc_code: code })));
    h.inc();
    m.handling.observe((performance.now() - t0) / 1000);
    m.inFlight.dec();
  };

  return (next) => async (req) => {
    const m = metricsOf(req.service.typeName, req.method.name, req.method.methodKind);
    m.started.inc();
    m.inFlight.inc();
    const t0 = performance.now();
    let res;
    try {
      res = await next(req);
    } catch (err) {
      end(m, t0, err);
      throw err;
    }
    if (!res.stream) {
      end(m, t0, undefined);
      return res;
    }
    return { ...res, message: observeStreamEnd(res.message, req.signal, (err) => end(m, t0, err)) };
  };
}
