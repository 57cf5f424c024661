/** createAgent's options, their defaults, and the checks that run before anything is sent. */
import type { Interceptor } from "@connectrpc/connect";
import { pino, type Logger } from "pino";
import type { BackoffOptions } from "./backoff.js";
import type { Capacity } from "./liveness/capacity.js";
import type { Metrics } from "./liveness/metrics.js";
import { checkCapacity, checkHeartbeatMetrics, type HeartbeatMetrics } from "./resource-options.js";
import { TlsMaterial } from "./tls.js";
import type { Handlers } from "./types.js";

export interface AgentOptions {
  /**
   * The daemon, as `host:port` or a URL: `http://host:port` (h2c), `https://host:port` (TLS). A bare
   * `host:port` is `http://`, or `https://` when `tls` is given. Give this or `addresses`.
   */
  address?: string;
  /**
   * Several daemons sharing one database, tried in order: when the current one is unreachable the
   * agent fails over to the next. Give this or `address`.
   */
  addresses?: readonly string[];
  /** Bearer token with the `agent` role. @default none (a daemon without tokens, or a client certificate under mutual TLS) */
  token?: string;
  /**
   * TLS to the daemons, for every connection (the heartbeat thread's too). A string is a file path,
   * a Buffer PEM contents. `ca`: the CA bundle the daemons' certificates are checked against
   * (default: Node's public CAs). `cert` and `key` (together): the client certificate of mutual TLS;
   * under mTLS its `spiffe://<trust domain>/agent/<name>` URI lets the agent register as `<name>`
   * (or names under a prefix ending in `*`) with no token. `serverName`: the name the daemons'
   * certificate must carry (and SNI), when it is not the address's host. Files are read again when
   * they change, as each new connection is made (a reconnect, a failover), so rotated certificates
   * are taken up without a restart; a file that does not read or parse then leaves the last good
   * ones in use, with a warning. Any address given as `http://` contradicts this.
   * @default none: plaintext h2c, unless an address is `https://`
   */
  tls?: { ca?: string | Buffer; cert?: string | Buffer; key?: string | Buffer; serverName?: string };
  /**
   * The agent's name, its identity across restarts: 1-128 characters of `[A-Za-z0-9._:-]`. Two live
   * processes must not share one.
   */
  name: string;
  /** Tenant keys whose work this agent takes. */
  tenants: readonly string[];
  /** Engine kinds this agent runs. @default the keys of `handlers` (except `"*"`) */
  engineKinds?: readonly string[];
  /** Labels work items select agents by (an item's selector must be a subset). @default {} */
  tags?: Readonly<Record<string, string>>;
  /** Models loaded on this agent; informational. @default [] */
  models?: readonly string[];
  /** How many items run at once; claims ask for the free ones (and for `prefetch`). @default 1 */
  slots?: number;
  /**
   * The most claimed items the agent holds beyond its slots, each waiting (leased) for a slot. The
   * agent claims ahead only as many as its slots finish during one claim round trip, by the measured
   * time of its handlers and its claims, so an agent whose handlers are slower than a round trip
   * claims only for its free slots. Ahead-claimed items are given back when a drain begins. 0 turns
   * claiming ahead off. Claims are clamped to the daemon's `--claim-max-items` (256 by default).
   * @default 3 × slots, at most 256 − slots (so that a claim stays within the daemon's default cap)
   */
  prefetch?: number;
  /** Handlers by engine kind and task name (see `Handlers`). */
  handlers: Handlers;
  /**
   * Mount points whose free and total space heartbeats report, and which the agent registers as
   * disks, after the disk of its work directory (the process's current directory), which comes
   * first in both. @default ["/"]
   */
  mounts?: readonly string[];
  /**
   * What the agent registers as its resources, for work that states requirements (GPUs, GPU memory,
   * CPU, memory, disk: see the README's "Resources"). By default detected once, at start: cores
   * (`os.availableParallelism()`, in thousandths), memory (the machine's, or the process's cgroup
   * limit when lower), the GPUs `nvidia-smi` lists (none without it), and the disk of the work
   * directory followed by those of `mounts`. Each field given replaces what would be detected, and
   * is then not detected (`gpus` given: nvidia-smi is not run): `{ gpus: [] }` offers no GPUs,
   * `{ gpus: [{ index: 0, model: "A100", memoryMb: 40960 }] }` offers GPU 0 alone, which is how
   * agents sharing one machine split it. `false` registers none: the agent takes only work without
   * requirements. The daemon grants only what the heartbeats also report free, so GPUs and disks
   * stated here that the machine does not have (simulated agents, tests) need `heartbeatMetrics`
   * to report them too. Memory and disk in MiB.
   * @default detected
   */
  capacity?: Partial<Capacity> | false;
  /**
   * Figures heartbeats report in place of measuring them (CPU utilisation, memory, disks, GPUs),
   * for simulated agents and tests; each part given replaces that part of the measured report as a
   * whole and stays as given. Memory and disk in MiB.
   * @default none: heartbeats report what they measure
   */
  heartbeatMetrics?: HeartbeatMetrics;
  /** Where the agent logs; handlers get children of it. @default pino at level "info" on stdout */
  logger?: Logger;
  /**
   * How long `drain()` (and SIGTERM/SIGINT with `handleSignals`) lets in-flight items finish before
   * aborting them and giving them back to the queue.
   * @default 30000
   */
  gracefulShutdownMs?: number;
  /**
   * Installs SIGTERM and SIGINT handlers: the first signal drains within `gracefulShutdownMs`, a
   * second one exits the process at once (code 128 + the signal's number). They are removed when
   * the agent stops.
   * @default false
   */
  handleSignals?: boolean;
  /**
   * What the agent does once a drain the daemon ordered (an operator's `aiflowctl drain`) has
   * finished its in-flight work: `"pause"` stays registered, heartbeating and following directives
   * without claiming, and resumes claiming when the agent is undrained; `"exit"` deregisters and
   * stops, as `drain()` does. A drain the process asked for (`drain()`, `stop()`, a signal) always stops.
   * @default "pause"
   */
  onDaemonDrain?: "pause" | "exit";
  /** Reported to the daemon (shown in the fleet, used by drain selectors). @default "" */
  agentVersion?: string;
  /** Reported to the daemon. @default process.argv[1] (the script being run), else "" */
  binaryPath?: string;
  /** Where this agent itself can be reached, for operators. @default {} */
  advertise?: { http?: string; grpc?: string; infra?: string };
  /** @default "remote" */
  agentType?: "remote" | "local";
  /** How long one claim long-poll waits for work; the daemon caps it. @default 20000 */
  claimWaitMs?: number;
  /** Completions and failures arriving within this window share one RPC. @default 5 */
  reportCoalesceMs?: number;
  /** At most this many reports per RPC. @default 500 */
  reportMaxBatch?: number;
  /** Deadline of every unary call (claims get their wait on top). @default 10000 */
  rpcTimeoutMs?: number;
  /** Reconnect delays: capped exponential backoff with jitter. @default { initialDelayMs: 200, maxDelayMs: 10000 } */
  reconnect?: BackoffOptions;
  /**
   * HTTP/2 pings on the connection to the daemon: one every `intervalMs`, and a connection whose
   * ping goes unanswered for `timeoutMs` is taken for dead (a half-open path: a dropped flow, a
   * hung host), closed, and the agent reconnects, also while a long-poll claim waits on it.
   * @default { intervalMs: 10000, timeoutMs: 5000 }
   */
  keepalive?: { intervalMs?: number; timeoutMs?: number };
  /**
   * Connect interceptors for every call of the main connection (tracing, metrics). The heartbeat
   * thread has a connection of its own and does not run them.
   * @default []
   */
  interceptors?: readonly Interceptor[];
  /**
   * Unary calls and the agent stream over the SDK's own HTTP/2 exchange with its compiled codec
   * (@aiflow/wire/client), which spends less of the agent's CPU per item; false: over
   * connect-node's gRPC transport, the well-kept library every fault test runs first (server
   * streams always go through it).
   * @default false
   */
  fastTransport?: boolean;
  /**
   * With several addresses, how often (on average, with jitter of ±50 %) an agent that failed over
   * away from its home daemon (its name hashed over the addresses, so a fleet given one list spreads
   * over it) tries to go back; on the stream it moves only at a moment it holds no item. 0: never.
   * @default 30000
   */
  failbackMs?: number;
  /**
   * Takes work and the daemon's directives over one long-lived stream (AgentService.Connect), and
   * reports on it; false: by unary claims and the WatchDirectives stream, as against a daemon that
   * has no such stream (the agent falls back to those by itself when the daemon answers UNIMPLEMENTED).
   * @default true
   */
  stream?: boolean;
  /**
   * Serves the agent's own Prometheus metrics (items, handler seconds, claims, RPC errors,
   * reconnects, and prom-client's process metrics) at `GET /metrics` on this port, over plain
   * HTTP without authentication, from start() until the agent stops. 0 takes a free port
   * (`agent.metricsAddress` says which). A port that cannot be had makes start() fail.
   * @default none: no metrics endpoint, and prom-client is not loaded
   */
  metricsPort?: number;
  /** The address the metrics endpoint listens on. Anything but loopback exposes it to the network. @default "127.0.0.1" */
  metricsHost?: string;
}

