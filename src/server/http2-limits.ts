/**
 * What one client connection may hold, and for how long. The guarantees, each behind a setting:
 * - at most `maxConnections` sockets are open. A connection past it evicts the oldest connection
 *   that has not yet opened a stream (a flood of empty connections then churns itself, and a probe
 *   that connects and asks at once still gets in); with none to evict it is closed on accept.
 *   Either is counted, and logged at warn once per burst;
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
import http2, { type Http2Server, type ServerHttp2Session, type ServerHttp2Stream } from "node:http2";
import type { Socket } from "node:net";
import { performance } from "node:perf_hooks";
import type { Logger } from "../log.js";
import type { ServerStats } from "./stats.js";

export interface Http2Limits {
  maxConnections: number;
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
  prefaced: boolean;
  streamed: boolean;
  active: number;
  idleSince: number;
  goawayAt: number | undefined;
  lastPingAt: number;
  pingSentAt: number | undefined;
  resetWindowAt: number;
  resets: number;
  /** Its destruction is scheduled: the sweep leaves it alone. */
  cutting: boolean;
}

export interface SessionGuard {
  stop(): void;
}

export function guardSessions(server: Http2Server, limits: Http2Limits, log: Logger, stats: ServerStats): SessionGuard {
  const states = new Map<ServerHttp2Session, SessionState>();
  const now = () => performance.now();

  let open = 0;
  /** Sessions that have not opened a stream, oldest first: the ones a new connection may evict. */
  const unstreamed = new Set<ServerHttp2Session>();
  let burst = 0;
  const overCap = (what: string, remote: string | undefined) => {
    if (burst++ === 0) log.warn({ maxConnections: limits.maxConnections, remote }, `--max-connections are open: ${what} (more of this burst are counted, not logged)`);
  };
  // After the server's own 'connection' listener, so the socket's session exists.
  server.on("connection", (socket: Socket) => {
    open++;
    socket.once("close", () => {
      open--;
      if (burst > 0 && open < limits.maxConnections) {
        log.warn({ overCap: burst }, "connections below --max-connections again");
        burst = 0;
      }
    });
    if (open <= limits.maxConnections) return;
    // The new connection's own session is the newest there; any older one may go.
    const victim = unstreamed.size > 1 ? unstreamed.values().next().value : undefined;
    if (victim) {
      unstreamed.delete(victim);
      stats.connectionsEvicted++;
      overCap("evicting connections that opened no stream", socket.remoteAddress);
      victim.destroy();
    } else {
      stats.connectionsRefused++;
      overCap("refusing new connections", socket.remoteAddress);
      socket.destroy();
    }
  });

  server.on("session", (s: ServerHttp2Session) => {
    const t = now();
    const state: SessionState = { openedAt: t, prefaced: false, streamed: false, active: 0, idleSince: t, goawayAt: undefined, lastPingAt: t, pingSentAt: undefined, resetWindowAt: t, resets: 0, cutting: false };
    states.set(s, state);
    unstreamed.add(s);
    s.once("remoteSettings", () => (state.prefaced = true));
    s.on("goaway", () => (state.goawayAt ??= now()));
    s.on("stream", (stream: ServerHttp2Stream) => {
      if (!state.streamed) unstreamed.delete(s);
      state.streamed = true;
      state.active++;
      stream.once("close", () => {
        state.active--;
        if (state.active === 0) state.idleSince = now();
        if (stream.rstCode !== http2.constants.NGHTTP2_NO_ERROR && stream.rstCode !== undefined) resetSeen(s, state);
      });
    });
    s.once("close", () => {
      states.delete(s);
      unstreamed.delete(s);
    });
  });

  /** Ends the session on the next turn of the event loop, outside any read of it (see above). */
  const cut = (s: ServerHttp2Session, st: SessionState, err?: Error, code?: number) => {
    if (st.cutting) return;
    st.cutting = true;
    unstreamed.delete(s);
    setImmediate(() => s.destroy(err, code));
  };

  const resetSeen = (s: ServerHttp2Session, state: SessionState) => {
    const t = now();
    if (t - state.resetWindowAt >= limits.resetWindowMs) {
      state.resetWindowAt = t;
      state.resets = 0;
    }
    if (++state.resets !== limits.maxResets + 1) return;
    stats.resetFloods++;
    log.warn({ remote: s.socket?.remoteAddress, resets: state.resets, windowMs: limits.resetWindowMs }, "connection cut: it resets streams too fast (rapid reset)");
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
  const shortest = Math.min(limits.prefaceTimeoutMs, limits.headersTimeoutMs, limits.idleTimeoutMs, limits.keepaliveTimeoutMs, limits.goawayGraceMs || Infinity, limits.keepaliveIntervalMs || Infinity);
  const timer = setInterval(sweep, Math.min(1000, Math.max(10, shortest / 4)));
  timer.unref();
  return { stop: () => clearInterval(timer) };
}
