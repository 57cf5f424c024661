/**
 * Limits against hostile or broken callers: connections, HTTP/2 and request bounds, bytes in
 * flight, authentication failures, health watches.
 */
import { int, duration, type Setting } from "./parsers.js";

export const LIMITS_SETTINGS = {
  // Limits against hostile or broken callers (src/server/http2-limits.ts, src/server/gate.ts).
  maxConnections: {
    flag: "--max-connections",
    env: ["AIFLOW_MAX_CONNECTIONS"],
    default: "10000",
    help: "open client connections on the gRPC port; past it a new one evicts one that opened no stream or sits idle unauthenticated, else is closed at once (keep it below the fd limit)",
    parse: int(1),
  },
  maxConnectionsPerAddress: {
    flag: "--max-connections-per-address",
    env: ["AIFLOW_MAX_CONNECTIONS_PER_ADDRESS"],
    // A tenth of --max-connections: one address cannot take every slot, and a NATed fleet of a
    // thousand agents still fits. Behind a TLS-terminating proxy every client shares its address.
    default: "1000",
    help: "open connections from one address on the gRPC port, evicting as --max-connections does among that address's own; behind a proxy or NAT raise it to --max-connections",
    parse: int(1),
  },
  httpMaxConnections: {
    flag: "--http-max-connections",
    env: ["AIFLOW_HTTP_MAX_CONNECTIONS"],
    default: "1000",
    help: "open connections on --http-listen; more are closed at once",
    parse: int(1),
  },
  httpMaxConnectionsPerAddress: {
    flag: "--http-max-connections-per-address",
    env: ["AIFLOW_HTTP_MAX_CONNECTIONS_PER_ADDRESS"],
    default: "100",
    help: "open connections from one address on --http-listen; more from it are closed at once",
    parse: int(1),
  },
  httpRequestTimeout: {
    flag: "--http-request-timeout",
    env: ["AIFLOW_HTTP_REQUEST_TIMEOUT"],
    default: "10s",
    help: "a request on --http-listen must arrive whole (headers and body) within this of its first byte, or its connection is closed",
    parse: duration(100, 600_000),
  },
  http2MaxConcurrentStreams: {
    flag: "--http2-max-concurrent-streams",
    env: ["AIFLOW_HTTP2_MAX_CONCURRENT_STREAMS"],
    default: "256",
    help: "SETTINGS_MAX_CONCURRENT_STREAMS: calls (long-polls included) open at once on one connection",
    parse: int(1, 2 ** 31 - 1),
  },
  http2PrefaceTimeout: {
    flag: "--http2-preface-timeout",
    env: ["AIFLOW_HTTP2_PREFACE_TIMEOUT"],
    default: "10s",
    help: "a new connection must send the HTTP/2 preface within this",
    parse: duration(10),
  },
  http2HeadersTimeout: {
    flag: "--http2-headers-timeout",
    env: ["AIFLOW_HTTP2_HEADERS_TIMEOUT"],
    default: "20s",
    help: "a new connection must complete its first request's headers within this",
    parse: duration(10),
  },
  http2BodyTimeout: {
    flag: "--http2-body-timeout",
    env: ["AIFLOW_HTTP2_BODY_TIMEOUT"],
    default: "30s",
    help: "a request's body must be complete within this of its headers",
    parse: duration(10),
  },
  http2IdleTimeout: {
    flag: "--http2-idle-timeout",
    env: ["AIFLOW_HTTP2_IDLE_TIMEOUT"],
    default: "5m",
    help: "a connection with no call open for this long is sent GOAWAY and closed",
    parse: duration(10),
  },
  http2KeepaliveInterval: {
    flag: "--http2-keepalive-interval",
    env: ["AIFLOW_HTTP2_KEEPALIVE_INTERVAL"],
    default: "1m",
    help: "how often every connection is pinged; 0: never",
    parse: duration(0),
  },
  http2KeepaliveTimeout: {
    flag: "--http2-keepalive-timeout",
    env: ["AIFLOW_HTTP2_KEEPALIVE_TIMEOUT"],
    default: "20s",
    help: "a connection whose ping is not answered within this is closed",
    parse: duration(10),
  },
  http2MaxResets: {
    flag: "--http2-max-resets",
    env: ["AIFLOW_HTTP2_MAX_RESETS"],
    default: "200",
    help: "streams a client may reset per --http2-reset-window before its connection is closed (rapid reset)",
    parse: int(1),
  },
  http2ResetWindow: {
    flag: "--http2-reset-window",
    env: ["AIFLOW_HTTP2_RESET_WINDOW"],
    default: "10s",
    help: "window of --http2-max-resets",
    parse: duration(10),
  },
  http2GoawayGrace: {
    flag: "--http2-goaway-grace",
    env: ["AIFLOW_HTTP2_GOAWAY_GRACE"],
    default: "30s",
    help: "after a GOAWAY either way, the connection is cut this much later",
    parse: duration(0),
  },
  maxInflightBytes: {
    flag: "--max-inflight-bytes",
    env: ["AIFLOW_MAX_INFLIGHT_BYTES"],
    default: "67108864",
    help: "request bytes held by calls in flight, daemon-wide; calls past it are refused RESOURCE_EXHAUSTED",
    parse: int(1024),
  },
  authFailureLimit: {
    flag: "--auth-failure-limit",
    env: ["AIFLOW_AUTH_FAILURE_LIMIT"],
    default: "50",
    help: "failed authentications an address may have per --auth-failure-window before its calls are refused",
    parse: int(1),
  },
  authFailureWindow: {
    flag: "--auth-failure-window",
    env: ["AIFLOW_AUTH_FAILURE_WINDOW"],
    default: "1m",
    help: "window of --auth-failure-limit (and how long the refusal lasts)",
    parse: duration(10),
  },
  healthWatchMax: {
    flag: "--health-watch-max",
    env: ["AIFLOW_HEALTH_WATCH_MAX"],
    default: "1000",
    help: "Health.Watch streams open at once, daemon-wide",
    parse: int(1),
  },
  healthWatchMaxPerAddress: {
    flag: "--health-watch-max-per-address",
    env: ["AIFLOW_HEALTH_WATCH_MAX_PER_ADDRESS"],
    default: "32",
    help: "Health.Watch streams open at once from one address",
    parse: int(1),
  },
  healthWatchLifetime: {
    flag: "--health-watch-lifetime",
    env: ["AIFLOW_HEALTH_WATCH_LIFETIME"],
    default: "10m",
    help: "a Health.Watch stream ends (status OK) after this; the client watches again",
    parse: duration(10),
  },
} satisfies Record<string, Setting<unknown>>;