export interface ResolvedOptions {
  addresses: string[];
  /** The addresses as base URLs (`http://` or `https://`), in the same order. */
  urls: string[];
  /** TLS material, read once here; undefined for plaintext (or `https://` with Node's defaults). */
  tls: TlsMaterial | undefined;
  /** What `tls` gave, for the heartbeat thread to read (and re-read) itself. */
  tlsSource: AgentOptions["tls"];
  token: string | undefined;
  name: string;
  tenants: string[];
  engineKinds: string[];
  tags: Record<string, string>;
  models: string[];
  slots: number;
  prefetch: number;
  handlers: Handlers;
  mounts: string[];
  /** The directory whose disk is registered first: the process's current directory when the agent was made. */
  workDir: string;
  /** What of the capacity is given (the rest is detected at start); false: none is registered. */
  capacity: Partial<Capacity> | false;
  /** What heartbeats report in place of measuring it, in the heartbeat thread's terms (bytes). */
  heartbeatMetrics: Partial<Metrics>;
  logger: Logger;
  gracefulShutdownMs: number;
  handleSignals: boolean;
  onDaemonDrain: "pause" | "exit";
  agentVersion: string;
  binaryPath: string;
  advertise: { http: string; grpc: string; infra: string };
  agentType: "remote" | "local";
  claimWaitMs: number;
  reportCoalesceMs: number;
  reportMaxBatch: number;
  rpcTimeoutMs: number;
  reconnect: Required<BackoffOptions>;
  keepalive: { intervalMs: number; timeoutMs: number };
  interceptors: Interceptor[];
  fastTransport: boolean;
  failbackMs: number;
  stream: boolean;
  /** Where the metrics endpoint listens; undefined when there is none. */
  metrics: { host: string; port: number } | undefined;
}

