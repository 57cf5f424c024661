/**
 * The operators' web console on the HTTP port, and the API it speaks.
 *
 *   GET /console/…  the console's files, built at package time into dist/console (console/ holds
 *                   the source): read once at start, served from memory
 *   POST /api/<service>/<method>  the daemon's own services over the Connect protocol (JSON or
 *                   binary, HTTP/1.1), with the gRPC port's handler, interceptors and gate: the same
 *                   authentication, limits, roles, tenant limits, validation and error codes. No
 *                   second API (consoleApi below).
 *
 * What must stay true:
 * - No authority travels in a cookie: a call carries `Authorization: Bearer`, which a page of
 *   another origin cannot make a browser send (no CORS headers are ever served). Under mutual TLS a
 *   browser's client certificate is ambient like a cookie, but the API takes only Connect's
 *   application/json and application/proto bodies, which another origin can send only after a CORS
 *   preflight that is never granted: there is no request to forge (CSRF).
 * - Every page is served with a Content-Security-Policy that allows only this origin's scripts,
 *   styles and calls: no inline script, no eval, no framing.
 * - Callers that fail to authenticate are counted per address with the gRPC port's (one count for
 *   both ports); past --auth-failure-limit in a window an address's failing calls are answered 429
 *   until the window ends, and its calls with valid credentials are served.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { extname, join, relative } from "node:path";
import { Code, ConnectError, createContextValues, type ConnectRouter, type Interceptor } from "@connectrpc/connect";
import { connectHandler, type ErrorLog } from "@aiflow/wire/server";
import { peerKey } from "./auth.js";
import type { CertReading } from "./cert-identity.js";
import type { Gate } from "./gate.js";
import { limitWatchLifetime } from "./health.js";
import { refusalOf } from "./refuse.js";

export const CONSOLE_PREFIX = "/console/";
export const API_PREFIX = "/api";

const CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "font-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join("; ");

const SECURITY_HEADERS = {
  "content-security-policy": CSP,
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "x-frame-options": "DENY",
  "cross-origin-opener-policy": "same-origin",
};

const TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".json": "application/json",
  ".ico": "image/x-icon",
  ".png": "image/png",
  ".woff2": "font/woff2",
};

type Handler = (req: IncomingMessage, res: ServerResponse, path: string) => Promise<void> | void;

/**
 * Serves the console's files from `dir`, read now. Without a build there (a checkout before
 * `npm run build`), /console/ answers 503 saying so, and `built` is false.
 */
export function consoleFiles(dir: string): { handler: Handler; built: boolean } {
  const files = new Map<string, { body: Buffer; type: string }>();
  if (existsSync(join(dir, "index.html"))) {
    const walk = (d: string) => {
      for (const name of readdirSync(d)) {
        const p = join(d, name);
        if (statSync(p).isDirectory()) walk(p);
        else files.set(relative(dir, p).split("\\").join("/"), { body: readFileSync(p), type: TYPES[extname(p)] ?? "application/octet-stream" });
      }
    };
    walk(dir);
  }
  const handler: Handler = (req, res, path) => {
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.writeHead(405, { allow: "GET, HEAD", "content-type": "text/plain; charset=utf-8" });
      return void res.end(`method not allowed: GET ${path}\n`);
    }
    if (files.size === 0) {
      res.writeHead(503, { "content-type": "text/plain; charset=utf-8", "cache-control": "no-store" });
      return void res.end("the console is not built: run `npm run build`\n");
    }
    const rel = path.slice(CONSOLE_PREFIX.length);
    // Hashed assets never change; any other path is the app (its router reads the hash).
    const asset = rel.startsWith("assets/") ? files.get(rel) : undefined;
    const file = asset ?? (rel === "" || !rel.includes(".") ? files.get("index.html") : files.get(rel));
    if (!file) {
      res.writeHead(404, { "content-type": "text/plain; charset=utf-8", ...SECURITY_HEADERS });
      return void res.end("not found\n");
    }
    res.writeHead(200, {
      "content-type": file.type,
      "content-length": file.body.length,
      "cache-control": asset ? "public, max-age=31536000, immutable" : "no-store",
      ...SECURITY_HEADERS,
    });
    res.end(req.method === "HEAD" ? undefined : file.body);
  };
  return { handler, built: files.size > 0 };
}

export interface ConsoleApiOptions {
  /** The gRPC port's routes and interceptors: the same API, not a second one. */
  routes: (router: ConnectRouter) => void;
  interceptors: Interceptor[];
  /** Largest request body accepted: the gRPC port's message limit. */
  readMaxBytes: number;
  /** Aborted when shutdown begins: long calls end early. */
  shutdownSignal: AbortSignal;
  /** The gRPC port's gate: its checks, and the same failure counts, byte budget and Health.Watch caps. */
  gate: Gate;
  /** --health-watch-lifetime, as on the gRPC port. */
  healthWatchLifetimeMs: number;
  /** Under mutual TLS: what a request's client certificate says. */
  peer?: (req: IncomingMessage) => CertReading;
  log: ErrorLog;
}

