/**
 * The settings table: every setting's flag, AIFLOW_* environment variables, default, help line and
 * parser, in the order `aiflowd --help` prints them. ../config.ts reads argv and the environment
 * through it.
 */
import { fileURLToPath } from "node:url";
import { DEFAULT_CREDIT } from "../domain/fair-share.js";
import { parseTokenSpec } from "../domain/tokens.js";
import { DEFAULT_MAX_LABEL_VALUES } from "../observability/label-values.js";
import { bool, duration, identifier, int, level, list, listen, oneOf, type Parser, postgresUrl, secret, tenantWeights, text, trustDomain } from "./parsers.js";

/** Where `npm run build` puts the web console, from src/ or dist/ alike (the console's HTTP handler is ../server/console.ts). */
const DEFAULT_CONSOLE_DIR = fileURLToPath(new URL("../../dist/console/", import.meta.url));

export interface Setting<T> {
  flag: string;
  env: readonly string[];
  default: string | undefined;
  help: string;
  parse: Parser<T>;
  /** A repeatable flag collects every occurrence (and splits the env var on whitespace or ';'). */
  repeatable?: boolean;
  /** A switch: the flag alone means "true" (`--flag=false` and the env var still take a value). */
  switch?: boolean;
}

export const SETTINGS = {
  listen: { flag: "--listen", env: ["AIFLOW_LISTEN"], default: "127.0.0.1:7400", help: "gRPC address to serve (TLS with --tls-cert; h2c without, on loopback or with --insecure-plaintext)", parse: listen },
  // Transport security (src/server/tls.ts): HTTP/2 over TLS 1.2+ (ALPN h2), files re-read on change and SIGHUP.
  httpListen: {
    flag: "--http-listen",
    env: ["AIFLOW_HTTP_LISTEN"],
    default: "127.0.0.1:9464",
    help: "HTTP address of /metrics, /healthz and /readyz (HTTPS with --tls-cert); off: none",
    parse: (raw, flag) => (raw === "off" ? null : listen(raw, flag)),
  },
  metricsListen: {
    flag: "--metrics-listen",
    env: ["AIFLOW_METRICS_LISTEN"],
    default: undefined,
    help: "HTTP address of /metrics (and the probes) apart from --http-listen, which then serves no /metrics: keep the scrape off the port that faces the internet; default: on --http-listen",
    parse: listen,
  },
  consoleDir: {
    flag: "--console-dir",
    env: ["AIFLOW_CONSOLE_DIR"],
    default: DEFAULT_CONSOLE_DIR,
    help: "the built web console served at /console/ on --http-listen (npm run build makes it)",
    parse: text,
  },
  metricsToken: {
    flag: "--metrics-token",
    env: ["AIFLOW_METRICS_TOKEN"],
    default: undefined,
    help: "bearer token /metrics requires (prefer the env var: flags show in ps); at least 16 characters",
    parse: secret(16),
  },
  metricsMaxLabelValues: {
    flag: "--metrics-max-label-values",
    env: ["AIFLOW_METRICS_MAX_LABEL_VALUES"],
    default: String(DEFAULT_MAX_LABEL_VALUES),
    help: 'distinct values each of the tenant and engine_kind labels takes on /metrics (the first seen keep theirs); later ones are counted as "other"',
    parse: int(1, 100_000),
  },
  metricsMaxAgents: { flag: "--metrics-max-agents", env: ["AIFLOW_METRICS_MAX_AGENTS"], default: "1000", help: "agents with series of their own on /metrics (the first by name); the rest count in aggregates only", parse: int(0, 100_000) },
  metricsRefresh: {
    flag: "--metrics-refresh",
    env: ["AIFLOW_METRICS_REFRESH"],
    default: "5s",
    help: "how old the queue and fleet gauges on /metrics may be: scrapes within it share one read of the database",
    parse: duration(0, 600_000),
  },
  tlsCert: { flag: "--tls-cert", env: ["AIFLOW_TLS_CERT"], default: undefined, help: "PEM certificate chain of the gRPC port (with --tls-key)", parse: text },
  tlsKey: { flag: "--tls-key", env: ["AIFLOW_TLS_KEY"], default: undefined, help: "PEM private key of --tls-cert", parse: text },
  tlsClientCa: {
    flag: "--tls-client-ca",
    env: ["AIFLOW_TLS_CLIENT_CA"],
    default: undefined,
    help: "PEM CA bundle: mutual TLS, a client without a certificate it signed is refused in the handshake; a URI SAN spiffe://DOMAIN/ROLE/NAME is the caller's identity",
    parse: text,
  },
  tlsTrustDomain: { flag: "--tls-trust-domain", env: ["AIFLOW_TLS_TRUST_DOMAIN"], default: "aiflow", help: "trust domain of the spiffe:// URIs in client certificates that name a caller", parse: trustDomain },
  insecurePlaintext: {
    flag: "--insecure-plaintext",
    env: ["AIFLOW_INSECURE_PLAINTEXT"],
    default: "false",
    help: "serve h2c on a non-loopback address (behind a TLS-terminating proxy); tokens then cross that network in clear",
    parse: bool,
    switch: true,
  },
  databaseUrl: {
    flag: "--database-url",
    env: ["AIFLOW_DATABASE_URL", "DATABASE_URL"],
    default: undefined,
    help: "Postgres URL (a Unix socket: postgresql://USER@/DB?host=/run/postgresql); when unset an embedded Postgres is started under --data-dir",
    parse: postgresUrl,
  },
  dataDir: { flag: "--data-dir", env: ["AIFLOW_DATA_DIR"], default: "./.aiflowd/pg", help: "data directory of the embedded Postgres", parse: text },
  embeddedPort: { flag: "--embedded-port", env: ["AIFLOW_EMBEDDED_PORT"], default: "7432", help: "port of the embedded Postgres (loopback only)", parse: int(1024, 65535) },
  schema: { flag: "--schema", env: ["AIFLOW_SCHEMA"], default: "public", help: "Postgres schema that holds the tables", parse: identifier },
  tablePrefix: { flag: "--table-prefix", env: ["AIFLOW_TABLE_PREFIX"], default: "aiflow_", help: "prefix of every table and index name", parse: identifier },
  dbPoolSize: { flag: "--db-pool-size", env: ["AIFLOW_DB_POOL_SIZE"], default: "10", help: "Postgres connections of each of this instance's two pools (queries, and the queue's prepared statements): it opens up to twice this, plus one for LISTEN", parse: int(2, 500) },
  dbConnectTimeout: {
    flag: "--db-connect-timeout",
    env: ["AIFLOW_DB_CONNECT_TIMEOUT"],
    default: "2m",
    help: "how long start-up retries an unreachable database (with backoff) before giving up",
    parse: duration(0),
  },
  tokens: {
    flag: "--token",
    env: ["AIFLOW_TOKENS"],
    default: undefined,
    help: "bearer token grant ROLE:TOKEN[:TENANT,...] (role agent|engine|ops|runs); repeatable; env separates by ';'",
    parse: parseTokenSpec,
    repeatable: true,
  },
  tokensFile: { flag: "--tokens-file", env: ["AIFLOW_TOKENS_FILE"], default: undefined, help: 'JSON file: [{"role","token","tenants"?,"name"?,"agents"?}]', parse: text },
  auditLog: { flag: "--audit-log", env: ["AIFLOW_AUDIT_LOG"], default: undefined, help: "file the audit stream is appended to (JSON lines); default: the daemon's log", parse: text },
  logLevel: { flag: "--log-level", env: ["AIFLOW_LOG_LEVEL"], default: "info", help: "trace|debug|info|warn|error|fatal|silent", parse: level },
  instanceId: {
    flag: "--instance-id",
    env: ["AIFLOW_INSTANCE_ID"],
    default: undefined,
    help: "stable id of this daemon instance (aiflow_engine.engineid); default HOSTNAME:PORT",
    parse: text,
  },
  tenants: { flag: "--tenants", env: ["AIFLOW_TENANTS"], default: "default", help: "comma-separated tenant keys this instance serves", parse: list },
  shutdownGrace: { flag: "--shutdown-grace", env: ["AIFLOW_SHUTDOWN_GRACE"], default: "10s", help: "time in-flight calls get to finish on SIGTERM/SIGINT", parse: duration(0) },
  heartbeatInterval: { flag: "--heartbeat-interval", env: ["AIFLOW_HEARTBEAT_INTERVAL"], default: "5s", help: "interval agents are told to heartbeat at", parse: duration(100) },
  livenessIntervals: {
    flag: "--liveness-intervals",
    env: ["AIFLOW_LIVENESS_INTERVALS"],
    default: "3",
    help: "heartbeat intervals an agent may miss before it is marked inactive",
    parse: int(1, 1000),
  },
  heartbeatFlush: { flag: "--heartbeat-flush", env: ["AIFLOW_HEARTBEAT_FLUSH"], default: "1s", help: "how often coalesced heartbeats are written (one statement each)", parse: duration(10) },
  leaseTtl: { flag: "--lease-ttl", env: ["AIFLOW_LEASE_TTL"], default: "30s", help: "lease length of a claimed work item", parse: duration(100) },
  sweepInterval: { flag: "--sweep-interval", env: ["AIFLOW_SWEEP_INTERVAL"], default: "1s", help: "how often liveness and lease-expiry sweeps run", parse: duration(10) },
  metadataMaxBytes: { flag: "--metadata-max-bytes", env: ["AIFLOW_METADATA_MAX_BYTES"], default: "65536", help: "largest agent metadata accepted", parse: int(1024) },
  payloadMaxBytes: { flag: "--payload-max-bytes", env: ["AIFLOW_PAYLOAD_MAX_BYTES"], default: "1048576", help: "largest work item payload accepted", parse: int(1024) },
  claimMaxItems: { flag: "--claim-max-items", env: ["AIFLOW_CLAIM_MAX_ITEMS"], default: "256", help: "claims asking for more items are clamped to this", parse: int(1, 10_000) },
  claimMaxWait: { flag: "--claim-max-wait", env: ["AIFLOW_CLAIM_MAX_WAIT"], default: "30s", help: "longest a claim long-poll may wait", parse: duration(0) },
  claimMaxWaitingPerAgent: {
    flag: "--claim-max-waiting-per-agent",
    env: ["AIFLOW_CLAIM_MAX_WAITING_PER_AGENT"],
    // The SDK holds one or two waiting claims per agent; more is a loop that never waits for its answers.
    default: "8",
    help: "waiting (long-poll) claims one agent may hold on this daemon; more are RESOURCE_EXHAUSTED",
    parse: int(1, 100_000),
  },
  claimMaxWaitingPerToken: {
    flag: "--claim-max-waiting-per-token",
    env: ["AIFLOW_CLAIM_MAX_WAITING_PER_TOKEN"],
    default: "1000",
    help: "waiting (long-poll) claims all agents of one token may hold on this daemon; more are RESOURCE_EXHAUSTED",
    parse: int(1, 1_000_000),
  },
  maxRedeliveries: {
    flag: "--max-redeliveries",
    env: ["AIFLOW_MAX_REDELIVERIES"],
    default: "3",
    help: "times an item goes back to the queue after a lost lease (its agent died, hung, was cut off or went inactive) before it fails, unless its Enqueue says; lost leases spend none of max_retries",
    parse: int(0, 1000),
  },
  backoffBase: { flag: "--backoff-base", env: ["AIFLOW_BACKOFF_BASE"], default: "1s", help: "retry backoff base (full jitter: rand(0, min(cap, base*2^retry)))", parse: duration(0) },
  grpcFastPath: {
    flag: "--grpc-fast-path",
    env: ["AIFLOW_GRPC_FAST_PATH"],
    default: "on",
    help: "on: plain gRPC unary calls are served straight from the HTTP/2 stream (wire/src/server/unary-fast-path.ts); off: connect-node serves every call",
    parse: oneOf(["on", "off"]),
  },
  backoffJitter: { flag: "--backoff-jitter", env: ["AIFLOW_BACKOFF_JITTER"], default: "full", help: "full (random in [0, bound]) or none (exactly the bound)", parse: oneOf(["full", "none"]) },
  enqueueWindow: {
    flag: "--enqueue-window",
    env: ["AIFLOW_ENQUEUE_WINDOW"],
    default: "8ms",
    help: "under sustained Enqueue load, insert statements start at most once per window (fewer, larger inserts); 0: each starts when the last returns",
    // Every Enqueue under load may wait this long: a second is far past any use.
    parse: duration(0, 1000),
  },
  notifyWindow: { flag: "--notify-window", env: ["AIFLOW_NOTIFY_WINDOW"], default: "5ms", help: "enqueues within this window share one NOTIFY to other daemons", parse: duration(0) },
  doneNotifyWindow: {
    flag: "--done-notify-window",
    env: ["AIFLOW_DONE_NOTIFY_WINDOW"],
    default: "50ms",
    help: "completions within this window share one NOTIFY (it wakes Wait calls on other daemons)",
    parse: duration(0),
  },
  backoffCap: { flag: "--backoff-cap", env: ["AIFLOW_BACKOFF_CAP"], default: "5m", help: "retry backoff cap", parse: duration(0) },
  affinityPolicy: {
    flag: "--affinity-policy",
    env: ["AIFLOW_AFFINITY_POLICY"],
    default: "rebind",
    help: "when a key's agent cannot take work: hold (its items wait, then fail after the grace) or rebind (the key moves after the grace)",
    parse: oneOf(["hold", "rebind"]),
  },
  affinityGrace: { flag: "--affinity-grace", env: ["AIFLOW_AFFINITY_GRACE"], default: "60s", help: "how long a key waits for its agent before the policy acts", parse: duration(0) },
  unplaceableGrace: {
    flag: "--unplaceable-grace",
    env: ["AIFLOW_UNPLACEABLE_GRACE"],
    default: "0s",
    help: "a pending item no registered agent could ever run (its requirements fit no capacity) becomes a dead letter after this long; 0: it waits",
    parse: duration(0),
  },
  // Fair share and aging (src/domain/fair-share.ts).
  tenantWeights: {
    flag: "--tenant-weights",
    env: ["AIFLOW_TENANT_WEIGHTS"],
    default: "",
    help: "tenants' fair-share weights, tenant=weight[,tenant=weight…] (default 1; an operator's weight set by aiflowctl wins)",
    parse: tenantWeights,
  },
  fairShareCredit: { flag: "--fair-share-credit", env: ["AIFLOW_FAIR_SHARE_CREDIT"], default: String(DEFAULT_CREDIT), help: "items' worth of turns an idle tenant may bank for its next burst", parse: int(0, 1_000_000) },
  priorityAging: { flag: "--priority-aging", env: ["AIFLOW_PRIORITY_AGING"], default: "0s", help: "waiting this long is worth one priority level inside a tenant; 0: priority is strict", parse: duration(0) },
  affinityIdle: { flag: "--affinity-idle", env: ["AIFLOW_AFFINITY_IDLE"], default: "1h", help: "a binding whose key has had no unfinished item for this long is removed", parse: duration(0) },
  dagMaxNodes: { flag: "--dag-max-nodes", env: ["AIFLOW_DAG_MAX_NODES"], default: "10000", help: "most nodes a DAG definition may have", parse: int(1, 1_000_000) },
  dagMaxDefinitionBytes: { flag: "--dag-max-definition-bytes", env: ["AIFLOW_DAG_MAX_DEFINITION_BYTES"], default: "4194304", help: "largest DAG definition accepted (its JSON)", parse: int(1024) },
  dagMaxFanOut: { flag: "--dag-max-fan-out", env: ["AIFLOW_DAG_MAX_FAN_OUT"], default: "100000", help: "most iterations one fan-out node may have", parse: int(1, 10_000_000) },
  runHistoryMax: {
    flag: "--run-history-max",
    env: ["AIFLOW_RUN_HISTORY_MAX"],
    default: "1000",
    help: "entries a graph run's path and a state machine's history keep (the latest); older ones are dropped and counted (path_dropped, history_dropped)",
    parse: int(1, 1_000_000),
  },
  // Quotas on what callers queue (src/queue/enqueue-quota.ts).
  maxItemsPerCall: {
    flag: "--max-items-per-call",
    env: ["AIFLOW_MAX_ITEMS_PER_CALL"],
    default: "10000",
    help: "most work items one call queues: an Enqueue's items, a DAG fan-out node's iterations, all a run's start or signal queues; more is RESOURCE_EXHAUSTED (a fan-out an engine reaches on its own fails its node)",
    parse: int(1, 1_000_000),
  },
  maxEnqueueRate: {
    flag: "--max-enqueue-rate",
    env: ["AIFLOW_MAX_ENQUEUE_RATE"],
    default: "100000",
    help: "work items one tenant may queue a second on this daemon (a bucket holding a second's worth); calls past it are RESOURCE_EXHAUSTED, engine advances are charged; 0: no limit",
    parse: int(0, 100_000_000),
  },
  triggersFile: {
    flag: "--triggers-file",
    env: ["AIFLOW_TRIGGERS_FILE"],
    default: undefined,
    help: "JSON file of webhook and cron triggers, put at each start (the file's triggers it no longer names are deleted)",
    parse: text,
  },
  webhookMaxBytes: { flag: "--webhook-max-bytes", env: ["AIFLOW_WEBHOOK_MAX_BYTES"], default: "1048576", help: "largest webhook body accepted; a larger one is refused (413) and not kept", parse: int(1024, 64 * 1024 * 1024) },
  cronCatchUp: { flag: "--cron-catch-up", env: ["AIFLOW_CRON_CATCH_UP"], default: "1h", help: "a cron tick missed while no daemon ran still fires when it is at most this old", parse: duration(0) },
  firingRetention: { flag: "--firing-retention-days", env: ["AIFLOW_FIRING_RETENTION_DAYS"], default: "30", help: "days trigger firings are kept (payloads may hold senders' secrets)", parse: int(1, 36500) },
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
  http2PrefaceTimeout: { flag: "--http2-preface-timeout", env: ["AIFLOW_HTTP2_PREFACE_TIMEOUT"], default: "10s", help: "a new connection must send the HTTP/2 preface within this", parse: duration(10) },
  http2HeadersTimeout: { flag: "--http2-headers-timeout", env: ["AIFLOW_HTTP2_HEADERS_TIMEOUT"], default: "20s", help: "a new connection must complete its first request's headers within this", parse: duration(10) },
  http2BodyTimeout: { flag: "--http2-body-timeout", env: ["AIFLOW_HTTP2_BODY_TIMEOUT"], default: "30s", help: "a request's body must be complete within this of its headers", parse: duration(10) },
  http2IdleTimeout: { flag: "--http2-idle-timeout", env: ["AIFLOW_HTTP2_IDLE_TIMEOUT"], default: "5m", help: "a connection with no call open for this long is sent GOAWAY and closed", parse: duration(10) },
  http2KeepaliveInterval: { flag: "--http2-keepalive-interval", env: ["AIFLOW_HTTP2_KEEPALIVE_INTERVAL"], default: "1m", help: "how often every connection is pinged; 0: never", parse: duration(0) },
  http2KeepaliveTimeout: { flag: "--http2-keepalive-timeout", env: ["AIFLOW_HTTP2_KEEPALIVE_TIMEOUT"], default: "20s", help: "a connection whose ping is not answered within this is closed", parse: duration(10) },
  http2MaxResets: { flag: "--http2-max-resets", env: ["AIFLOW_HTTP2_MAX_RESETS"], default: "200", help: "streams a client may reset per --http2-reset-window before its connection is closed (rapid reset)", parse: int(1) },
  http2ResetWindow: { flag: "--http2-reset-window", env: ["AIFLOW_HTTP2_RESET_WINDOW"], default: "10s", help: "window of --http2-max-resets", parse: duration(10) },
  http2GoawayGrace: { flag: "--http2-goaway-grace", env: ["AIFLOW_HTTP2_GOAWAY_GRACE"], default: "30s", help: "after a GOAWAY either way, the connection is cut this much later", parse: duration(0) },
  maxInflightBytes: {
    flag: "--max-inflight-bytes",
    env: ["AIFLOW_MAX_INFLIGHT_BYTES"],
    default: "67108864",
    help: "request bytes held by calls in flight, daemon-wide; calls past it are refused RESOURCE_EXHAUSTED",
    parse: int(1024),
  },
  authFailureLimit: { flag: "--auth-failure-limit", env: ["AIFLOW_AUTH_FAILURE_LIMIT"], default: "50", help: "failed authentications an address may have per --auth-failure-window before its calls are refused", parse: int(1) },
  authFailureWindow: { flag: "--auth-failure-window", env: ["AIFLOW_AUTH_FAILURE_WINDOW"], default: "1m", help: "window of --auth-failure-limit (and how long the refusal lasts)", parse: duration(10) },
  healthWatchMax: { flag: "--health-watch-max", env: ["AIFLOW_HEALTH_WATCH_MAX"], default: "1000", help: "Health.Watch streams open at once, daemon-wide", parse: int(1) },
  healthWatchMaxPerAddress: { flag: "--health-watch-max-per-address", env: ["AIFLOW_HEALTH_WATCH_MAX_PER_ADDRESS"], default: "32", help: "Health.Watch streams open at once from one address", parse: int(1) },
  healthWatchLifetime: { flag: "--health-watch-lifetime", env: ["AIFLOW_HEALTH_WATCH_LIFETIME"], default: "10m", help: "a Health.Watch stream ends (status OK) after this; the client watches again", parse: duration(10) },
} satisfies Record<string, Setting<unknown>>;
