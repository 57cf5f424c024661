/**
 * The HTTP/2 (h2c) server carrying gRPC, gRPC-Web and Connect. Shutdown is graceful: stop accepting,
 * tell clients to go away (GOAWAY), let calls in flight finish within the grace period, then cut
 * whatever remains. Long-polls watch `draining` so they return early instead of holding shutdown.
 */
import { setMaxListeners } from "node:events";
import http2 from "node:http2";
import type { AddressInfo, Socket } from "node:net";
import type { ConnectRouter, Interceptor } from "@connectrpc/connect";
import { connectHandler, grpcUnaryFastPath, recordUnary, routeStreams, type UnarySpec } from "@aiflow/wire/server";
import type { Access, Authenticator } from "./auth.js";
import { createGate, type GateLimits } from "./gate.js";
import { limitWatchLifetime } from "./health.js";
import { guardSessions, http2ServerOptions, type Http2Limits } from "./http2-limits.js";
import { newServerStats, type ServerStats } from "./stats.js";
import type { Clock } from "../clock.js";
import type { Logger } from "../log.js";

/** Every limit the server holds callers to (config.ts documents each setting and its default). */
export interface ServerLimits extends Http2Limits, GateLimits {
  healthWatchLifetimeMs: number;
}

export interface ServerOptions {
  host: string;
  port: number;
  routes: (router: ConnectRouter) => void;
  interceptors: Interceptor[];
  log: Logger;
  /** Largest message accepted, in bytes. */
  readMaxBytes?: number;
  /** The authenticator and access map the interceptor uses: calls are refused on their headers too. */
  auth: { authenticator: Authenticator; access: ReadonlyMap<string, Access> };
  limits: ServerLimits;
  /** Times the failed-authentication windows. */
  clock: Clock;
  /** Serve plain gRPC unary calls straight from the stream (wire/src/server/unary-fast-path.ts); false: connect-node serves all. */
  fastPath?: boolean;
}

export interface RunningServer {
  /** host:port actually bound (port 0 resolves to the real port). */
  readonly address: string;
  readonly port: number;
  /** Aborted when shutdown begins: long-polls and streams should finish early. */
  readonly draining: AbortSignal;
  /** What the server refused or cut, by cause. */
  readonly stats: ServerStats;
  /** Graceful shutdown; resolves once every session is closed. */
  close(graceMs: number): Promise<void>;
}

export async function startServer(opts: ServerOptions): Promise<RunningServer> {
  const drain = new AbortController();
  const hardStop = new AbortController();
  // Every call in flight links its own signal to these (connect's handler context, long-polls), so
  // a busy daemon has hundreds of listeners on them: not a leak, and Node's warning at 11 is noise.
  setMaxListeners(0, drain.signal, hardStop.signal);
  const unary = new Map<string, UnarySpec>();
  const handler = connectHandler({
    routes: recordUnary(limitWatchLifetime(opts.routes, opts.limits.healthWatchLifetimeMs), unary),
    interceptors: opts.interceptors,
    grpc: true,
    grpcWeb: true,
    connect: true,
    shutdownSignal: hardStop.signal,
    readMaxBytes: opts.readMaxBytes ?? 8 * 1024 * 1024,
    // Agents and daemons sit on fast networks: gzip costs more CPU than it saves below this size.
    compressMinBytes: 64 * 1024,
    log: opts.log,
  });
  const readMaxBytes = opts.readMaxBytes ?? 8 * 1024 * 1024;
  const stats = newServerStats();
  const { limits } = opts;
  const gate = createGate({ ...limits, auth: opts.auth.authenticator, access: opts.auth.access, log: opts.log, clock: opts.clock, stats });
  const fast = grpcUnaryFastPath(unary, { interceptors: opts.interceptors, readMaxBytes, shutdownSignal: hardStop.signal, budget: gate.budget, log: opts.log });
  const server = http2.createServer(http2ServerOptions(limits));
  // The gate answers refused calls before either path reads their bodies; the direct path holds its
  // bodies to the gate's budget itself, connect-node's are watched by the gate.
  const direct = opts.fastPath === false ? () => false : fast;
  routeStreams(server, (stream, headers) => gate(stream, headers) || direct(stream, headers) || gate.body(stream, headers), handler);
  const guard = guardSessions(server, limits, opts.log, stats);
  // RPCs are small request/response exchanges: without TCP_NODELAY, Nagle's algorithm holds a reply
  // back until the peer's delayed ACK (tens of milliseconds per call).
  server.on("connection", (socket: Socket) => socket.setNoDelay(true));
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (s) => {
    sessions.add(s);
    s.on("close", () => sessions.delete(s));
    // A session error is a client's problem (a reset, a bad frame); it must never take the daemon down.
    s.on("error", (err) => opts.log.debug({ err: err.message }, "http2 session error"));
  });
  server.on("sessionError", (err) => opts.log.debug({ err: err.message }, "http2 session error"));

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port, opts.host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const address = opts.host.includes(":") ? `[${opts.host}]:${port}` : `${opts.host}:${port}`;

  let closing: Promise<void> | undefined;
  const close = (graceMs: number) =>
    (closing ??= (async () => {
      drain.abort();
      const closed = new Promise<void>((r) => server.close(() => r()));
      for (const s of sessions) s.close();
      const timer = setTimeout(() => {
        if (sessions.size > 0) opts.log.warn({ sessions: sessions.size }, "grace period over, cancelling calls still in flight");
        hardStop.abort();
        for (const s of sessions) s.destroy();
      }, graceMs);
      await closed;
      clearTimeout(timer);
      guard.stop();
    })());

  return { address, port, draining: drain.signal, stats, close };
}
