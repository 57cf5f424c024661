/**
 * The agent's `GET /metrics`, on a plain node:http server of its own (opt-in: `metricsPort`).
 *
 * What must stay true:
 * - Each agent has a prom-client Registry of its own, never the global one, so two agents in one
 *   process (or an application that uses the global registry) never collide.
 * - prom-client's default process metrics are registered once per process, on a registry of their
 *   own that every agent's endpoint serves beside its own metrics: some of those collectors (the GC
 *   observer, the event-loop delay monitor) hold process-wide resources that are never released,
 *   so registering them per agent would leak one set for every agent ever created, and they
 *   describe the process, which the agents share.
 * - One render at a time, process-wide. prom-client renders OpenMetrics by renaming every counter
 *   in place (it strips `_total` from the metric object's name); a Prometheus-text render that ran
 *   meanwhile would print the stripped names. So renders are serialised and each OpenMetrics
 *   render puts the names back before the next begins.
 */
import { once } from "node:events";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { collectDefaultMetrics, Registry, type OpenMetricsContentType } from "prom-client";

let processRegistry: Registry | undefined;

/** The default process metrics, registered on first use. */
function processMetrics(): Registry {
  if (!processRegistry) {
    processRegistry = new Registry();
    collectDefaultMetrics({ register: processRegistry });
  }
  return processRegistry;
}

let rendering: Promise<unknown> = Promise.resolve();

/** The exposition of `registry` and the process metrics, in the format asked for; one render at a time. */
export function render(registry: Registry, openMetrics: boolean): Promise<string> {
  const next = rendering.then(async () => {
    const merged = Registry.merge([registry, processMetrics()]);
    if (!openMetrics) return merged.metrics();
    const names = merged.getMetricsAsArray().map((m) => [m, m.name] as const);
    (merged as unknown as Registry<OpenMetricsContentType>).setContentType(Registry.OPENMETRICS_CONTENT_TYPE);
    try {
      return await merged.metrics();
    } finally {
      for (const [m, name] of names) m.name = name;
    }
  });
  rendering = next.catch(() => undefined);
  return next;
}

/**
 * True when the Accept header prefers OpenMetrics to the Prometheus text format (as Prometheus
 * asks: `application/openmetrics-text;version=1.0.0,…,text/plain;version=0.0.4;q=0.5,*\/*;q=0.1`).
 */
export function wantsOpenMetrics(accept: string | undefined): boolean {
  if (!accept) return false;
  let om = 0;
  let text = 0;
  for (const part of accept.split(",")) {
    const [type = "", ...params] = part.split(";").map((s) => s.trim().toLowerCase());
    const qParam = params.find((p) => p.startsWith("q="));
    const q = qParam ? Number(qParam.slice(2)) : 1;
    if (!Number.isFinite(q)) continue;
    if (type === "application/openmetrics-text") om = Math.max(om, q);
    else if (type === "text/plain") text = Math.max(text, q);
  }
  return om > 0 && om >= text;
}

/** Serves `GET /metrics` of one agent's registry. */
export class MetricsEndpoint {
  readonly #server: Server;
  #address: string | undefined;
  #listening: Promise<void> | undefined;
  #closing: Promise<void> | undefined;

  constructor(private readonly registry: Registry) {
    this.#server = createServer((req, res) => void this.#handle(req, res));
  }

  /** `host:port` once listening (the port the system chose when 0 was asked). */
  get address(): string | undefined {
    return this.#address;
  }

  /** Listens; rejects with the listen error (EADDRINUSE for a port in use). */
  listen(host: string, port: number): Promise<void> {
    this.#server.listen(port, host);
    this.#listening = once(this.#server, "listening").then(() => {
      const a = this.#server.address() as AddressInfo;
      this.#address = a.family === "IPv6" ? `[${a.address}]:${a.port}` : `${a.address}:${a.port}`;
    });
    return this.#listening;
  }

  /**
   * Stops listening and ends open connections (a scraper's keep-alive would hold the port
   * otherwise). A listen still under way is waited for first, so that it cannot open the port
   * after this returned.
   */
  close(): Promise<void> {
    return (this.#closing ??= this.#close());
  }

  async #close(): Promise<void> {
    await this.#listening?.catch(() => undefined);
    if (!this.#server.listening) return;
    const closed = once(this.#server, "close");
    this.#server.close();
    this.#server.closeAllConnections();
    await closed;
  }

  async #handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? "").split("?")[0];
    if (path !== "/metrics") return reply(res, 404, "not found: the metrics are at /metrics\n");
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.setHeader("allow", "GET, HEAD");
      return reply(res, 405, "method not allowed: GET /metrics\n");
    }
    const openMetrics = wantsOpenMetrics(req.headers.accept);
    try {
      const body = await render(this.registry, openMetrics);
      res.writeHead(200, { "content-type": openMetrics ? Registry.OPENMETRICS_CONTENT_TYPE : Registry.PROMETHEUS_CONTENT_TYPE });
      res.end(req.method === "HEAD" ? undefined : body);
    } catch (err) {
      reply(res, 500, `metrics could not be collected: ${err instanceof Error ? err.message : String(err)}\n`);
    }
  }
}

function reply(res: ServerResponse, status: number, text: string): void {
  res.writeHead(status, { "content-type": "text/plain; charset=utf-8" });
  res.end(text);
}
