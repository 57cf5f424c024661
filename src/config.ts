/**
 * All configuration, in one place. Every setting has a flag, an AIFLOW_* environment variable and a
 * default; `aiflowd --help` prints this table. Flags win over the environment, which wins over defaults.
 * A bad value is a ConfigError naming the setting; the CLI prints it on one line and exits 2.
 */
import { hostname } from "node:os";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { ConfigError } from "./domain/errors.js";
import { DEFAULT_CREDIT, weightProblem } from "./domain/fair-share.js";
import { parseTokenSpec, parseTokensFile, type TokenGrant } from "./domain/tokens.js";
import { DEFAULT_MAX_LABEL_VALUES } from "./observability/label-values.js";

/** Where `npm run build` puts the web console, from src/ or dist/ alike (the console's HTTP handler is ./server/console.ts). */
const DEFAULT_CONSOLE_DIR = fileURLToPath(new URL("../dist/console/", import.meta.url));

export { ConfigError };

type Parser<T> = (raw: string, flag: string) => T;

interface Setting<T> {
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

const text: Parser<string> = (raw) => raw;

const bool: Parser<boolean> = (raw, flag) => {
  if (/^(true|1|yes|on)$/i.test(raw)) return true;
  if (/^(false|0|no|off)$/i.test(raw)) return false;
  throw new ConfigError(flag, `'${raw}' is not true or false`);
};

/** The trust domain of SPIFFE IDs: a DNS-like name (lower-case letters, digits, '.', '-', '_'). */
const trustDomain: Parser<string> = (raw, flag) => {
  if (!/^[a-z0-9._-]{1,255}$/.test(raw)) throw new ConfigError(flag, `'${raw}' is not a trust domain (lower-case letters, digits, '.', '-', '_')`);
  return raw;
};

/**
 * A Postgres URL as slonik reads it (with the WHATWG URL parser). libpq also takes a Unix socket's
 * directory as a `host` parameter after an empty host, `postgresql://user@/db?host=/run/postgresql`,
 * which that parser refuses once the URL names a user; such a URL is rewritten with the directory
 * percent-encoded as its host (and a `port` parameter as its port), which slonik and pg both read
 * as the socket's directory. Anything else that does not parse is refused here, naming the setting.
 */
const postgresUrl: Parser<string> = (raw, flag) => {
  const bad = (why: string) => new ConfigError(flag, `'${redactDatabaseUrl(raw)}' ${why}`);
  if (!/^postgres(ql)?:\/\//i.test(raw)) throw bad("is not a postgres:// or postgresql:// URL");
  if (URL.canParse(raw)) return raw;
  const m = /^(postgres(?:ql)?:\/\/)([^@/?#]*)@\/([^?#]*)(?:\?([^#]*))?$/i.exec(raw);
  const params = new URLSearchParams(m?.[4] ?? "");
  const host = params.get("host");
  if (!m || !host?.startsWith("/")) throw bad("is not a valid URL");
  const port = params.get("port");
  params.delete("host");
  params.delete("port");
  const query = params.toString();
  const rewritten = `${m[1]}${m[2]}@${encodeURIComponent(host)}${port ? `:${port}` : ""}/${m[3]}${query ? `?${query}` : ""}`;
  if (!URL.canParse(rewritten)) throw bad("is not a valid URL");
  return rewritten;
};

/**
 * The URL with its secrets masked, for logs and errors: the userinfo's password, and the value of
 * every query parameter whose name, percent-decoded as pg decodes it, ends in "password" (libpq's
 * password and sslpassword, in any case), which pg takes as well as the userinfo's. Works on text
 * that does not parse as a URL too.
 */
export const redactDatabaseUrl = (url: string) =>
  url
    .replace(/(:\/\/[^:/?#@]*:)[^@/?#]*@/, "$1****@")
    .replace(/([?&])([^=&#]*)=[^&#]*/g, (param, sep: string, name: string) => (/password$/i.test(decodedName(name)) ? `${sep}${name}=****` : param));

const decodedName = (name: string) => {
  try {
    return decodeURIComponent(name.replace(/\+/g, " "));
  } catch {
    return name;
  }
};

const int =
  (min: number, max = Number.MAX_SAFE_INTEGER): Parser<number> =>
  (raw, flag) => {
    if (!/^-?\d+$/.test(raw.trim())) throw new ConfigError(flag, `'${raw}' is not a whole number`);
    const n = Number(raw);
    if (n < min || n > max) throw new ConfigError(flag, `${n} is outside ${min}..${max}`);
    return n;
  };

const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** Durations are written 500ms, 30s, 5m, 2h, 7d (or a bare number of milliseconds). */
export function parseDuration(raw: string, flag = "duration"): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$/.exec(raw.trim());
  if (!m) throw new ConfigError(flag, `'${raw}' is not a duration (examples: 500ms, 30s, 5m, 2h)`);
  return Math.round(Number(m[1]) * UNITS[m[2] ?? "ms"]!);
}

const duration =
  (minMs: number, maxMs = Number.MAX_SAFE_INTEGER): Parser<number> =>
  (raw, flag) => {
    const ms = parseDuration(raw, flag);
    if (ms < minMs) throw new ConfigError(flag, `${raw} is shorter than the minimum ${minMs}ms`);
    if (ms > maxMs) throw new ConfigError(flag, `${raw} is longer than the maximum ${maxMs}ms`);
    return ms;
  };

const IDENT = /^[a-z_][a-z0-9_]{0,40}$/;
const identifier: Parser<string> = (raw, flag) => {
  if (!IDENT.test(raw)) throw new ConfigError(flag, `'${raw}' must match ${IDENT.source} (lower-case SQL identifier)`);
  return raw;
};

export interface ListenAddress {
  host: string;
  port: number;
}

/** host:port as a URL's authority writes it (an IPv6 host in brackets). */
export const formatAddress = ({ host, port }: ListenAddress): string => (host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`);
const listen: Parser<ListenAddress> = (raw, flag) => {
  const m = /^(?:\[([^\]]+)\]|([^:]+)):(\d{1,5})$/.exec(raw.trim());
  if (!m) throw new ConfigError(flag, `'${raw}' is not HOST:PORT`);
  const port = Number(m[3]);
  if (port > 65535) throw new ConfigError(flag, `port ${port} is above 65535`);
  return { host: m[1] ?? m[2]!, port };
};

/** A secret given as text: long enough to be one. Never echoed in an error. */
const secret =
  (minLength: number): Parser<string> =>
  (raw, flag) => {
    if (raw.length < minLength) throw new ConfigError(flag, `is ${raw.length} characters; a secret needs at least ${minLength} (openssl rand -hex 32 makes one)`);
    return raw;
  };

const level: Parser<string> = (raw, flag) => {
  const levels = ["trace", "debug", "info", "warn", "error", "fatal", "silent"];
  if (!levels.includes(raw)) throw new ConfigError(flag, `'${raw}' is not one of ${levels.join(", ")}`);
  return raw;
};

const oneOf =
  <T extends string>(values: readonly T[]): Parser<T> =>
  (raw, flag) => {
    if (!(values as readonly string[]).includes(raw)) throw new ConfigError(flag, `'${raw}' is not one of ${values.join(", ")}`);
    return raw as T;
  };

const list: Parser<string[]> = (raw) =>
  raw
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);

/** tenant=weight pairs (commas between), each weight within fair-share's bounds. */
const tenantWeights: Parser<Map<string, number>> = (raw, flag) => {
  const out = new Map<string, number>();
  for (const pair of list(raw, flag)) {
    const eq = pair.lastIndexOf("=");
    const tenant = eq > 0 ? pair.slice(0, eq).trim() : "";
    const weight = eq > 0 ? Number(pair.slice(eq + 1).trim()) : NaN;
    if (!tenant) throw new ConfigError(flag, `'${pair}' is not tenant=weight`);
    const problem = weightProblem(weight);
    if (problem) throw new ConfigError(flag, `the weight of '${tenant}' ${problem}`);
    out.set(tenant, weight);
  }
  return out;
};

const SETTINGS = {
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

type Settings = typeof SETTINGS;
type Parsed = {
  [K in keyof Settings]: Settings[K] extends { repeatable: true }
    ? ReturnType<Settings[K]["parse"]>[]
    : Settings[K]["default"] extends string
      ? ReturnType<Settings[K]["parse"]>
      : ReturnType<Settings[K]["parse"]> | undefined;
};

export interface Config extends Omit<Parsed, "tokens" | "instanceId"> {
  instanceId: string;
  /** Every grant from --token, AIFLOW_TOKENS and --tokens-file. Empty means the daemon runs open. */
  tokens: TokenGrant[];
}

export interface ParsedArgs {
  command: string | undefined;
  help: boolean;
  /** `--version` was given. */
  version: boolean;
  config: Config;
  /** Arguments that were not settings, after the command. */
  rest: string[];
}

/** Parses argv (without node and script) and the environment into a Config. Throws ConfigError. */
export function parseArgs(argv: readonly string[], env: NodeJS.ProcessEnv = process.env): ParsedArgs {
  const byFlag = new Map<string, keyof Settings>(Object.entries(SETTINGS).map(([k, s]) => [s.flag, k as keyof Settings]));
  const fromFlags = new Map<keyof Settings, string[]>();
  let command: string | undefined;
  let help = false;
  let version = false;
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--help" || arg === "-h") {
      help = true;
      continue;
    }
    if (arg === "--version") {
      version = true;
      continue;
    }
    if (arg.startsWith("--")) {
      const eq = arg.indexOf("=");
      const flag = eq >= 0 ? arg.slice(0, eq) : arg;
      const key = byFlag.get(flag);
      if (!key) throw new ConfigError(flag, "unknown flag (see --help)");
      const value = eq >= 0 ? arg.slice(eq + 1) : (SETTINGS[key] as Setting<unknown>).switch ? "true" : argv[++i];
      if (value === undefined) throw new ConfigError(flag, "needs a value");
      fromFlags.set(key, [...(fromFlags.get(key) ?? []), value]);
      continue;
    }
    if (command === undefined) command = arg;
    else rest.push(arg);
  }

  const out: Record<string, unknown> = {};
  for (const [key, s] of Object.entries(SETTINGS) as [keyof Settings, Setting<unknown>][]) {
    const flagValues = fromFlags.get(key);
    const envName = s.env.find((e) => env[e] !== undefined && env[e] !== "");
    const name = flagValues ? s.flag : envName ?? s.flag;
    if (s.repeatable) {
      const raws = flagValues ?? (envName ? env[envName]!.split(/[;\s]+/).filter(Boolean) : []);
      out[key] = raws.map((r) => s.parse(r, name));
      continue;
    }
    const raw = flagValues ? flagValues[flagValues.length - 1] : envName ? env[envName] : s.default;
    out[key] = raw === undefined ? undefined : s.parse(raw, name);
  }
  const parsed = out as Parsed;
  const tokens = [...parsed.tokens];
  if (parsed.tokensFile) tokens.push(...readTokensFile(parsed.tokensFile));
  const config: Config = {
    ...parsed,
    tokens,
    // Port 0 binds a random port, so HOST:0 would not tell instances on one host apart.
    instanceId: parsed.instanceId ?? `${hostname()}:${parsed.listen.port === 0 ? `pid${process.pid}` : parsed.listen.port}`,
  };
  if (config.backoffCap < config.backoffBase) throw new ConfigError("--backoff-cap", "is smaller than --backoff-base");
  if ((config.tlsCert === undefined) !== (config.tlsKey === undefined)) throw new ConfigError(config.tlsCert ? "--tls-key" : "--tls-cert", "--tls-cert and --tls-key go together");
  if (config.tlsClientCa !== undefined && config.tlsCert === undefined) throw new ConfigError("--tls-client-ca", "mutual TLS needs TLS: give --tls-cert and --tls-key too");
  if (config.insecurePlaintext && config.tlsCert !== undefined) throw new ConfigError("--insecure-plaintext", "contradicts --tls-cert: say one or the other");
  // A heartbeat buffered for longer than the liveness window would let a live agent be marked inactive.
  if (config.heartbeatFlush >= config.livenessIntervals * config.heartbeatInterval)
    throw new ConfigError("--heartbeat-flush", "must be shorter than --liveness-intervals × --heartbeat-interval");
  return { command, help, version, config, rest };
}

function readTokensFile(path: string): TokenGrant[] {
  let body: string;
  try {
    body = readFileSync(path, "utf8");
  } catch (err) {
    throw new ConfigError("--tokens-file", `cannot read ${path}: ${(err as Error).message}`);
  }
  return parseTokensFile(body, "--tokens-file");
}

/** The settings table for --help: flag, env vars, default, description. */
export function settingsHelp(): string {
  const rows = Object.values(SETTINGS).map((s: Setting<unknown>) => [
    s.switch ? s.flag : `${s.flag} ${s.repeatable ? "SPEC" : "VALUE"}`,
    s.env.join(", "),
    s.default ?? "",
    s.help,
  ]);
  const widths = [0, 1, 2].map((c) => Math.max(...rows.map((r) => r[c]!.length)));
  return rows.map((r) => r.map((cell, c) => (c < 3 ? cell.padEnd(widths[c]!) : cell)).join("  ")).join("\n");
}

/**
 * Config for tests and embedders: the defaults, except that the HTTP endpoints are off unless
 * asked for (`httpListen`): an embedding process, or a test starting several daemons, opens no
 * port it did not name.
 */
export function defaultConfig(overrides: Partial<Config> = {}): Config {
  return { ...parseArgs([], {}).config, httpListen: null, ...overrides };
}
