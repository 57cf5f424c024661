/**
 * What `--observability` runs the steady section with: traces exported by the daemons and the agents
 * to a local OTLP/HTTP collector stub (it takes every export and drops it, as a collector that keeps
 * up does), and each daemon's /metrics scraped every second, as Prometheus would. The stub and the
 * scraper count what they saw, so a run that exported or scraped nothing says so in its figures.
 */
import { once } from "node:events";
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface CollectorStub {
  /** The traces endpoint, for OTEL_EXPORTER_OTLP_TRACES_ENDPOINT. */
  readonly endpoint: string;
  /** Export requests taken, and their body bytes. */
  readonly requests: number;
  readonly bytes: number;
  close(): Promise<void>;
}

export async function startCollectorStub(): Promise<CollectorStub> {
  let requests = 0;
  let bytes = 0;
  const server = http.createServer((req, res) => {
    req.on("data", (c: Buffer) => (bytes += c.length));
    req.on("end", () => {
      requests++;
      // An empty ExportTraceServiceResponse is an empty body in protobuf.
      res.writeHead(200, { "content-type": "application/x-protobuf" }).end();
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    endpoint: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/traces`,
    get requests() {
      return requests;
    },
    get bytes() {
      return bytes;
    },
    close: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

/** The environment that turns a child's traces on, exporting OTLP/protobuf (the default protocol) to the stub. */
export const tracingEnv = (stub: CollectorStub): Record<string, string> => ({
  OTEL_TRACES_EXPORTER: "otlp",
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: stub.endpoint,
});

export interface ScrapeFigures {
  scrapes_ok: number;
  scrapes_failed: number;
  scrape_kb: number;
}

/** GETs every URL once a second (a scrape still out is not sent again) until stopped. */
export function scrapeEverySecond(urls: readonly string[]): { stop(): ScrapeFigures } {
  const figures: ScrapeFigures = { scrapes_ok: 0, scrapes_failed: 0, scrape_kb: 0 };
  const out = new Set<string>();
  const scrape = (url: string) => {
    if (out.has(url)) return;
    out.add(url);
    const req = http.get(url, { timeout: 5_000 }, (res) => {
      let n = 0;
      res.on("data", (c: Buffer) => (n += c.length));
      res.on("end", () => {
        out.delete(url);
        if (res.statusCode === 200) {
          figures.scrapes_ok++;
          figures.scrape_kb += n / 1024;
        } else figures.scrapes_failed++;
      });
    });
    req.on("timeout", () => req.destroy(new Error("timed out")));
    req.on("error", () => {
      out.delete(url);
      figures.scrapes_failed++;
    });
  };
  const timer = setInterval(() => urls.forEach(scrape), 1_000);
  return {
    stop: () => {
      clearInterval(timer);
      return { ...figures, scrape_kb: Math.round(figures.scrape_kb) };
    },
  };
}