/**
 * /api: the gRPC port's Connect handler (wire's connectHandler) over HTTP/1.1, behind the gRPC
 * port's gate (./gate.ts). What must stay true, as on the gRPC port:
 * - a call is checked on its request headers, credentials first, before a byte of its body is read:
 *   no token, an unknown one or one of the wrong role is answered there (401/403, or the error as a
 *   stream's end-stream message), and an address past --auth-failure-limit has its failing calls
 *   answered 429 while calls with valid credentials from it are served;
 * - a body is held to the message limit and to the daemon-wide --max-inflight-bytes on its declared
 *   length (a chunked one: on the message limit, the most it may be), until its response closes;
 * - a refused request's connection is closed, not drained, and so is any whose response ends before
 *   its body was read (a 404, connect's own refusals): Node would read the rest of a keep-alive
 *   request's body to reach the next request, and the body is what a refusal must not cost;
 * - a deadline past what a timer holds runs as none, a call the handler cannot answer is answered
 *   INTERNAL, and Health.Watch ends after --health-watch-lifetime (connectHandler and the routes).
 * The body's deadline here is the HTTP port's request timeout (./http-endpoints.ts).
 */
export function consoleApi(o: ConsoleApiOptions): Handler {
  const api = connectHandler({
    routes: limitWatchLifetime(o.routes, o.healthWatchLifetimeMs),
    interceptors: o.interceptors,
    requestPathPrefix: API_PREFIX,
    // What a browser speaks.
    connect: true,
    grpc: false,
    grpcWeb: false,
    readMaxBytes: o.readMaxBytes,
    shutdownSignal: o.shutdownSignal,
    log: o.log,
  });
  return (req, res, path) => {
    const socket = req.socket;
    res.once("finish", () => {
      if (!req.complete) closeUnread(req, socket);
    });
    const peer = o.peer?.(req);
    const error =
      o.gate.admit({
        address: req.socket.remoteAddress ?? "unknown",
        path: path.slice(API_PREFIX.length),
        authorization: req.headers.authorization,
        peer,
        onEnd: (release) => res.once("close", release),
      }) ?? holdBody(req, res, o);
    if (error) return refuseHttp1(req, res, error);
    // Under mutual TLS the browser's certificate names a caller here as it does on the gRPC port.
    api(req, res, o.peer ? createContextValues().set(peerKey, peer) : undefined);
  };
}

/** Holds the body to the message limit and the gate's budget; the refusal, or undefined (released when the response closes). */
function holdBody(req: IncomingMessage, res: ServerResponse, o: ConsoleApiOptions): ConnectError | undefined {
  const length = req.headers["content-length"];
  const declared = length === undefined ? undefined : Number(length);
  if (declared !== undefined && declared > o.readMaxBytes)
    return new ConnectError(`the request body is ${declared} bytes; the limit is ${o.readMaxBytes}`, Code.ResourceExhausted);
  // HTTP/1.1: a body has a declared length or is chunked (transfer-encoding); with neither, none.
  const bytes = declared ?? (req.headers["transfer-encoding"] === undefined ? 0 : o.readMaxBytes);
  if (bytes === 0) return undefined;
  const refused = o.gate.hold(bytes);
  if (!refused) res.once("close", () => o.gate.budget.release(bytes));
  return refused;
}

/** How long a connection whose request body went unread is held, half-closed, before it is destroyed. */
const LINGER_MS = 1000;

/**
 * Ends the connection of an answered request whose body was not read, reading no more of it (Node
 * would read on to the body's end, keep-alive or not). Destroyed at once with body bytes still
 * arriving, the close would be a TCP reset, which can reach the client before it has read the
 * answer (a few in a hundred Node clients that kept sending lost their 401 so): the answer is
 * followed by a FIN instead, the socket destroyed LINGER_MS later, and what arrives meanwhile is
 * left unread.
 */
function closeUnread(req: IncomingMessage, socket: Socket): void {
  // Node's `connection: close` handling destroys the socket once its end is written: that reset.
  socket.off("finish", socket.destroy);
  // Node's drain of an unread body (req._dump) resumes the request: paused, it reads at most a
  // buffer's worth more before reading stops.
  req.pause();
  socket.end();
  const timer = setTimeout(() => socket.destroy(), LINGER_MS);
  timer.unref();
  socket.once("close", () => clearTimeout(timer));
}

/** Answers in the caller's protocol (refuse.ts), and closes the connection: the body stays unread. */
function refuseHttp1(req: IncomingMessage, res: ServerResponse, err: ConnectError): void {
  const r = refusalOf(String(req.headers["content-type"] ?? ""), err);
  const body = r.body ?? Buffer.alloc(0);
  res.writeHead(r.status, { ...r.headers, "content-length": body.length, connection: "close" });
  res.end(body);
}
