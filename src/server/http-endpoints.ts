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
import type { TlsReloader } from "./tls.js";

export interface HttpEndpointsOptions {
  host: string;
  port: number;
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
}

export type RouteHandler = (req: IncomingMessage, res: ServerResponse, path: string) => Promise<void> | void;

export interface HttpEndpoints {
  readonly address: string;
  readonly port: number;
  readonly scheme: "https" | "http";
  close(): Promise<void>;
}

/** Headers and a slow body get this long: the endpoints answer small GETs. */
const REQUEST_TIMEOUT_MS = 10_000;
const digest = (s: string) => createHash("sha256").update(s).digest();

export async function startHttpEndpoints(opts: HttpEndpointsOptions): Promise<HttpEndpoints> {
  const { log, tls } = opts;
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
    if (path !== "/metrics" && path !== "/healthz" && path !== "/readyz") return reply(res, 404, "not found: this port serves /metrics, /healthz and /readyz\n");
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
      const how = [tokenDigest ? "the metrics token as 'Authorization: Bearer <token>'" : "", tls?.mutual ? "an ops client certificate" : ""].filter(Boolean).join(" or ");
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

  const server = tls
    ? https.createServer(
        { ...tls.reloader.material, minVersion: "TLSv1.2", ALPNProtocols: ["http/1.1"], requestCert: tls.mutual, rejectUnauthorized: false, handshakeTimeout: REQUEST_TIMEOUT_MS },
        onRequest,
      )
    : http.createServer(onRequest);
  server.requestTimeout = REQUEST_TIMEOUT_MS;
  server.headersTimeout = REQUEST_TIMEOUT_MS;
  if (tls) server.on("tlsClientError", (err: NodeJS.ErrnoException, socket: TLSSocket) => log.debug({ remote: socket.remoteAddress, reason: err.code ?? err.message }, "TLS handshake failed on the HTTP port"));
  server.on("clientError", (err: NodeJS.ErrnoException, socket: Socket) => {
    log.debug({ reason: err.code ?? err.message }, "bad HTTP request");
    if (socket.writable) socket.end("HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n");
    else socket.destroy();
  });

  server.listen(opts.port, opts.host);
  try {
    await once(server, "listening");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const where = `${opts.host}:${opts.port}`;
    throw new ConfigError("--http-listen", code === "EADDRINUSE" ? `${where} is in use: give another port, or 'off'` : `cannot listen on ${where}: ${(err as Error).message}`);
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

function reply(res: ServerResponse, status: number, text: string, head = false): void {
  res.writeHead(status, { "content-type": "text/plain; charset=utf-8", "cache-control": "no-store" });
  res.end(head ? undefined : text);
}
