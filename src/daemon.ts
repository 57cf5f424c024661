/**
 * Assembles one daemon instance: database (given or embedded), migrations, pool, services, server.
 * `stop()` undoes it in reverse order: server first (so no call sees a closed pool), then background
 * loops, then the pool, then the embedded database.
 */
import type { DatabasePool } from "slonik";
import "./util/protobuf-text.js";
import { systemClock, type Clock } from "./clock.js";
import { ConfigError, redactDatabaseUrl, type Config } from "./config.js";
import { startEmbeddedPostgres, type EmbeddedPostgres } from "./db/embedded.js";
import { migrate } from "./db/migrate.js";
import { openPoolWhenReachable } from "./db/pool.js";
import { Tables } from "./db/tables.js";
import type { Logger } from "./log.js";
import { Authenticator } from "./server/auth.js";
import { errorInterceptor } from "./server/errors.js";
import { rpcSpanInterceptor } from "./observability/rpc-spans.js";
import { DaemonMetrics } from "./observability/metrics.js";
import { rpcMetricsInterceptor } from "./observability/rpc-metrics.js";
import { startHttpEndpoints, type HttpEndpoints } from "./server/http-endpoints.js";
import type { TLSSocket } from "node:tls";
import { socketIdentity } from "./server/cert-identity.js";
import { consoleApi, consoleFiles } from "./server/console.js";
import { startServer, type RunningServer, type ServerLimits } from "./server/server.js";
import type { ServerStats } from "./server/stats.js";
import type { ReloadOutcome } from "./server/tls.js";
import { buildServices, type Background, type Services } from "./services.js";
import { VERSION } from "./util/package-version.js";

export interface Daemon {
  readonly address: string;
  readonly port: number;
  readonly databaseUrl: string;
  readonly pool: DatabasePool;
  readonly tables: Tables;
  /** The sweeps and the heartbeat flush, to run now (tests drive them with a fake clock). */
  readonly maintenance: Services["maintenance"];
  /** What the server refused or cut, by cause (counters for a metrics exporter). */
  readonly serverStats: ServerStats;
  /** "https" when the port serves TLS, "http" for h2c. */
  readonly scheme: "https" | "http";
  /** The HTTP endpoints (/metrics, /healthz, /readyz) as `scheme://host:port`; undefined with --http-listen off. */
  readonly httpUrl: string | undefined;
  /** Where /metrics is served when --metrics-listen gives it an address of its own. */
  readonly metricsUrl: string | undefined;
  /** This daemon's metrics (its registry is what /metrics serves, beside the process metrics). */
  readonly metrics: DaemonMetrics;
  /** Re-reads the TLS certificate, key and client CA (SIGHUP); open connections keep theirs. */
  reloadTls(): ReloadOutcome;
  /** Graceful stop; idempotent. */
  stop(): Promise<void>;
}

export interface DaemonOptions {
  log: Logger;
  clock?: Clock;
}

const LOOPBACK = /^(127\.\d+\.\d+\.\d+|::1|localhost)$/;

