/**
 * The HTTP/2 server carrying gRPC, gRPC-Web and Connect: over TLS (./tls.ts, mutual with a client CA)
 * or h2c. Shutdown is graceful: stop accepting,
 * tell clients to go away (GOAWAY), let calls in flight finish within the grace period, then cut
 * whatever remains. Long-polls watch `draining` so they return early instead of holding shutdown.
 */
import { setMaxListeners } from "node:events";
import http2 from "node:http2";
import type { AddressInfo, Socket } from "node:net";
import type { TLSSocket } from "node:tls";
import type { ConnectRouter, Interceptor } from "@connectrpc/connect";
import { createContextValues, type ContextValues } from "@connectrpc/connect";
import { connectHandler, grpcBidiFastPath, grpcUnaryFastPath, recordUnary, routeStreams, type RecordedStreams, type UnarySpec } from "@aiflow/wire/server";
import { peerKey, type Access, type Authenticator } from "./auth.js";
import { PeerIdentities } from "./cert-identity.js";
import { createGate, type Gate, type GateLimits } from "./gate.js";
import { limitWatchLifetime } from "./health.js";
import { guardSessions, http2ServerOptions, type Http2Limits } from "./http2-limits.js";
import { newServerStats, type ServerStats } from "./stats.js";
import { readTlsFiles, secureServerOptions, TlsReloader, type ReloadOutcome, type TlsFiles } from "./tls.js";
import type { Clock } from "../clock.js";
import { formatAddress } from "../config.js";
import type { Logger } from "../log.js";

/** Every limit the server holds callers to (config/limits.ts documents each setting and its default). */
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
  /** Serve plain gRPC unary calls and bidi streams straight from the stream (wire/src/server/unary-fast-path.ts, bidi-fast-path.ts); false: connect-node serves all. */
  fastPath?: boolean;
  /** TLS (mutual with `files.clientCa`); absent: h2c. */
  tls?: { files: TlsFiles; trustDomain: string };
}

export interface RunningServer {
  /** host:port actually bound (port 0 resolves to the real port). */
  readonly address: string;
  readonly port: number;
  /** Aborted when shutdown begins: long-polls and streams should finish early. */
  readonly draining: AbortSignal;
  /** What the server refused or cut, by cause. */
  readonly stats: ServerStats;
  /** "https" over TLS, "http" for h2c. */
  readonly scheme: "https" | "http";
  /** Re-reads the TLS files (SIGHUP); "unchanged" for h2c. */
  reloadTls(): ReloadOutcome;
  /** The TLS files' reloader, for another server of the same files to join (undefined for h2c). */
  readonly tls: TlsReloader | undefined;
  /** The checks every call passes on its headers, for another port of the same API to pass too (/api). */
  readonly gate: Gate;
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
  const streams: RecordedStreams = { bidi: new Map(), streamingRequests: new Set() };
  const readMaxBytes = opts.readMaxBytes ?? 8 * 1024 * 1024;
  const stats = newServerStats();
  const { limits } = opts;
  // Under mutual TLS each call carries what its connection's certificate says (both paths).
  const peers = opts.tls?.files.clientCa ? new PeerIdentities(opts.tls.trustDomain) : undefined;
  const contextValues = peers
    ? (stream: http2.ServerHttp2Stream): ContextValues => {
        const values = createContextValues();
        values.set(peerKey, peers.of(stream.session));
        return values;
      }
    : undefined;
  const handler = connectHandler({
    routes: recordUnary(limitWatchLifetime(opts.routes, opts.limits.healthWatchLifetimeMs), unary, streams),
    interceptors: opts.interceptors,
    grpc: true,
    grpcWeb: true,
    connect: true,
    shutdownSignal: hardStop.signal,
    readMaxBytes,
    // Agents and daemons sit on fast networks: gzip costs more CPU than it saves below this size.
    compressMinBytes: 64 * 1024,
    log: opts.log,
    contextValues,
  });
  const gate = createGate({
    ...limits,
    auth: opts.auth.authenticator,
    access: opts.auth.access,
    log: opts.log,
    clock: opts.clock,
    stats,
    peers,
    streamingRequests: streams.streamingRequests,
    // Called for calls only, so after `guard` below exists.
    authenticated: (session) => guard.authenticated(session),
  });
  const fastOptions = { interceptors: opts.interceptors, readMaxBytes, shutdownSignal: hardStop.signal, budget: gate.budget, log: opts.log, contextValues };
  const fastUnary = grpcUnaryFastPath(unary, fastOptions);
  const fastBidi = grpcBidiFastPath(streams.bidi, fastOptions);
  const fast = (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders) => fastUnary(stream, headers) || fastBidi(stream, headers);
  const material = opts.tls ? readTlsFiles(opts.tls.files) : undefined;
  const server = material
    ? http2.createSecureServer({ ...http2ServerOptions(limits), ...secureServerOptions(material, peers !== undefined, limits.prefaceTimeoutMs) })
    : http2.createServer(http2ServerOptions(limits));
  const reloader = material ? new TlsReloader(server as http2.Http2SecureServer, opts.tls!.files, material, opts.log) : undefined;
  if (material) watchHandshakes(server as http2.Http2SecureServer, peers !== undefined, gate, opts.log, stats);
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
  const address = formatAddress({ host: opts.host, port });

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
      reloader?.stop();
    })());

  const scheme = material ? "https" : "http";
  return { address, port, draining: drain.signal, stats, scheme, reloadTls: () => reloader?.reload() ?? "unchanged", tls: reloader, gate, close };
}

