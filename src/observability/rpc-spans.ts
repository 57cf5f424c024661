/**
 * Server spans for the daemon's RPCs, and the trace context each call hands on.
 *
 * The interceptor runs first in the chain, on both server paths (connect-node's and the direct
 * unary path, which run the same interceptors), so it sees every call that got past the header
 * checks with its final status: the error interceptor inside it has already turned whatever the
 * handler threw into a gRPC code. It extracts W3C `traceparent` / `tracestate` from the request
 * headers (the global propagator, which tracing.ts registers as W3C's), runs the call in a SERVER
 * span named `<package.Service>/<Method>` with the rpc.* attributes and rpc.grpc.status_code, and
 * leaves the span in the call's context values (callSpanKey) for the handlers that hand its context
 * on: Enqueue stores it with the items, Claim links the items' dispatch spans to it. A stream's span
 * ends when the stream does. Built while no tracer provider is registered, it is a pass-through.
 */
import { context, propagation, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Span, type TextMapGetter } from "@opentelemetry/api";
import { Code, ConnectError, createContextKey, type HandlerContext, type Interceptor } from "@connectrpc/connect";
import { formatTraceparent, normalizeTraceparent } from "@aiflow/wire/traceparent";
import { observeStreamEnd } from "./stream-end.js";
import { TRACER_NAME, tracingActive } from "./tracing.js";
import { VERSION } from "../util/package-version.js";

/** The call's server span, set by the interceptor; undefined while the daemon does not trace. */
export const callSpanKey = createContextKey<Span | undefined>(undefined, { description: "the call's server span" });

const headerGetter: TextMapGetter<Headers> = {
  get: (carrier, key) => carrier.get(key) ?? undefined,
  keys: (carrier) => [...carrier.keys()],
};

/** The codes OpenTelemetry's RPC conventions count as a server's own error (the others are the caller's). */
const SERVER_ERRORS: ReadonlySet<Code> = new Set([Code.Unknown, Code.DeadlineExceeded, Code.Unimplemented, Code.Internal, Code.Unavailable, Code.DataLoss]);

function ended(span: Span, err: unknown): void {
  if (err === undefined) span.setAttribute("rpc.grpc.status_code", 0);
  else {
    const e = ConnectError.from(err);
    span.setAttribute("rpc.grpc.status_code", e.code);
    if (SERVER_ERRORS.has(e.code)) span.setStatus({ code: SpanStatusCode.ERROR, message: e.rawMessage });
  }
  span.end();
}

export function rpcSpanInterceptor(): Interceptor {
  if (!tracingActive()) return (next) => next;
  const tracer = trace.getTracer(TRACER_NAME, VERSION);
  return (next) => async (req) => {
    const parent = propagation.extract(ROOT_CONTEXT, req.header, headerGetter);
    const contentType = req.header.get("content-type") ?? "";
    const span = tracer.startSpan(
      `${req.service.typeName}/${req.method.name}`,
      {
        kind: SpanKind.SERVER,
        attributes: {
          "rpc.system": contentType.startsWith("application/grpc") ? "grpc" : "connect_rpc",
          "rpc.service": req.service.typeName,
          "rpc.method": req.method.name,
        },
      },
      parent,
    );
    req.contextValues.set(callSpanKey, span);
    let res;
    try {
      res = await context.with(trace.setSpan(parent, span), () => next(req));
    } catch (err) {
      ended(span, err);
      throw err;
    }
    if (!res.stream) {
      ended(span, undefined);
      return res;
    }
    // A stream's span ends with the stream, with the code ./stream-end.ts gives it.
    return { ...res, message: observeStreamEnd(res.message, req.signal, (err) => ended(span, err)) };
  };
}

/**
 * The traceparent a call hands on to what it enqueues: its server span's when the daemon traces,
 * else the caller's own `traceparent` header as sent (version 00 text), so a producer's trace
 * reaches the agents through a daemon that exports nothing. A header that is not a valid
 * traceparent is ignored, as W3C Trace Context says a receiver must: the items then carry none.
 */
export function handedTraceparent(ctx: HandlerContext): string | null {
  const span = ctx.values.get(callSpanKey);
  if (span) {
    const sc = span.spanContext();
    return trace.isSpanContextValid(sc) ? formatTraceparent(sc) : null;
  }
  return normalizeTraceparent(ctx.requestHeader.get("traceparent"));
}
