/**
 * What one client connection may hold, and for how long. The guarantees, each behind a setting:
 * - at most `maxConnections` sockets are open, and at most `maxConnectionsPerAddress` from one
 *   address. A connection past either cap makes room by evicting, among the connections it counts
 *   against (all of them, or its address's own), the oldest that has not yet opened a stream, else
 *   one with no call open that never authenticated (no call of it presented a token or certificate
 *   the gate accepted; at the global cap the longest idle). A connection that authenticated, or has
 *   a call open, is never evicted, so a flood of empty or unauthenticated connections churns itself
 *   and authenticated callers keep their room; a probe that connects and asks at once still gets
 *   in. With nothing to evict the new connection is closed on accept. Either is counted, and logged
 *   at warn once per burst;
 * - at most `maxConcurrentStreams` calls are open per connection (advertised in SETTINGS, so
 *   well-behaved clients queue; nghttp2 refuses the excess of the others);
 * - a connection sends its preface within `prefaceTimeoutMs` and its first request's headers within
 *   `headersTimeoutMs`, or is cut;
 * - a connection with no call open for `idleTimeoutMs` is sent GOAWAY; one with a call open is
 *   never idle, so long-polls (Claim with wait, Wait, WatchDirectives) are not cut;
 * - every connection is pinged each `keepaliveIntervalMs`; an unanswered ping for
 *   `keepaliveTimeoutMs` means a dead peer and the connection is cut, long-poll or not;
 * - a connection that resets more than `maxResets` streams within `resetWindowMs` (rapid reset,
 *   CVE-2023-44487) is cut with GOAWAY ENHANCE_YOUR_CALM;
 * - `goawayGraceMs` after a GOAWAY either way the connection is cut, so no socket outlives it.
 * These are socket lifetimes, so they run on real time (performance.now), never the daemon's Clock:
 * a test's fake clock jumping an hour must not cut its connections. One sweep checks every session;
 * its period is a quarter of the shortest limit (10 ms to 1 s), which is the precision of them all.
 *
 * A session is never destroyed from inside one of its own events (`cut` defers it): Node drains the
 * tick queue, and with it a stream's 'close' listeners, after each callback nghttp2 makes into JS
 * while it is still parsing a read, and a session destroyed there aborts the process
 * (`Assertion failed: (current_nghttp2_memory_) >= (previous_size)`) or leaves its socket reading in
 * a loop that grows memory by hundreds of MB a second (issue 51).
 */
import http2, { type Http2Server, type Http2Session, type ServerHttp2Session, type ServerHttp2Stream } from "node:http2";
import type { Socket } from "node:net";
import { performance } from "node:perf_hooks";
import type { Logger } from "../log.js";
import { ConnectionCaps } from "./connection-caps.js";
import type { ServerStats } from "./stats.js";

export interface Http2Limits {
  maxConnections: number;
  maxConnectionsPerAddress: number;
  maxConcurrentStreams: number;
  prefaceTimeoutMs: number;
  headersTimeoutMs: number;
  idleTimeoutMs: number;
  /** 0: no keepalive pings. */
  keepaliveIntervalMs: number;
  keepaliveTimeoutMs: number;
  maxResets: number;
  resetWindowMs: number;
  goawayGraceMs: number;
}

/** The settings a session starts with: nghttp2 enforces these itself. */
export function http2ServerOptions(limits: Http2Limits): http2.ServerOptions {
  return {
    settings: { maxConcurrentStreams: limits.maxConcurrentStreams, maxHeaderListSize: 64 * 1024 },
  };
}

interface SessionState {
  readonly openedAt: number;
  readonly address: string;
  /** address:port, which tells a new connection's own session from the others. */
  readonly peer: string;
  prefaced: boolean;
  streamed: boolean;
  active: number;
  idleSince: number;
  goawayAt: number | undefined;
  lastPingAt: number;
  pingSentAt: number | undefined;
  resetWindowAt: number;
  resets: number;
  /** A call of it passed the gate with a token or certificate: never evicted. */
  authenticated: boolean;
  /** Its destruction is scheduled: not to be picked again. */
  cutting: boolean;
}