const IDENT = /^[A-Za-z0-9._:-]{1,128}$/;
/**
 * The daemon's default --claim-max-items. A claim it clamps brings fewer items than asked, which the
 * claim loop reads as "the queue ran dry" (no round trip measured, completions not held for the
 * next claim), so the default prefetch keeps claims within it.
 */
const DAEMON_CLAIM_CAP = 256;

/** Fills the defaults and rejects what the daemon would refuse anyway, with a message naming the option. */
export function resolveOptions(o: AgentOptions): ResolvedOptions {
  const addresses = [...(o.addresses ?? []), ...(o.address ? [o.address] : [])];
  if (o.address && o.addresses?.length) bad("address", "and addresses are exclusive: give one");
  if (addresses.length === 0) bad("address", "is required (or addresses)");
  if (!IDENT.test(o.name ?? "")) bad("name", `must be 1-128 characters of [A-Za-z0-9._:-], got '${o.name}'`);
  if (!o.tenants?.length) bad("tenants", "needs at least one tenant key");
  for (const t of o.tenants) if (!IDENT.test(t)) bad("tenants", `has an invalid key '${t}'`);
  if (!o.handlers || Object.keys(o.handlers).length === 0) bad("handlers", "needs at least one handler");
  const kinds = o.engineKinds ? [...o.engineKinds] : Object.keys(o.handlers).filter((k) => k !== "*");
  if (kinds.length === 0) bad("engineKinds", "is required when the only handler is '*'");
  for (const k of kinds) if (!IDENT.test(k)) bad("engineKinds", `has an invalid kind '${k}'`);
  const slots = o.slots ?? 1;
  if (!Number.isInteger(slots) || slots < 1 || slots > 100_000) bad("slots", `must be a whole number in 1..100000, got ${slots}`);
  const prefetch = o.prefetch ?? Math.max(0, Math.min(3 * slots, DAEMON_CLAIM_CAP - slots));
  if (!Number.isInteger(prefetch) || prefetch < 0 || prefetch > 100_000) bad("prefetch", `must be a whole number in 0..100000, got ${prefetch}`);
  const logger = o.logger ?? pino({ name: "aiflow-agent", level: "info" });
  const tls = o.tls ? tlsMaterial(o.tls, logger.child({ agent: o.name })) : undefined;
  for (const a of addresses)
    if (tls && /^http:\/\//.test(a))
      bad(o.address ? "address" : "addresses", `'${a}' is plaintext (http://), but tls is given: write https:// or leave the scheme out`);
  const urls = addresses.map((a) => baseUrl(a, tls !== undefined));
  const positive = (name: string, v: number | undefined, dflt: number, min = 0) => {
    const n = v ?? dflt;
    if (!Number.isFinite(n) || n < min) bad(name, `must be a number >= ${min}, got ${n}`);
    return n;
  };
  return {
    addresses,
    urls,
    tls,
    tlsSource: o.tls,
    token: o.token || undefined,
    name: o.name,
    tenants: [...o.tenants],
    engineKinds: kinds,
    tags: { ...(o.tags ?? {}) },
    models: [...(o.models ?? [])],
    slots,
    prefetch,
    handlers: o.handlers,
    mounts: [...(o.mounts ?? ["/"])],
    workDir: process.cwd(),
    capacity: checkCapacity(o.capacity, bad),
    heartbeatMetrics: checkHeartbeatMetrics(o.heartbeatMetrics, bad),
    logger,
    gracefulShutdownMs: positive("gracefulShutdownMs", o.gracefulShutdownMs, 30_000),
    handleSignals: o.handleSignals ?? false,
    onDaemonDrain: onDaemonDrain(o.onDaemonDrain),
    agentVersion: o.agentVersion ?? "",
    binaryPath: o.binaryPath ?? process.argv[1] ?? "",
    advertise: { http: o.advertise?.http ?? "", grpc: o.advertise?.grpc ?? "", infra: o.advertise?.infra ?? "" },
    agentType: o.agentType ?? "remote",
    claimWaitMs: positive("claimWaitMs", o.claimWaitMs, 20_000),
    reportCoalesceMs: positive("reportCoalesceMs", o.reportCoalesceMs, 5),
    reportMaxBatch: positive("reportMaxBatch", o.reportMaxBatch, 500, 1),
    rpcTimeoutMs: positive("rpcTimeoutMs", o.rpcTimeoutMs, 10_000, 1),
    reconnect: {
      initialDelayMs: positive("reconnect.initialDelayMs", o.reconnect?.initialDelayMs, 200, 1),
      maxDelayMs: positive("reconnect.maxDelayMs", o.reconnect?.maxDelayMs, 10_000, 1),
    },
    keepalive: {
      intervalMs: positive("keepalive.intervalMs", o.keepalive?.intervalMs, 10_000, 1),
      timeoutMs: positive("keepalive.timeoutMs", o.keepalive?.timeoutMs, 5_000, 1),
    },
    interceptors: [...(o.interceptors ?? [])],
    fastTransport: o.fastTransport ?? false,
    failbackMs: positive("failbackMs", o.failbackMs, 30_000),
    stream: o.stream ?? true,
    metrics: metricsListen(o.metricsPort, o.metricsHost),
  };
}

function metricsListen(port: number | undefined, host: string | undefined): ResolvedOptions["metrics"] {
  if (port === undefined) {
    if (host !== undefined) bad("metricsHost", "needs metricsPort: the endpoint is served only when a port is given");
    return undefined;
  }
  if (!Number.isInteger(port) || port < 0 || port > 65_535) bad("metricsPort", `must be a whole number in 0..65535, got ${port}`);
  if (host !== undefined && (typeof host !== "string" || host === "")) bad("metricsHost", `must be a host name or address, got ${JSON.stringify(host)}`);
  return { host: host ?? "127.0.0.1", port };
}

function bad(option: string, why: string): never {
  throw new TypeError(`createAgent: ${option} ${why}`);
}

/** `host:port` or a URL, as a base URL for the transport; a bare address is https:// when TLS is configured. */
export function baseUrl(address: string, tls = false): string {
  return /^https?:\/\//.test(address) ? address.replace(/\/+$/, "") : `${tls ? "https" : "http"}://${address}`;
}

/** The TLS material, read now so that a file missing or malformed fails createAgent, naming the option. */
function tlsMaterial(t: NonNullable<AgentOptions["tls"]>, logger: Logger): TlsMaterial {
  if ((t.cert === undefined) !== (t.key === undefined))
    bad("tls.cert", `and tls.key go together: give both (got only tls.${t.cert === undefined ? "key" : "cert"})`);
  if (t.serverName !== undefined && (typeof t.serverName !== "string" || t.serverName === ""))
    bad("tls.serverName", `must be a host name, got ${JSON.stringify(t.serverName)}`);
  const material = new TlsMaterial(t, {
    warn: (message) => logger.warn(`TLS: ${message}`),
    reloaded: (parts) => logger.info({ parts }, "TLS: files changed: new connections present what they hold now"),
  });
  try {
    material.load();
  } catch (err) {
    throw new TypeError(`createAgent: ${(err as Error).message}`);
  }
  return material;
}

function onDaemonDrain(v: AgentOptions["onDaemonDrain"]): "pause" | "exit" {
  if (v === undefined || v === "pause" || v === "exit") return v ?? "pause";
  throw new TypeError(`onDaemonDrain must be "pause" or "exit", got ${JSON.stringify(v)}`);
}
