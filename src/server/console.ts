/**
 * The operators' web console on the HTTP port, and the API it speaks.
 *
 *   GET /console/…  the console's files, built at package time into dist/console (console/ holds
 *                   the source): read once at start, served from memory
 *   POST /api/<service>/<method>  the daemon's own services over the Connect protocol (JSON or
 *                   binary, HTTP/1.1), with the gRPC port's interceptors: the same authentication,
 *                   roles, tenant limits, validation and error codes. No second API.
 *
 * What must stay true:
 * - No authority travels in a cookie: a call carries `Authorization: Bearer`, which a page of
 *   another origin cannot make a browser send (no CORS headers are ever served). Under mutual TLS a
 *   browser's client certificate is ambient like a cookie, but the API takes only Connect's
 *   application/json and application/proto bodies, which another origin can send only after a CORS
 *   preflight that is never granted: there is no request to forge (CSRF).
 * - Every page is served with a Content-Security-Policy that allows only this origin's scripts,
 *   styles and calls: no inline script, no eval, no framing.
 * - Callers that fail to authenticate are counted per address as on the gRPC port; past
 *   --auth-failure-limit in a window an address is answered 429 until the window ends.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { extname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import type { AuthFailures } from "./auth-failures.js";

export const CONSOLE_PREFIX = "/console/";
export const API_PREFIX = "/api";

/** Where `npm run build` puts the console, from src/server or dist/server alike. */
export const DEFAULT_CONSOLE_DIR = fileURLToPath(new URL("../../dist/console/", import.meta.url));

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

/** The Connect API behind the per-address count of failed authentications (see the module's comment). */
export function guardedApi(api: (req: IncomingMessage, res: ServerResponse) => void, failures: AuthFailures): Handler {
  return (req, res) => {
    const address = req.socket.remoteAddress ?? "unknown";
    if (failures.throttled(address)) {
      res.writeHead(429, { "content-type": "application/json", "retry-after": "60" });
      return void res.end('{"code":"resource_exhausted","message":"too many failed authentications from this address; wait for --auth-failure-window to pass"}\n');
    }
    res.once("finish", () => {
      if (res.statusCode === 401) failures.record(address);
    });
    api(req, res);
  };
}