export interface SessionGuard {
  /** The gate accepted the credentials of a call on this session. */
  authenticated(session: Http2Session): void;
  stop(): void;
}

export function guardSessions(server: Http2Server, limits: Http2Limits, log: Logger, stats: ServerStats): SessionGuard {
  const states = new Map<ServerHttp2Session, SessionState>();
  const now = () => performance.now();

  /** Sessions that have not opened a stream, oldest first: the first a new connection may evict. */
  const unstreamed = new Set<ServerHttp2Session>();
  /** Sessions with no call open that never authenticated, longest idle first: the next. */
  const idleStrangers = new Set<ServerHttp2Session>();
  /** Each address's sessions, oldest first: where a connection over its address's cap looks. */
  const byAddress = new Map<string, Set<ServerHttp2Session>>();
  const caps = new ConnectionCaps(limits, log, { total: "--max-connections", perAddress: "--max-connections-per-address", connections: "connections" });

  /** Ends the session on the next turn of the event loop, outside any read of it (see above). */
  const cut = (s: ServerHttp2Session, st: SessionState, err?: Error, code?: number) => {
    if (st.cutting) return;
    st.cutting = true;
    unstreamed.delete(s);
    idleStrangers.delete(s);
    setImmediate(() => s.destroy(err, code));
  };
  const evictable = (set: Iterable<ServerHttp2Session>, except: string) => {
    for (const s of set) if (!s.destroyed && states.get(s)?.peer !== except) return s;
    return undefined;
  };
  /** Of an address's sessions: the oldest that opened no stream, else the first idle stranger. */
  const evictableFrom = (sessions: Iterable<ServerHttp2Session>, except: string) => {
    let stranger: ServerHttp2Session | undefined;
    for (const s of sessions) {
      const st = states.get(s);
      if (!st || st.cutting || s.destroyed || st.peer === except) continue;
      if (!st.streamed) return s;
      stranger ??= idleStrangers.has(s) ? s : undefined;
    }
    return stranger;
  };

  // After the server's own 'connection' listener: over h2c the socket's session exists (the newest,
  // never its own victim); over TLS it comes after the handshake, and the socket counts meanwhile.
  server.on("connection", (socket: Socket) => {
    if (socket.destroyed) return;
    const address = socket.remoteAddress ?? "unknown";
    const over = caps.open(socket, address);
    if (!over) return;
    const except = `${address}:${socket.remotePort}`;
    const victim =
      over === "address" ? evictableFrom(byAddress.get(address) ?? [], except) : (evictable(unstreamed, except) ?? evictable(idleStrangers, except));
    if (victim) {
      stats.connectionsEvicted++;
      caps.overCap(over, address, "evicting connections that opened no stream or sit idle unauthenticated");
      cut(victim, states.get(victim)!);
    } else {
      stats.connectionsRefused++;
      caps.overCap(over, address, "refusing new connections");
      socket.destroy();
    }
  });

  server.on("session", (s: ServerHttp2Session) => {
    const t = now();
    const address = s.socket?.remoteAddress ?? "unknown";
    const state: SessionState = {
      openedAt: t,
      address,
      peer: `${address}:${s.socket?.remotePort}`,
      prefaced: false,
      streamed: false,
      active: 0,
      idleSince: t,
      goawayAt: undefined,
      lastPingAt: t,
      pingSentAt: undefined,
      resetWindowAt: t,
      resets: 0,
      authenticated: false,
      cutting: false,
    };
    states.set(s, state);
    unstreamed.add(s);
    let mine = byAddress.get(address);
    if (!mine) byAddress.set(address, (mine = new Set()));
    mine.add(s);
    s.once("remoteSettings", () => (state.prefaced = true));
    s.on("goaway", () => (state.goawayAt ??= now()));
    s.on("stream", (stream: ServerHttp2Stream) => {
      if (!state.streamed) unstreamed.delete(s);
      state.streamed = true;
      state.active++;
      idleStrangers.delete(s);
      stream.once("close", () => {
        state.active--;
        if (state.active === 0) {
          state.idleSince = now();
          // Re-added, so the set stays in order of how long each has been idle. A stream may close
          // after its session did (one whose end was never read): a closed session is not kept.
          if (!state.authenticated && !state.cutting && states.has(s)) idleStrangers.add(s);
        }
        if (stream.rstCode !== http2.constants.NGHTTP2_NO_ERROR && stream.rstCode !== undefined) resetSeen(s, state);
      });
    });
    s.once("close", () => {
      states.delete(s);
      unstreamed.delete(s);
      idleStrangers.delete(s);
      mine.delete(s);
      if (mine.size === 0) byAddress.delete(address);
    });
  });

  const resetSeen = (s: ServerHttp2Session, state: SessionState) => {
    const t = now();
    if (t - state.resetWindowAt >= limits.resetWindowMs) {
      state.resetWindowAt = t;
      state.resets = 0;
    }
    if (++state.resets !== limits.maxResets + 1) return;
    stats.resetFloods++;
    log.warn({ remote: state.address, resets: state.resets, windowMs: limits.resetWindowMs }, "connection cut: it resets streams too fast (rapid reset)");
    // Called from a stream's 'close' listener, inside nghttp2's parsing of the read that reset it:
    // cut() defers the destroy (with its GOAWAY ENHANCE_YOUR_CALM) past the read.
    cut(s, state, new Error("rapid reset"), http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
  };

  // Runs from a timer, outside any session's read: it may end sessions at once.
  const sweep = () => {
    const t = now();
    for (const [s, st] of states) {
      if (s.destroyed || st.cutting) continue;
      if (!st.prefaced && t - st.openedAt >= limits.prefaceTimeoutMs) {
        stats.prefaceTimeouts++;
        log.debug({ remote: s.socket?.remoteAddress }, "connection cut: no HTTP/2 preface in time");
        s.destroy();
        continue;
      }
      if (st.goawayAt !== undefined) {
        if (t - st.goawayAt >= limits.goawayGraceMs) {
          stats.goawayDestroyed++;
          s.destroy();
        }
        continue;
      }
      if (!st.streamed && t - st.openedAt >= limits.headersTimeoutMs) {
        stats.headersTimeouts++;
        log.debug({ remote: s.socket?.remoteAddress }, "connection cut: no complete request headers in time");
        s.close();
        st.goawayAt = t;
        continue;
      }
      if (st.streamed && st.active === 0 && t - st.idleSince >= limits.idleTimeoutMs) {
        stats.idleClosed++;
        st.goawayAt = t;
        // close() sends GOAWAY(NO_ERROR) and ends the session once its streams are done.
        s.close();
        continue;
      }
      if (limits.keepaliveIntervalMs > 0 && st.prefaced) {
        if (st.pingSentAt !== undefined) {
          if (t - st.pingSentAt >= limits.keepaliveTimeoutMs) {
            stats.keepaliveTimeouts++;
            log.debug({ remote: s.socket?.remoteAddress }, "connection cut: keepalive ping not answered");
            s.destroy();
          }
        } else if (t - st.lastPingAt >= limits.keepaliveIntervalMs) {
          st.pingSentAt = t;
          const sent = s.ping((err) => {
            if (err) return;
            st.pingSentAt = undefined;
            st.lastPingAt = now();
          });
          // Too many pings unanswered already (Node's own limit): the peer is not reading.
          if (!sent) st.pingSentAt = t - limits.keepaliveTimeoutMs;
        }
      }
    }
  };
  const shortest = Math.min(
    limits.prefaceTimeoutMs,
    limits.headersTimeoutMs,
    limits.idleTimeoutMs,
    limits.keepaliveTimeoutMs,
    limits.goawayGraceMs || Infinity,
    limits.keepaliveIntervalMs || Infinity,
  );
  const timer = setInterval(sweep, Math.min(1000, Math.max(10, shortest / 4)));
  timer.unref();
  return {
    authenticated(session) {
      // A server stream's session: a server session.
      const s = session as ServerHttp2Session;
      const st = states.get(s);
      if (!st || st.authenticated) return;
      st.authenticated = true;
      idleStrangers.delete(s);
    },
    stop: () => clearInterval(timer),
  };
}
