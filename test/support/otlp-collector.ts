/**
 * A tiny OTLP/HTTP trace collector on loopback: what processes under test export their spans to
 * (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = `endpoint`), so a test reads the spans the real exporter
 * sent. OTLP/JSON requests are parsed and kept; protobuf ones are answered and dropped (counted in
 * `dropped`), which is all a benchmark's stub needs. Every request is answered 200 with an empty
 * ExportTraceServiceResponse, as a collector that took it does.
 */
import { once } from "node:events";
import http from "node:http";
import type { AddressInfo } from "node:net";

/** One span as OTLP/JSON spells it (ids in hex), with its resource's service.name. */
export interface CollectedSpan {
  service: string;
  traceId: string;
  spanId: string;
  /** "" for a root span. */
  parentSpanId: string;
  name: string;
  /** OTLP's SpanKind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer. */
  kind: number;
  startNs: bigint;
  endNs: bigint;
  attributes: Record<string, string | number | boolean>;
  links: { traceId: string; spanId: string }[];
  /** OTLP's status code: 0 unset, 1 ok, 2 error. */
  status: { code: number; message: string };
}

interface AnyValue {
  stringValue?: string;
  intValue?: string | number;
  doubleValue?: number;
  boolValue?: boolean;
}
type KeyValue = { key: string; value: AnyValue };
interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  kind?: number;
  startTimeUnixNano: string | number;
  endTimeUnixNano: string | number;
  attributes?: KeyValue[];
  links?: { traceId: string; spanId: string }[];
  status?: { code?: number; message?: string };
}
interface ExportRequest {
  resourceSpans?: { resource?: { attributes?: KeyValue[] }; scopeSpans?: { spans?: OtlpSpan[] }[] }[];
}

const attributeValue = (v: AnyValue): string | number | boolean =>
  v.stringValue ?? (v.intValue !== undefined ? Number(v.intValue) : undefined) ?? v.doubleValue ?? v.boolValue ?? "";
const attributesOf = (kvs: KeyValue[] | undefined) => Object.fromEntries((kvs ?? []).map((kv) => [kv.key, attributeValue(kv.value)]));

export class OtlpCollector {
  readonly spans: CollectedSpan[] = [];
  /** Requests that were not OTLP/JSON (protobuf), answered and not read. */
  dropped = 0;
  readonly #server: http.Server;

  private constructor(server: http.Server) {
    this.#server = server;
  }

  static async start(): Promise<OtlpCollector> {
    const server = http.createServer();
    const collector = new OtlpCollector(server);
    server.on("request", (req, res) => collector.#take(req, res));
    server.listen(0, "127.0.0.1");
    await once(server, "listening");
    return collector;
  }

  /** The traces endpoint, for OTEL_EXPORTER_OTLP_TRACES_ENDPOINT. */
  get endpoint(): string {
    return `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}/v1/traces`;
  }

  /** The spans named `name` (of `service`, when given). */
  named(name: string, service?: string): CollectedSpan[] {
    return this.spans.filter((s) => s.name === name && (service === undefined || s.service === service));
  }

  /** The span with this id. */
  byId(spanId: string): CollectedSpan | undefined {
    return this.spans.find((s) => s.spanId === spanId);
  }

  close(): Promise<void> {
    this.#server.closeAllConnections();
    return new Promise((resolve) => this.#server.close(() => resolve()));
  }

  #take(req: http.IncomingMessage, res: http.ServerResponse): void {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const json = (req.headers["content-type"] ?? "").startsWith("application/json");
      if (json) this.#keep(JSON.parse(Buffer.concat(chunks).toString("utf8")) as ExportRequest);
      else this.dropped++;
      res.writeHead(200, { "content-type": json ? "application/json" : "application/x-protobuf" });
      res.end(json ? "{}" : undefined);
    });
  }

  #keep(body: ExportRequest): void {
    for (const rs of body.resourceSpans ?? []) {
      const service = String(attributesOf(rs.resource?.attributes)["service.name"] ?? "");
      for (const ss of rs.scopeSpans ?? [])
        for (const s of ss.spans ?? [])
          this.spans.push({
            service,
            traceId: s.traceId,
            spanId: s.spanId,
            parentSpanId: s.parentSpanId ?? "",
            name: s.name,
            kind: s.kind ?? 0,
            startNs: BigInt(s.startTimeUnixNano),
            endNs: BigInt(s.endTimeUnixNano),
            attributes: attributesOf(s.attributes),
            links: (s.links ?? []).map((l) => ({ traceId: l.traceId, spanId: l.spanId })),
            status: { code: s.status?.code ?? 0, message: s.status?.message ?? "" },
          });
    }
  }
}
