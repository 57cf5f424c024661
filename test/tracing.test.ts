/**
 * One trace from a producer's Enqueue to the agent's handler, across three real processes — a
 * producer, `aiflowd serve` and an SDK worker — each exporting its spans with the real OTLP/HTTP
 * exporter (OTLP/JSON) to a collector in this process (support/otlp-collector.ts), so the spans
 * read here are what a tracing backend would get. Nothing is timed: each check waits until the
 * spans it reads have arrived.
 */
import { once } from "node:events";
import type { ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startChild, type Child } from "../bench/proc.js";
import { spawnDaemon } from "../agent-sdk/test/daemon-process.js";
import { Producer } from "../agent-sdk/test/support.js";
import { TOKENS } from "./support/daemon.js";
import { freePort } from "./support/free-port.js";
import { until, useTestDb } from "./support/kit.js";
import { OtlpCollector, type CollectedSpan } from "./support/otlp-collector.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const INSTANCE = "traced-daemon";
const AGENT = `traced-agent-${process.pid}`;
const TENANT = "t1";
/** OTLP's span kinds and status codes, as the JSON carries them. */
const KIND = { internal: 1, server: 2, producer: 4, consumer: 5 } as const;
const ERROR = 2;

const fx = useTestDb("tracing");
let collector: OtlpCollector;
let daemon: ChildProcess | undefined;
let worker: Child | undefined;
let address: string;
let producer: Producer;

/** The environment that turns each child's tracing on, pointed at the collector, exporting every 50 ms. */
const otel = (): NodeJS.ProcessEnv => ({
  OTEL_TRACES_EXPORTER: "otlp",
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: collector.endpoint,
  OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: "http/json",
  OTEL_BSP_SCHEDULE_DELAY: "50",
});

beforeAll(async () => {
  collector = await OtlpCollector.start();
  const port = await freePort();
  address = `127.0.0.1:${port}`;
  daemon = await spawnDaemon(fx.db.schema, port, INSTANCE, { heartbeatInterval: "1s", leaseTtl: "30s" }, otel());
  worker = startChild(`${ROOT}agent-sdk/test/traced-worker.ts`, [address, TOKENS.agent, AGENT, TENANT], {
    env: otel(),
    ready: (line) => line.includes('"ready"'),
  });
  await worker.ready;
  producer = new Producer(address, TENANT);
});

afterAll(async () => {
  producer?.close();
  await worker?.stop();
  if (daemon && daemon.exitCode === null) {
    daemon.kill("SIGTERM");
    await once(daemon, "exit");
  }
  await collector?.close();
});

/** Runs the tracing producer process: one Enqueue of `items` in a span of its own. */
async function produce(items: object[]): Promise<{ ids: string[]; traceId: string; spanId: string }> {
  const child = startChild(`${ROOT}test/support/traced-producer.ts`, [address, TOKENS.engine, TENANT, JSON.stringify(items)], {
    env: otel(),
    ready: (line) => line.startsWith("{"),
  });
  const line = await child.ready;
  await child.exited;
  return JSON.parse(line) as { ids: string[]; traceId: string; spanId: string };
}

/** The spans named `name` about work item `id`, first attempt first, once there are `n` of them. */
async function spansOf(name: string, id: string, n = 1): Promise<CollectedSpan[]> {
  const of = () => collector.named(name).filter((s) => s.attributes["aiflow.work_item.id"] === id);
  await until(`${n} '${name}' span(s) of item ${id} arrived`, () => of().length >= n, 20_000);
  return of().sort(
    (a, b) => Number(a.attributes["aiflow.work_item.attempt"] ?? 0) - Number(b.attributes["aiflow.work_item.attempt"] ?? 0) || Number(a.startNs - b.startNs),
  );
}

/** The one span that satisfies `test`, once it has arrived. */
async function spanWhere(what: string, test: (s: CollectedSpan) => boolean): Promise<CollectedSpan> {
  await until(`${what} arrived`, () => collector.spans.some(test), 20_000);
  const found = collector.spans.filter(test);
  expect(found, what).toHaveLength(1);
  return found[0]!;
}

/** The span ids from `span` up its parents, as far as the collected spans go. */
function ancestry(span: CollectedSpan): string[] {
  const chain = [span.spanId];
  for (let s: CollectedSpan | undefined = span; s && s.parentSpanId !== ""; s = collector.byId(s.parentSpanId)) chain.push(s.parentSpanId);
  return chain;
}

/** The first test's dispatch span's link: to the agent stream's server span. */
let streamLink: { traceId: string; spanId: string } | undefined;

