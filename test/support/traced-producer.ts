/**
 * A producer process that traces (test/tracing.test.ts): the daemon's tracing setup under another
 * service name, one PRODUCER span `enqueue <kind>` around an Enqueue whose request carries the
 * span's W3C traceparent, then one JSON line, `{"ids": [...], "traceId": ..., "spanId": ...}`,
 * and an exit once its spans are exported (OTEL_* in its environment says where to).
 *
 *   node --import tsx test/support/traced-producer.ts ADDRESS TOKEN TENANT ITEMS_JSON
 */
import { context, propagation, SpanKind, trace } from "@opentelemetry/api";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { createLogger } from "../../src/log.js";
import { startTracing } from "../../src/observability/tracing.js";

const [address, token, tenant, itemsJson] = process.argv.slice(2);
const items = JSON.parse(itemsJson!) as { engineKind: string; payloadJson?: string; maxRetries?: number }[];
const tracing = await startTracing({ log: createLogger({ level: "warn", pretty: false }), serviceName: "aiflow-test-producer" });
if (!tracing.active) throw new Error("the producer needs OTEL_* to ask for traces");

const queue = createClient(QueueService, createGrpcTransport({ baseUrl: `http://${address}` }));
const span = trace.getTracer("aiflow-test-producer").startSpan(`enqueue ${items[0]!.engineKind}`, { kind: SpanKind.PRODUCER });
const headers = new Headers({ authorization: `Bearer ${token}` });
propagation.inject(trace.setSpan(context.active(), span), headers, { set: (h, k, v) => h.set(k, v) });
const res = await queue.enqueue({ tenantKey: tenant!, items }, { headers });
span.end();
await tracing.shutdown();
console.log(JSON.stringify({ ids: res.results.map((r) => r.id), traceId: span.spanContext().traceId, spanId: span.spanContext().spanId }));