export async function startDaemon(config: Config, { log, clock = systemClock }: DaemonOptions): Promise<Daemon> {
  const auth = new Authenticator(config.tokens, config.tlsClientCa !== undefined);
  const loopback = LOOPBACK.test(config.listen.host);
  if (auth.open) {
    if (!loopback)
      throw new ConfigError(
        "--listen",
        `no tokens are configured, so aiflowd only serves loopback; give --token/--tokens-file (or --tls-client-ca) to listen on ${config.listen.host}`,
      );
    log.warn("NO TOKENS CONFIGURED: every RPC is open to any local caller; set --token or AIFLOW_TOKENS before exposing this daemon");
  }
  // Secure by default: past loopback, tokens must not cross the network in clear.
  if (config.tlsCert === undefined && !loopback) {
    if (!config.insecurePlaintext)
      throw new ConfigError(
        "--listen",
        `${config.listen.host} is not loopback, so aiflowd serves it over TLS only: give --tls-cert and --tls-key, or --insecure-plaintext when a TLS-terminating proxy sits in front`,
      );
    log.warn(
      { listen: config.listen.host },
      "--insecure-plaintext: serving h2c on a non-loopback address; bearer tokens cross this network in clear unless a proxy in front terminates TLS",
    );
  }
  const http = config.httpListen;
  const metricsAt = config.metricsListen;
  for (const [flag, where] of [
    ["--http-listen", http],
    ["--metrics-listen", metricsAt],
  ] as const) {
    if (!where || LOOPBACK.test(where.host)) continue;
    if (config.tlsCert === undefined && !config.insecurePlaintext)
      throw new ConfigError(
        flag,
        `${where.host} is not loopback, so aiflowd serves it over TLS only: give --tls-cert and --tls-key, or --insecure-plaintext, or listen on 127.0.0.1`,
      );
    const servesMetrics = flag === "--metrics-listen" || !metricsAt;
    if (servesMetrics && !config.metricsToken && !config.tlsClientCa)
      log.warn(
        { [flag === "--http-listen" ? "httpListen" : "metricsListen"]: where.host },
        `/metrics is open to anyone who reaches ${flag}; set --metrics-token (or mutual TLS) to require a credential, or serve it apart with --metrics-listen on loopback`,
      );
  }

  const embedded: EmbeddedPostgres | undefined = config.databaseUrl
    ? undefined
    : await startEmbeddedPostgres({ dataDir: config.dataDir, port: config.embeddedPort, log: log.child({ component: "embedded-postgres" }) });
  const url = config.databaseUrl ?? embedded!.url;
  log.info({ database: redactDatabaseUrl(url), embedded: embedded !== undefined, schema: config.schema, prefix: config.tablePrefix }, "using database");

  const cleanups: (() => Promise<unknown>)[] = [];
  const undo = async () => {
    for (const c of cleanups.reverse()) await c().catch((err) => log.error({ err }, "error during shutdown"));
  };
  if (embedded) cleanups.push(() => embedded.stop());
  try {
    const pool = await openPoolWhenReachable({ url, maxConnections: config.dbPoolSize }, log, config.dbConnectTimeout);
    cleanups.push(() => pool.end());
    const naming = { schema: config.schema, prefix: config.tablePrefix };
    const { current } = await migrate(url, naming, log);
    log.debug({ migration: current }, "schema current");
    const tables = new Tables(naming.schema, naming.prefix);

    const draining = new AbortController();
    const metrics = new DaemonMetrics({ maxLabelValues: config.metricsMaxLabelValues });
    const services = await buildServices({ config, log, clock, pool, tables, databaseUrl: url, draining: draining.signal, metrics });
    cleanups.push(() => stopBackground(services.background, log));
    // Tracing first (its span holds the call), then metrics: both see the code the error interceptor made.
    const interceptors = [rpcSpanInterceptor(), rpcMetricsInterceptor(metrics.registry), errorInterceptor(log), auth.interceptor(services.access)];
    const readMaxBytes = config.payloadMaxBytes * 2 + 1024 * 1024;
    const server: RunningServer = await startServer({
      host: config.listen.host,
      port: config.listen.port,
      routes: services.routes,
      interceptors,
      log,
      readMaxBytes,
      auth: { authenticator: auth, access: services.access },
      limits: serverLimits(config),
      clock,
      fastPath: config.grpcFastPath === "on",
      tls: config.tlsCert
        ? { files: { cert: config.tlsCert, key: config.tlsKey!, clientCa: config.tlsClientCa }, trustDomain: config.tlsTrustDomain }
        : undefined,
    });
    server.draining.addEventListener("abort", () => draining.abort());
    metrics.watchServer(server.stats);
    // Closed after the gRPC server, so that /readyz says "shutting down" for the whole drain.
    let endpoints: HttpEndpoints | undefined;
    let metricsEndpoint: HttpEndpoints | undefined;
    cleanups.push(async () => endpoints?.close());
    cleanups.push(async () => metricsEndpoint?.close());
    cleanups.push(() => server.close(config.shutdownGrace));
    cleanups.push(async () => services.onShutdown());
    const httpCommon = {
      log: log.child({ component: "http" }),
      registry: metrics.registry,
      readiness: () => services.readiness.report(),
      metricsToken: config.metricsToken,
      limits: {
        maxConnections: config.httpMaxConnections,
        maxConnectionsPerAddress: config.httpMaxConnectionsPerAddress,
        requestTimeoutMs: config.httpRequestTimeout,
      },
      tls: server.tls ? { reloader: server.tls, mutual: config.tlsClientCa !== undefined, trustDomain: config.tlsTrustDomain } : undefined,
    };
    if (metricsAt) {
      // The scrape and the probes alone, apart from the port that takes webhooks.
      metricsEndpoint = await startHttpEndpoints({ ...httpCommon, host: metricsAt.host, port: metricsAt.port, flag: "--metrics-listen" });
      log.info(
        { address: `${metricsEndpoint.scheme}://${metricsEndpoint.address}`, metricsToken: config.metricsToken !== undefined },
        "aiflowd serving /metrics, /healthz and /readyz",
      );
    }
    if (http) {
      endpoints = await startHttpEndpoints({
        ...httpCommon,
        host: http.host,
        port: http.port,
        metrics: !metricsAt,
        webhooks: services.webhooks,
        console: {
          files: consoleFiles(config.consoleDir).handler,
          // The gRPC port's routes, interceptors, handler and gate, over the Connect protocol alone.
          api: consoleApi({
            routes: services.routes,
            interceptors,
            readMaxBytes,
            shutdownSignal: server.draining,
            gate: server.gate,
            healthWatchLifetimeMs: config.healthWatchLifetime,
            peer: config.tlsClientCa ? (req) => socketIdentity(req.socket as TLSSocket, config.tlsTrustDomain) : undefined,
            log,
          }),
        },
      });
      log.info(
        { address: `${endpoints.scheme}://${endpoints.address}`, metricsToken: config.metricsToken !== undefined },
        `aiflowd serving ${metricsAt ? "" : "/metrics, "}/healthz, /readyz and webhooks at /hooks/<tenant>/<trigger>`,
      );
      log.info({ console: `${endpoints.scheme}://${endpoints.address}/console/` }, "operators' console: sign in with an ops token");
    }
    // Last, once every port serves: starters wait for this line.
    log.info(
      {
        address: `${server.scheme}://${server.address}`,
        tls: server.scheme === "https" ? (config.tlsClientCa ? "mutual" : "server") : "off",
        instance: config.instanceId,
        version: VERSION,
      },
      "aiflowd serving gRPC",
    );

    let stopping: Promise<void> | undefined;
    return {
      address: server.address,
      port: server.port,
      databaseUrl: url,
      pool,
      tables,
      maintenance: services.maintenance,
      serverStats: server.stats,
      scheme: server.scheme,
      httpUrl: endpoints ? `${endpoints.scheme}://${endpoints.address}` : undefined,
      metricsUrl: metricsEndpoint ? `${metricsEndpoint.scheme}://${metricsEndpoint.address}` : undefined,
      metrics,
      reloadTls: () => server.reloadTls(),
      stop: () => (stopping ??= undo().then(() => log.info("aiflowd stopped"))),
    };
  } catch (err) {
    await undo();
    throw err;
  }
}

