/**
 * The daemon's documented metrics (docs/observability.md, Metrics) and a scrape of its /metrics over real HTTP,
 * read with a Prometheus text-format parser.
 *
 * The parser (parse-prometheus-text-format, the prom2json shape) checks the exposition's
 * structure and gives families and types; it drops the `_sum` and `_count` lines of a labelled
 * histogram, so histogram samples are read from their exact series lines (`series()`).
 */
import { request as httpRequest } from "node:http";
import { request as httpsRequest, type RequestOptions } from "node:https";
import parsePrometheusTextFormat, { type MetricFamily } from "parse-prometheus-text-format";

/** Each daemon metric and its labels. Prometheus adds `instance` and `job`; histograms add `le` to their buckets. */
export const DAEMON_METRICS: Record<string, readonly string[]> = {
  grpc_server_started_total: ["grpc_type", "grpc_service", "grpc_method"],
  grpc_server_handled_total: ["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
  grpc_server_handling_seconds: ["grpc_type", "grpc_service", "grpc_method"],
  grpc_server_in_flight_calls: ["grpc_service", "grpc_method"],
  aiflow_queue_items: ["tenant", "engine_kind", "status"],
  aiflow_queue_oldest_due_pending_age_seconds: ["tenant", "engine_kind"],
  aiflow_queue_dispatch_wait_seconds: ["tenant", "engine_kind"],
  aiflow_queue_run_seconds: ["engine_kind", "outcome"],
  aiflow_queue_retries_total: ["engine_kind"],
  aiflow_queue_dead_letters_total: ["engine_kind"],
  aiflow_queue_redeliveries_total: [],
  aiflow_queue_lease_expiries_total: [],
  aiflow_queue_refused_completions_total: [],
  aiflow_queue_direct_dispatches_total: [],
  aiflow_queue_empty_claims_total: [],
  aiflow_queue_rate_limited_claims_total: [],
  aiflow_agents: ["status"],
  aiflow_agent_cpu_utilization_ratio: ["agent"],
  aiflow_agent_memory_used_bytes: ["agent"],
  aiflow_agent_memory_total_bytes: ["agent"],
  aiflow_agent_gpu_utilization_ratio: ["agent", "gpu"],
  aiflow_agent_gpu_memory_used_bytes: ["agent", "gpu"],
  aiflow_agent_gpu_memory_total_bytes: ["agent", "gpu"],
  aiflow_agent_in_flight_items: ["agent"],
  aiflow_agent_drain_remaining_items: ["agent"],
  aiflow_agents_unlisted: [],
  aiflow_agent_streams: [],
  aiflow_agent_stream_ends_total: ["how"],
  aiflow_engine_step_seconds: ["engine", "kind"],
  aiflow_engine_events_total: ["engine"],
  aiflow_engine_items_queued_total: ["engine"],
  aiflow_engine_runs_ended_total: ["engine", "status"],
  aiflow_trigger_firings_total: ["type", "outcome"],
  aiflow_webhook_refusals_total: ["reason", "recorded"],
  aiflow_db_pool_connections: ["pool", "state"],
  aiflow_heartbeat_flush_rows: [],
  aiflow_heartbeat_flush_seconds: [],
  aiflow_listen_reconnects_total: [],
  aiflow_server_refused_total: ["reason"],
};

export interface HttpAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  text: string;
}

/** A GET (or HEAD) over HTTP, or HTTPS when the URL says so (`tls` gives the CA and a client certificate). */
export function httpGet(
  url: string,
  opts: { headers?: Record<string, string>; method?: string; tls?: Pick<RequestOptions, "ca" | "cert" | "key"> } = {},
): Promise<HttpAnswer> {
  const request = url.startsWith("https:") ? httpsRequest : httpRequest;
  return new Promise((resolve, reject) => {
    const req = request(url, { method: opts.method ?? "GET", headers: opts.headers, ...(opts.tls ?? {}) }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (text += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end();
  });
}

/** One scrape's exposition: its families (from the parser) and its series lines. */
export class Exposition {
  readonly families: MetricFamily[];
  readonly #lines: { series: string; labels: Record<string, string>; value: number }[];

  constructor(readonly text: string) {
    this.families = parsePrometheusTextFormat(text);
    this.#lines = text
      .split("\n")
      .filter((l) => l !== "" && !l.startsWith("#"))
      .map((l) => {
        const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(l);
        if (!m) throw new Error(`not an exposition line: ${l}`);
        const labels = Object.fromEntries([...(m[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)].map((p) => [p[1]!, p[2]!]));
        return { series: m[1]!, labels, value: Number(m[3]) };
      });
  }

  family(name: string): MetricFamily | undefined {
    return this.families.find((f) => f.name === name);
  }

  /** The sum of the samples of `series` (a name as written, `_bucket`, `_count` included) whose labels include `labels`; 0 when none. */
  series(series: string, labels: Record<string, string> = {}): number {
    return this.#lines.filter((l) => l.series === series && Object.entries(labels).every(([k, v]) => l.labels[k] === v)).reduce((n, l) => n + l.value, 0);
  }

  /** Whether any sample of `series` has these labels. */
  has(series: string, labels: Record<string, string> = {}): boolean {
    return this.#lines.some((l) => l.series === series && Object.entries(labels).every(([k, v]) => l.labels[k] === v));
  }

  /** The label sets of the samples of `series`. */
  labelSets(series: string): Record<string, string>[] {
    return this.#lines.filter((l) => l.series === series).map((l) => l.labels);
  }
}

/** Scrapes `<base>/metrics` and checks the answer is the Prometheus text format. */
export async function scrapeMetrics(base: string, opts: Parameters<typeof httpGet>[1] = {}): Promise<Exposition> {
  const r = await httpGet(`${base}/metrics`, opts);
  if (r.status !== 200) throw new Error(`/metrics answered ${r.status}: ${r.text}`);
  if (r.headers["content-type"] !== "text/plain; version=0.0.4; charset=utf-8") throw new Error(`/metrics answered ${String(r.headers["content-type"])}`);
  return new Exposition(r.text);
}
