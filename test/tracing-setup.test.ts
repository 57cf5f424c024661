/**
 * When tracing is on, and what is installed: the OTEL_* rule the daemon and the SDK share, and that
 * with nothing asked neither side registers a provider, so the global tracer stays the API's no-op
 * and the daemon builds no interceptor or dispatch spans. (This file's process registers no
 * provider; the exporting paths run in child processes, test/tracing.test.ts.)
 */
import { describe, expect, it } from "vitest";
import { ProxyTracerProvider, trace } from "@opentelemetry/api";
import { tracesFromEnv } from "@aiflow/wire/otel-env";
import { formatTraceparent, parseTraceparent } from "@aiflow/wire/traceparent";
import { itemTracer, setupTracing } from "../agent-sdk/src/tracing.js";
import { ConfigError } from "../src/domain/errors.js";
import { dispatchTracer } from "../src/observability/dispatch-spans.js";
import { rpcSpanInterceptor } from "../src/observability/rpc-spans.js";
import { startTracing, tracingActive } from "../src/observability/tracing.js";
import { captureLog } from "./support/agents.js";

describe("the OTEL_* variables", () => {
  it.each([
    ["nothing set", {}, { on: false }],
    [
      "an endpoint, no exporter named",
      { OTEL_EXPORTER_OTLP_ENDPOINT: "http://collector:4318" },
      { on: true, otlp: { protocol: "http/protobuf" }, console: false },
    ],
    ["a traces endpoint", { OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://c:4318/v1/traces" }, { on: true, otlp: { protocol: "http/protobuf" }, console: false }],
    [
      "otlp named, JSON asked for traces",
      { OTEL_TRACES_EXPORTER: "otlp", OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/json", OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" },
      { on: true, otlp: { protocol: "http/json" }, console: false },
    ],
    ["otlp and console", { OTEL_TRACES_EXPORTER: " OTLP , console" }, { on: true, otlp: { protocol: "http/protobuf" }, console: true }],
    ["none, with an endpoint", { OTEL_TRACES_EXPORTER: "none", OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318" }, { on: false }],
    ["the SDK disabled", { OTEL_SDK_DISABLED: "true", OTEL_TRACES_EXPORTER: "otlp" }, { on: false }],
    ["an empty endpoint", { OTEL_EXPORTER_OTLP_ENDPOINT: " " }, { on: false }],
  ])("%s", (_, env, wanted) => {
    expect(tracesFromEnv(env)).toEqual(wanted);
  });

  it.each([
    [
      "OTLP over gRPC",
      { OTEL_TRACES_EXPORTER: "otlp", OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" },
      /OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported.*http\/protobuf/,
    ],
    ["an exporter not shipped", { OTEL_TRACES_EXPORTER: "zipkin,otlp" }, /'zipkin'.*only 'otlp'/],
  ])("asking for %s is off, saying what to set instead", (_, env, error) => {
    const wanted = tracesFromEnv(env);
    expect(wanted.on).toBe(false);
    expect(!wanted.on && wanted.error).toMatch(error);
  });
});

describe("W3C traceparent text", () => {
  it("reads version 00 and writes it back as it was; a later version is read by its first four fields", () => {
    const text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    expect(parseTraceparent(text)).toEqual({ traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId: "00f067aa0ba902b7", traceFlags: 1 });
    expect(formatTraceparent(parseTraceparent(text)!)).toBe(text);
    expect(parseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-x")).toMatchObject({ traceFlags: 0 });
    expect(parseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00x")).toBeUndefined();
  });
});

describe("with nothing asked", () => {
  it("the daemon registers no provider: the global tracer is the no-op, and no interceptor or dispatch spans are built", async () => {
    const captured = captureLog("debug");
    const tracing = await startTracing({ log: captured.log, env: {} });
    expect(tracing.active).toBe(false);
    expect(tracingActive()).toBe(false);
    const provider = trace.getTracerProvider();
    expect(provider).toBeInstanceOf(ProxyTracerProvider);
    expect((provider as ProxyTracerProvider).getDelegateTracer("any")).toBeUndefined();
    const span = trace.getTracer("any").startSpan("nothing");
    expect(span.isRecording()).toBe(false);
    expect(trace.isSpanContextValid(span.spanContext())).toBe(false);
    const next = async () => ({}) as never;
    expect(rpcSpanInterceptor()(next)).toBe(next);
    expect(dispatchTracer()).toBeUndefined();
    expect(captured.lines()).toEqual([]);
  });

  it("the daemon refuses, at start, an exporter it does not ship, naming the setting", async () => {
    const captured = captureLog();
    await expect(
      startTracing({ log: captured.log, env: { OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4317", OTEL_EXPORTER_OTLP_PROTOCOL: "grpc" } }),
    ).rejects.toThrow(ConfigError);
    expect(tracingActive()).toBe(false);
  });

  it("the SDK registers no provider and traces no item; a value it ships no exporter for is one warning, and the agent goes on untraced", async () => {
    const quiet = captureLog("debug");
    await setupTracing(quiet.log, {});
    expect(itemTracer()).toBeUndefined();
    expect(quiet.lines()).toEqual([]);
    const warned = captureLog("debug");
    await setupTracing(warned.log, { OTEL_TRACES_EXPORTER: "jaeger" });
    expect(itemTracer()).toBeUndefined();
    expect(warned.lines().map((l) => [l.level, l.msg])).toEqual([[40, expect.stringMatching(/^tracing off: OTEL_TRACES_EXPORTER names 'jaeger'/)]]);
    expect((trace.getTracerProvider() as ProxyTracerProvider).getDelegateTracer("any")).toBeUndefined();
  });
});
