/**
 * The daemon's plain HTTP/1.1 endpoints beside the gRPC port (--http-listen):
 *
 *   GET /metrics   Prometheus text format, or OpenMetrics when the Accept header prefers it
 *   GET /healthz   200 while the process serves at all (a liveness probe)
 *   GET /readyz    200 when ready, 503 when not; a JSON body says which check failed (../observability/readiness.ts)
 *   POST /hooks/<tenant>/<trigger>   webhook triggers (../triggers/webhook.ts), authenticated by
 *                  their body's signature alone (neither the metrics token nor a certificate)
 *   GET /console/  the operators' web console, and POST /api/… the services it calls (./console.ts),
 *                  authenticated by bearer token as on the gRPC port
 *
 * Security, the same as the gRPC port's: with --tls-cert this is HTTPS with the same certificate,
 * reloaded with it. Who may read /metrics (which names tenants and agents):
 * - with --metrics-token, a caller that sends it as `Authorization: Bearer <token>`;
 * - under mutual TLS, also a caller whose verified client certificate is an ops identity
 *   (spiffe://<trust domain>/ops/<name>); a client certificate is asked for but not required, so
 *   probes (which present none) still reach /healthz and /readyz;
 * - with neither, anyone who reaches the port (the default port is on loopback).
 * The probes say only ready or not, and why in words that hold no address or secret.
 * With --metrics-listen, /metrics is served on a listener of its own (this same function, with no
 * console and no webhooks: the probes and /metrics alone), and the --http-listen port, which faces
 * the internet for webhooks, answers /metrics 404 saying where it is.
 *
 * What a connection may hold (`limits`), since this is the port that faces the internet: at most
 * `maxConnections` are open, and `maxConnectionsPerAddress` from one address; a connection past
 * either is closed on accept (nothing is evicted: every connection here is short-lived, below).
 * A request must arrive whole, headers and body, within `requestTimeoutMs` of its first byte, a
 * connection that sends nothing within it is closed too, and the check runs every quarter of it
 * (Node checks every 30 s by default, so half-written requests lived 25–40 s against a 10 s limit).
 * A connection closed for a timeout or a malformed request is answered and then destroyed, not just
 * ended, so a peer that never closes its side cannot keep it half-open.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { once } from "node:events";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import https from "node:https";
import type { AddressInfo, Socket } from "node:net";
import type { TLSSocket } from "node:tls";
import type { Registry } from "prom-client";
import { OPENMETRICS_CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE, render, wantsOpenMetrics } from "@aiflow/wire/metrics";
import { formatAddress } from "../config.js";
import { ConfigError } from "../domain/errors.js";
import type { Logger } from "../log.js";
import type { ReadinessReport } from "../observability/readiness.js";
import { readCertIdentity } from "./cert-identity.js";
import { ConnectionCaps, type CapLimits } from "./connection-caps.js";
import type { TlsReloader } from "./tls.js";

export interface HttpEndpointsOptions {
  host: string;
  port: number;
  /** The flag that named this address, for the errors that name it (default --http-listen). */
  flag?: string;
  /** Serve /metrics here (default true); false when another listener serves it (--metrics-listen). */
  metrics?: boolean;
  log: Logger;
  registry: Registry;
  readiness: () => Promise<ReadinessReport>;
  /** Required of /metrics callers as a bearer token. */
  metricsToken?: string;
  /** Serves /console/… and /api/…; absent: those paths are 404. */
  console?: { files: RouteHandler; api: RouteHandler };
  /** Serves POST /hooks/…; absent: those paths are 404. */
  webhooks?: RouteHandler;
  /** Serve HTTPS with the gRPC port's files (and join their reloads); `mutual`: ask for a client certificate. */
  tls?: { reloader: TlsReloader; mutual: boolean; trustDomain: string };
  /** What connections may hold (config/limits.ts documents each setting and its default). */
  limits?: HttpLimits;
}

export interface HttpLimits extends CapLimits {
  requestTimeoutMs: number;
}

export type RouteHandler = (req: IncomingMessage, res: ServerResponse, path: string) => Promise<void> | void;

export interface HttpEndpoints {
  readonly address: string;
  readonly port: number;
  readonly scheme: "https" | "http";
  close(): Promise<void>;
}

const DEFAULT_LIMITS: HttpLimits = { maxConnections: 1000, maxConnectionsPerAddress: 100, requestTimeoutMs: 10_000 };
const digest = (s: string) => createHash("sha256").update(s).digest();