/** How long a refused TLS client is given to take the close before its socket is destroyed. */
const REFUSED_CLOSE_MS = 1000;

/**
 * TLS handshakes. Under mutual TLS a client whose certificate did not verify (none, expired, another
 * CA's) is a failed authentication: its connection is closed as its handshake ends, before HTTP/2
 * sees a byte of it, and it is logged with the address and the reason, and counted toward
 * --auth-failure-limit. An address over that limit still completes handshakes: a connection cannot
 * be told from its address alone to come from the guesser rather than a valid caller beside it (a
 * NAT, a proxy), and the gate throttles failures, not callers (./gate.ts). (Node's own
 * rejectUnauthorized closes such a socket without saying why or from where, so the check is made
 * here: HTTP/2's 'secureConnection' listener is taken off and called for verified connections only,
 * as routeStreams does for 'stream'.) Other failures (plaintext sent to the TLS port, a timeout) are
 * logged at debug.
 */
function watchHandshakes(server: http2.Http2SecureServer, mutual: boolean, gate: Gate, log: Logger, stats: ServerStats): void {
  server.on("tlsClientError", (err: NodeJS.ErrnoException, socket: TLSSocket) =>
    log.debug({ remote: socket.remoteAddress, reason: err.code ?? err.message }, "TLS handshake failed"),
  );
  if (!mutual) return;
  const http2Listeners = server.listeners("secureConnection") as ((socket: TLSSocket) => void)[];
  if (http2Listeners.length !== 1) throw new Error(`expected HTTP/2's one 'secureConnection' listener, found ${http2Listeners.length}`);
  server.removeAllListeners("secureConnection");
  server.on("secureConnection", (socket: TLSSocket) => {
    if (socket.authorized) return http2Listeners[0]!.call(server, socket);
    const remote = socket.remoteAddress ?? "unknown";
    stats.tlsRefused++;
    // A client that sent none reads as an issuer not found; say what happened instead.
    const sent = Object.keys(socket.getPeerCertificate()).length > 0;
    log.warn(
      { remote, reason: sent ? String(socket.authorizationError) : "NO_CLIENT_CERTIFICATE" },
      "connection refused in the TLS handshake: its client certificate is not accepted",
    );
    gate.authFailed(remote);
    // Closed, not reset: what the client already sent is read and dropped, so the close reaches it
    // as one (a close with unread bytes would be a TCP reset), and it can tell why it was cut.
    socket.on("error", () => {});
    socket.resume();
    socket.end();
    setTimeout(() => socket.destroy(), REFUSED_CLOSE_MS).unref();
  });
}