describe("an item's trace", () => {
  it("runs from the producer's Enqueue span through the daemon's Enqueue and the agent's stream to its handler, and its report", async () => {
    const made = await produce([{ engineKind: "traced" }]);
    const [id] = made.ids;
    await producer.waitDone([id!]);

    const sent = await spanWhere("the producer's span", (s) => s.spanId === made.spanId);
    expect(sent).toMatchObject({ service: "aiflow-test-producer", name: "enqueue traced", kind: KIND.producer, traceId: made.traceId, parentSpanId: "" });

    // The daemon's server span is the producer span's child: the traceparent it sent was extracted.
    const enqueue = await spanWhere("the daemon's Enqueue span", (s) => s.name === "aiflow.cluster.v1.QueueService/Enqueue" && s.traceId === made.traceId);
    expect(enqueue).toMatchObject({ service: "aiflowd", kind: KIND.server, parentSpanId: sent.spanId });
    expect(enqueue.attributes).toMatchObject({
      "rpc.system": "grpc",
      "rpc.service": "aiflow.cluster.v1.QueueService",
      "rpc.method": "Enqueue",
      "rpc.grpc.status_code": 0,
    });

    // The dispatch is in the item's trace, naming agent and daemon, linked to the call that took it:
    // the agent's stream (Connect), the SDK's default.
    const [dispatch] = await spansOf("dispatch traced", id!);
    expect(dispatch).toMatchObject({ service: "aiflowd", traceId: made.traceId, parentSpanId: enqueue.spanId });
    expect(dispatch!.attributes).toMatchObject({
      "aiflow.agent.name": AGENT,
      "aiflow.daemon.instance": INSTANCE,
      "aiflow.work_item.attempt": 1,
      "aiflow.work_item.redelivery_count": 0,
      "aiflow.tenant": TENANT,
    });
    expect(dispatch!.links).toHaveLength(1);
    // That span ends (and is exported) with the stream: the last test reads it.
    expect(dispatch!.links[0]!.traceId).not.toBe(made.traceId);
    streamLink = dispatch!.links[0]!;

    // The agent: the queue wait up to that dispatch, then the handler, whose parent chain reaches the producer.
    const [queued] = await spansOf("queued traced", id!);
    expect(queued).toMatchObject({ service: "aiflow-agent", traceId: made.traceId, parentSpanId: enqueue.spanId, endNs: dispatch!.startNs });
    // Both ends are the item's own stored times (due, dispatched), not clock readings of the agent.
    expect(queued!.startNs).toBeLessThanOrEqual(queued!.endNs);
    const [handle] = await spansOf("handle traced", id!);
    expect(handle).toMatchObject({ service: "aiflow-agent", kind: KIND.consumer, traceId: made.traceId, parentSpanId: enqueue.spanId, status: { code: 0 } });
    expect(handle!.attributes).toMatchObject({
      "aiflow.work_item.attempt": 1,
      "aiflow.work_item.redelivery_count": 0,
      "aiflow.agent.name": AGENT,
      "aiflow.daemon.instance": INSTANCE,
      "aiflow.queue.wait_ms": queued!.attributes["aiflow.queue.wait_ms"],
      "messaging.system": "aiflow",
      "messaging.operation.type": "process",
      "messaging.destination.name": "traced",
    });
    expect(handle!.attributes["aiflow.queue.wait_ms"]).toBeGreaterThanOrEqual(0);
    expect(ancestry(handle!)).toEqual([handle!.spanId, enqueue.spanId, sent.spanId]);
    // The handler's own span nests under it (the handler span is the active one while it runs),
    // and the report follows it, ending with the outcome.
    await spanWhere("the handler's own span", (s) => s.name === "inside the handler" && s.parentSpanId === handle!.spanId && s.traceId === made.traceId);
    const [report] = await spansOf("complete traced", id!);
    expect(report).toMatchObject({ traceId: made.traceId, parentSpanId: handle!.spanId });
    expect(report!.attributes["aiflow.outcome"]).toBe("completed");
  });

  it("holds every attempt: a retried item shows two handler spans with the same parent, the first failed", async () => {
    const made = await produce([{ engineKind: "flaky", maxRetries: 2 }]);
    const [id] = made.ids;
    await producer.waitDone([id!]);
    const enqueue = await spanWhere("the daemon's Enqueue span", (s) => s.name === "aiflow.cluster.v1.QueueService/Enqueue" && s.traceId === made.traceId);

    const handles = await spansOf("handle flaky", id!, 2);
    expect(handles).toHaveLength(2);
    expect(handles.map((h) => [h.traceId, h.parentSpanId, h.attributes["aiflow.work_item.attempt"]])).toEqual([
      [made.traceId, enqueue.spanId, 1],
      [made.traceId, enqueue.spanId, 2],
    ]);
    expect(handles[0]!.status).toMatchObject({ code: ERROR, message: expect.stringContaining("the first attempt fails") });
    expect(handles[0]!.attributes["aiflow.work_item.retryable"]).toBe(true);
    expect(handles[1]!.status.code).not.toBe(ERROR);

    const [failed] = await spansOf("fail flaky", id!);
    expect(failed).toMatchObject({ parentSpanId: handles[0]!.spanId });
    expect(failed!.attributes["aiflow.outcome"]).toBe("failed");
    const [completed] = await spansOf("complete flaky", id!);
    expect(completed).toMatchObject({ parentSpanId: handles[1]!.spanId });
    const dispatches = await spansOf("dispatch flaky", id!, 2);
    expect(dispatches.map((d) => [d.traceId, d.parentSpanId, d.attributes["aiflow.work_item.attempt"]])).toEqual([
      [made.traceId, enqueue.spanId, 1],
      [made.traceId, enqueue.spanId, 2],
    ]);
  });

  it("links each dispatch to the server span of the agent's stream, which ends when the worker stops", async () => {
    expect(streamLink).toBeDefined();
    await worker!.stop();
    worker = undefined;
    const stream = await spanWhere("the agent stream's span", (s) => s.spanId === streamLink!.spanId);
    expect(stream).toMatchObject({ service: "aiflowd", name: "aiflow.cluster.v1.AgentService/Connect", kind: KIND.server, traceId: streamLink!.traceId });
    expect(stream.attributes).toMatchObject({ "rpc.method": "Connect", "rpc.grpc.status_code": 0 });
  });
});