export function serverLimits(config: Config): ServerLimits {
  return {
    maxConnections: config.maxConnections,
    maxConnectionsPerAddress: config.maxConnectionsPerAddress,
    maxConcurrentStreams: config.http2MaxConcurrentStreams,
    prefaceTimeoutMs: config.http2PrefaceTimeout,
    headersTimeoutMs: config.http2HeadersTimeout,
    idleTimeoutMs: config.http2IdleTimeout,
    keepaliveIntervalMs: config.http2KeepaliveInterval,
    keepaliveTimeoutMs: config.http2KeepaliveTimeout,
    maxResets: config.http2MaxResets,
    resetWindowMs: config.http2ResetWindow,
    goawayGraceMs: config.http2GoawayGrace,
    maxInflightBytes: config.maxInflightBytes,
    bodyTimeoutMs: config.http2BodyTimeout,
    authFailureLimit: config.authFailureLimit,
    authFailureWindowMs: config.authFailureWindow,
    healthWatchMax: config.healthWatchMax,
    healthWatchMaxPerAddress: config.healthWatchMaxPerAddress,
    healthWatchLifetimeMs: config.healthWatchLifetime,
  };
}

/**
 * In order: the sweeps stop before this instance marks itself stopped, so a late keep-alive cannot
 * undo it. A step that fails (the database went away: a Ctrl-C reaches an embedded Postgres too) is
 * logged and the rest still stop; stopping at the first failure left the listener reconnecting
 * forever and the process never exited.
 */
export async function stopBackground(background: readonly Background[], log: Logger): Promise<void> {
  for (const b of background) await b.stop().catch((err: unknown) => log.error({ err }, "error while stopping a background loop; stopping the rest"));
}