export async function startHttpEndpoints(opts: HttpEndpointsOptions): Promise<HttpEndpoints> {
  const { log, tls } = opts;
  const limits = opts.limits ?? DEFAULT_LIMITS;
  const tokenDigest = opts.metricsToken ? digest(opts.metricsToken) : undefined;
  const mayReadMetrics = (req: IncomingMessage): boolean => {
    if (!tokenDigest && !tls?.mutual) return true;
    const auth = req.headers.authorization;
    if (tokenDigest && auth && /^bearer /i.test(auth) && timingSafeEqual(digest(auth.slice(7).trim()), tokenDigest)) return true;
    if (tls?.mutual) {
      const socket = req.socket as TLSSocket;
      if (socket.authorized) {
        const id = readCertIdentity(socket.getPeerCertificate().subjectaltname, tls.trustDomain);
        if (id && !("refused" in id) && id.role === "ops") return true;
      }
    }
    return false;
  };

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = (req.url ?? "/").split("?")[0]!;
    if (opts.webhooks && path.startsWith("/hooks/")) return opts.webhooks(req, res, path);
    if (opts.console && path.startsWith("/api/")) return opts.console.api(req, res, path);
    if (opts.console && (path === "/" || path === "/console")) {
      res.writeHead(302, { location: "/console/" });
      return void res.end();
    }
    if (opts.console && path.startsWith("/console/")) return opts.console.files(req, res, path);
    if (path === "/metrics" && opts.metrics === false) return reply(res, 404, "not found: /metrics is served on --metrics-listen, not on this port\n");
    if (path !== "/metrics" && path !== "/healthz" && path !== "/readyz")
      return reply(res, 404, `not found: this port serves ${opts.metrics === false ? "" : "/metrics, "}/healthz and /readyz\n`);
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.setHeader("allow", "GET, HEAD");
      return reply(res, 405, `method not allowed: GET ${path}\n`);
    }
    const head = req.method === "HEAD";
    if (path === "/healthz") return reply(res, 200, "ok\n", head);
    if (path === "/readyz") {
      const report = await opts.readiness();
      res.writeHead(report.ready ? 200 : 503, { "content-type": "application/json", "cache-control": "no-store" });
      return void res.end(head ? undefined : `${JSON.stringify({ status: report.ready ? "ready" : "not ready", checks: report.checks })}\n`);
    }
    if (!mayReadMetrics(req)) {
      const how = [tokenDigest ? "the metrics token as 'Authorization: Bearer <token>'" : "", tls?.mutual ? "an ops client certificate" : ""]
        .filter(Boolean)
        .join(" or ");
      res.setHeader("www-authenticate", 'Bearer realm="aiflowd metrics"');
      return reply(res, 401, `unauthenticated: /metrics needs ${how}\n`);
    }
    const openMetrics = wantsOpenMetrics(req.headers.accept);
    const body = await render(opts.registry, openMetrics);
    res.writeHead(200, { "content-type": openMetrics ? OPENMETRICS_CONTENT_TYPE : PROMETHEUS_CONTENT_TYPE, "cache-control": "no-store" });
    res.end(head ? undefined : body);
  };
  const onRequest = (req: IncomingMessage, res: ServerResponse) =>
    void handle(req, res).catch((err: unknown) => {
      log.error({ err, path: req.url }, "HTTP endpoint failed");
      if (!res.headersSent) reply(res, 500, "internal error (the daemon's log says why)\n");
      else res.destroy();
    });

  // headersTimeout and requestTimeout count from a request's first byte (a connection's first
  // request: from the connection), and hold only as often as Node checks them.
  const timeouts = {
    headersTimeout: limits.requestTimeoutMs,
    requestTimeout: limits.requestTimeoutMs,
    connectionsCheckingInterval: Math.min(1000, Math.max(10, Math.floor(limits.requestTimeoutMs / 4))),
  };
  const server = tls
    ? https.createServer(
        {
          ...tls.reloader.material,
          minVersion: "TLSv1.2",
          ALPNProtocols: ["http/1.1"],
          requestCert: tls.mutual,
          rejectUnauthorized: false,
          handshakeTimeout: limits.requestTimeoutMs,
          ...timeouts,
        },
        onRequest,
      )
    : http.createServer(timeouts, onRequest);
  if (tls)
    server.on("tlsClientError", (err: NodeJS.ErrnoException, socket: TLSSocket) =>
      log.debug({ remote: socket.remoteAddress, reason: err.code ?? err.message }, "TLS handshake failed on the HTTP port"),
    );
  server.on("clientError", (err: NodeJS.ErrnoException, socket: Socket) => {
    log.debug({ reason: err.code ?? err.message }, "bad HTTP request");
    if (!socket.writable) return void socket.destroy();
    const status = err.code === "ERR_HTTP_REQUEST_TIMEOUT" ? "408 Request Timeout" : "400 Bad Request";
    // Destroyed once the answer is written: end() alone leaves the socket open for as long as the
    // peer keeps its side open (an HTTP server's sockets allow half-open), which a hostile one does.
    socket.end(`HTTP/1.1 ${status}\r\nconnection: close\r\n\r\n`, () => socket.destroy());
  });
  capConnections(server, limits, log);

  server.listen(opts.port, opts.host);
  try {
    await once(server, "listening");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const where = `${opts.host}:${opts.port}`;
    throw new ConfigError(
      opts.flag ?? "--http-listen",
      code === "EADDRINUSE" ? `${where} is in use: give another port, or 'off'` : `cannot listen on ${where}: ${(err as Error).message}`,
    );
  }
  // Joins the gRPC port's reloads only once it serves, so a failed start leaves nothing attached.
  if (tls) tls.reloader.attach(server as https.Server);
  const port = (server.address() as AddressInfo).port;
  const address = formatAddress({ host: opts.host, port });

  let closing: Promise<void> | undefined;
  return {
    address,
    port,
    scheme: tls ? "https" : "http",
    close: () =>
      (closing ??= (async () => {
        const closed = once(server, "close");
        server.close();
        // A scraper's keep-alive connection would hold the port open otherwise.
        server.closeAllConnections();
        await closed;
      })()),
  };
}

/** Closes on accept a connection past `maxConnections`, or past `maxConnectionsPerAddress` from its address. */
function capConnections(server: http.Server, limits: HttpLimits, log: Logger): void {
  const caps = new ConnectionCaps(limits, log, {
    total: "--http-max-connections",
    perAddress: "--http-max-connections-per-address",
    connections: "HTTP connections",
  });
  server.on("connection", (socket: Socket) => {
    if (socket.destroyed) return;
    const address = socket.remoteAddress ?? "unknown";
    const over = caps.open(socket, address);
    if (!over) return;
    caps.overCap(over, address, "refusing new ones");
    socket.destroy();
  });
}

function reply(res: ServerResponse, status: number, text: string, head = false): void {
  res.writeHead(status, { "content-type": "text/plain; charset=utf-8", "cache-control": "no-store" });
  res.end(head ? undefined : text);
}
