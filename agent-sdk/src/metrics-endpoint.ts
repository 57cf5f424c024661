/**
 * The agent's `GET /metrics`, on a plain node:http server of its own (opt-in: `metricsPort`).
 * Each agent has a prom-client Registry of its own, never the global one, so two agents in one
 * process (or an application that uses the global registry) never collide. The process metrics
 * and the rendering are shared with the daemon's /metrics (@aiflow/wire/metrics, which says what
 * must stay true of them).
 */
import { once } from "node:events";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { Registry } from "prom-client";
import { OPENMETRICS_CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE, render, wantsOpenMetrics } from "@aiflow/wire/metrics";

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
      res.writeHead(200, { "content-type": openMetrics ? OPENMETRICS_CONTENT_TYPE : PROMETHEUS_CONTENT_TYPE });
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
