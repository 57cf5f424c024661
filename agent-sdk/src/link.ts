/**
 * The agent's connection to the daemons: one HTTP/2 session per address, failover between them, and
 * recovery. Any component whose call fails hands the failure to `recover()`; the first caller starts
 * one shared recovery (try each address in turn, register again, back off with jitter between
 * rounds), the others wait for it. A caller that saw an older generation than the current one
 * returns at once: somebody already recovered after its failure.
 *
 * Registering again is part of every recovery because it is idempotent and the daemon on the other
 * side may be new, restarted, or may have marked this agent inactive meanwhile.
 */
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import type { Logger } from "pino";
import { pushbackMs, retryDelay, sleep } from "./backoff.js";
import { AgentFailedError } from "./errors.js";
import { createSdkGrpcTransport } from "@aiflow/wire/client";
import { GuardedSessionManager } from "@aiflow/wire/client/session-manager";
import { tlsFailure } from "@aiflow/wire/client/tls-failure";
import { AgentService } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import type { ResolvedOptions } from "./options.js";

export type AgentClient = Client<typeof AgentService>;

/** Codes after which the same call can succeed later, or elsewhere. */
const TRANSIENT: ReadonlySet<Code> = new Set([
  Code.Unavailable,
  Code.Unknown,
  Code.Internal,
  Code.DeadlineExceeded,
  Code.Aborted,
  Code.ResourceExhausted,
  Code.Canceled,
]);

export const isTransient = (err: unknown) => TRANSIENT.has(ConnectError.from(err).code);

export const errorText = (err: unknown) => (err instanceof Error ? err.message : String(err));

interface Target {
  address: string;
  session: GuardedSessionManager;
  client: AgentClient;
}

export interface LinkHooks {
  /** Registers through `client`; throwing a non-transient error makes the agent fail. */
  register(client: AgentClient, address: string): Promise<void>;
  onDisconnected(err: unknown): void;
  /** Registration was refused for good; every pending and later recovery rejects with `err`. */
  onFatal(err: AgentFailedError): void;
}

export class Link {
  readonly #targets: Target[];
  readonly #opts: ResolvedOptions;
  readonly #log: Logger;
  readonly #hooks: LinkHooks;
  readonly #closed = new AbortController();
  #current: number;
  /** The daemon this agent belongs on while every daemon is up (see homeIndex). */
  readonly #home: number;
  #generation = 0;
  #recovering: Promise<void> | undefined;
  #fatal: AgentFailedError | undefined;

  /** `interceptors` run outermost, before the token's and `opts.interceptors`. */
  constructor(opts: ResolvedOptions, log: Logger, hooks: LinkHooks, interceptors: readonly Interceptor[] = []) {
    this.#opts = opts;
    this.#log = log;
    this.#hooks = hooks;
    const auth: Interceptor[] = opts.token ? [(next) => (req) => (req.header.set("authorization", `Bearer ${opts.token}`), next(req))] : [];
    // Each new session, to any daemon, presents the TLS material as its files hold it then (tls.js).
    const tls = opts.tls;
    const nodeOptions = tls ? { createConnection: (authority: URL) => tls.connect(authority) } : undefined;
    this.#targets = opts.addresses.map((address, i) => {
      const url = opts.urls[i]!;
      // Pings find a dead connection while a long-poll or the directive stream waits on it.
      const session = new GuardedSessionManager(url, { pingIntervalMs: opts.keepalive.intervalMs, pingTimeoutMs: opts.keepalive.timeoutMs }, nodeOptions);
      // Innermost, so that every interceptor (the caller's own too) sees a torn-down call as UNAVAILABLE.
      const transportOptions = { baseUrl: url, sessionManager: session, interceptors: [...interceptors, ...auth, ...opts.interceptors, tornDownIsUnavailable] };
      const transport = opts.fastTransport ? createSdkGrpcTransport(transportOptions) : createGrpcTransport(transportOptions);
      return { address, session, client: createClient(AgentService, transport) };
    });
    this.#home = this.#current = homeIndex(opts.name, this.#targets.length);
  }

  /** The client of the daemon the agent is registered with. */
  get client(): AgentClient {
    return this.#targets[this.#current]!.client;
  }

  get address(): string {
    return this.#targets[this.#current]!.address;
  }

  /** Index of the current daemon in the addresses. */
  get index(): number {
    return this.#current;
  }

  /** On a daemon other than its home one, and not recovering: failback may move it (goHome). */
  get away(): boolean {
    return this.#current !== this.#home && this.#recovering === undefined && !this.#closed.signal.aborted && this.#fatal === undefined;
  }

  /**
   * Failback: registers with the home daemon and makes it the current one. False, with nothing
   * changed, when it does not answer or refuses; a recovery started meanwhile wins (it registered
   * wherever it could). Calls made on the old daemon's client finish there: leases and reports are
   * good at any daemon.
   */
  async goHome(): Promise<boolean> {
    if (!this.away) return false;
    const home = this.#targets[this.#home]!;
    try {
      await this.#hooks.register(home.client, home.address);
    } catch (err) {
      this.#log.debug({ address: home.address, err: errorText(err) }, "failback: the home daemon cannot take this agent yet");
      return false;
    }
    if (this.#recovering !== undefined || this.#closed.signal.aborted) return false;
    const from = this.address;
    this.#current = this.#home;
    this.#generation++;
    this.#log.info({ from, address: home.address }, "failback: back on the home daemon");
    return true;
  }

  /** The client `offset` places after the current one, for calls that go round the daemons themselves. */
  clientAt(offset: number): AgentClient {
    return this.#targets[(this.#current + offset) % this.#targets.length]!.client;
  }

  /**
   * Deregisters `name`, going round the daemons within rpcTimeoutMs; a daemon that cannot be told
   * marks the agent inactive anyway once its heartbeats stop, so this never fails.
   */
  async deregister(name: string): Promise<void> {
    const deadline = Date.now() + this.#opts.rpcTimeoutMs;
    for (let attempt = 0; ; attempt++) {
      try {
        await this.clientAt(attempt).deregister({ name }, { timeoutMs: Math.max(1, deadline - Date.now()) });
        this.#log.info("deregistered");
        return;
      } catch (err) {
        if (!isTransient(err) || Date.now() >= deadline) {
          this.#log.warn({ err: errorText(err) }, "could not deregister: the daemon marks this agent inactive once its heartbeats stop");
          return;
        }
        await sleep(Math.min(retryDelay(err, attempt, this.#opts.reconnect), Math.max(0, deadline - Date.now())));
      }
    }
  }

  /** Bumped by every successful registration; 0 until the first. */
  get generation(): number {
    return this.#generation;
  }

  /** The first registration (retried until it works, the agent fails, or the link closes). */
  connect(): Promise<void> {
    return this.recover(0, undefined);
  }

  /**
   * Re-establishes the link after a call failed with `cause` while the generation was `seen`.
   * Resolves once registered again, at once when the link closed, or when `signal` (the caller's
   * own stop) aborts; rejects with an AgentFailedError when registration was refused for good.
   */
  recover(seen: number, cause: unknown, signal?: AbortSignal): Promise<void> {
    if (this.#fatal) return Promise.reject(this.#fatal);
    if (this.#closed.signal.aborted || this.#generation !== seen || signal?.aborted) return Promise.resolve();
    const recovering = (this.#recovering ??= this.#reconnect(cause).finally(() => (this.#recovering = undefined)));
    if (!signal) return recovering;
    return new Promise((resolve, reject) => {
      const stop = () => resolve();
      signal.addEventListener("abort", stop, { once: true });
      recovering.then(resolve, reject).finally(() => signal.removeEventListener("abort", stop));
    });
  }

  /** Stops recoveries and closes the connections (calls in flight fail). */
  close(): void {
    this.#closed.abort();
    for (const t of this.#targets) t.session.abort();
  }

  async #reconnect(cause: unknown): Promise<void> {
    if (this.#generation > 0) {
      this.#log.warn({ address: this.address, reason: errorText(cause) }, "connection or registration lost: registering again");
      this.#hooks.onDisconnected(cause);
    }
    const n = this.#targets.length;
    for (let round = 0; ; round++) {
      let last: unknown;
      let reachable = false;
      /** A TLS handshake that failed this round, in words. */
      let tls: string | undefined;
      for (let i = 0; i < n; i++) {
        if (this.#closed.signal.aborted) return;
        const index = (this.#current + i) % n;
        const target = this.#targets[index]!;
        try {
          await this.#hooks.register(target.client, target.address);
          this.#current = index;
          this.#generation++;
          return;
        } catch (err) {
          if (this.#closed.signal.aborted) return;
          if (!isTransient(err)) {
            this.#fatal = new AgentFailedError(`the daemon at ${target.address} refused to register agent '${this.#opts.name}': ${errorText(err)}`, {
              cause: err,
            });
            this.#hooks.onFatal(this.#fatal);
            throw this.#fatal;
          }
          // A daemon that answered with a retry pushback is up: the round's word is the last such answer.
          const answered = pushbackMs(err) !== undefined;
          if (answered || !reachable) last = err;
          reachable ||= answered;
          tls ??= tlsWords(err);
          this.#log.debug({ address: target.address, err: errorText(err) }, answered ? "daemon answered: retry later" : "daemon unreachable");
        }
      }
      const delay = retryDelay(last, round, this.#opts.reconnect);
      const fields = { addresses: this.#opts.addresses, err: errorText(last), retryInMs: delay };
      if (reachable) this.#log.warn(fields, "a daemon is reachable but cannot register this agent now (its database is unavailable): retrying");
      else if (tls) this.#log.warn(fields, `no daemon reachable: ${tls}: retrying`);
      else this.#log.warn(fields, "no daemon reachable: retrying");
      await sleep(delay, this.#closed.signal);
    }
  }
}

/**
 * A call torn down under its caller by the connection (the daemon dying or closing it, a GOAWAY
 * with an error, a reset) ends UNAVAILABLE, the code that says "try again", whichever transport
 * carried it. connect-node reads such an end as INTERNAL (a reset with INTERNAL_ERROR, a session
 * closed with an error code) or CANCELED (a reset with CANCEL: what Node gives the streams of a
 * connection that closed), which callers took for the daemon's answer or for their own cancel.
 * The SDK's own transport maps its resets so itself (wire/src/client/transport.ts), and its server
 * streams are connect-node's: this maps what connect-node produced, once, for both. A call whose
 * caller cancelled it, or whose deadline passed, keeps its code: its signal says so.
 */
export const tornDownIsUnavailable: Interceptor = (next) => async (req) => {
  try {
    const res = await next(req);
    return res.stream ? { ...res, message: tornDownMessages(res.message, req.signal) } : res;
  } catch (err) {
    throw asUnavailable(err, req.signal);
  }
};

async function* tornDownMessages<T>(messages: AsyncIterable<T>, signal: AbortSignal): AsyncGenerator<T> {
  try {
    yield* messages;
  } catch (err) {
    throw asUnavailable(err, signal);
  }
}

/** The resets that tear a call down: connect-node names them in its message, Node in its error's. */
const TORN_DOWN_RESET =
  /^http\/2 stream closed with error code (INTERNAL_ERROR|CANCEL|REFUSED_STREAM) \(0x[0-9a-f]+\)$|^Stream closed with error code NGHTTP2_(INTERNAL_ERROR|CANCEL|REFUSED_STREAM)$/;
/** Node's errors for a session that ended under its streams, or would take none, and for a connection reset under them. */
const TORN_DOWN_SESSION: ReadonlySet<string> = new Set([
  "ERR_HTTP2_SESSION_ERROR",
  "ERR_HTTP2_STREAM_CANCEL",
  "ERR_HTTP2_GOAWAY_SESSION",
  "ECONNRESET",
  "EPIPE",
]);

function asUnavailable(err: unknown, signal: AbortSignal): unknown {
  if (signal.aborted || !(err instanceof ConnectError) || err.code === Code.Unavailable) return err;
  // connect-node reads a reset socket as ABORTED; the rest of ABORTED (a write after the daemon's answer) is left as it is.
  if (err.code !== Code.Internal && err.code !== Code.Canceled && err.code !== Code.Aborted) return err;
  if (!tornDown(err)) return err;
  return new ConnectError(err.rawMessage, Code.Unavailable, err.metadata, undefined, err);
}

function tornDown(err: ConnectError): boolean {
  if (TORN_DOWN_RESET.test(err.rawMessage)) return true;
  for (let e: unknown = err.cause, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (code === "ERR_HTTP2_STREAM_ERROR" && TORN_DOWN_RESET.test(e.message)) return true;
    if (typeof code === "string" && TORN_DOWN_SESSION.has(code)) return true;
  }
  return false;
}

/**
 * The home daemon of the agent `name` among `n` addresses: FNV-1a of the name, modulo n. A fleet
 * given the same list of addresses spreads over them evenly, and each agent's choice is the same
 * across restarts, so failback (Link.goHome) restores the spread a failover undid.
 */
export function homeIndex(name: string, n: number): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) h = Math.imul(h ^ name.charCodeAt(i), 0x01000193) >>> 0;
  return h % n;
}

/** A TLS handshake that failed, said in terms of the agent's `tls` options; undefined for any other failure. */
function tlsWords(err: unknown): string | undefined {
  const f = tlsFailure(err);
  if (!f) return undefined;
  switch (f.kind) {
    case "untrusted":
      return `the TLS handshake failed: the daemon's certificate is not trusted (${f.detail}): give the CA that signed it as tls.ca (and tls.serverName when it names another host)`;
    case "client-refused":
      return `the TLS handshake failed: the daemon refused this agent's client certificate (${f.detail}): give tls.cert and tls.key, signed by the CA of the daemon's --tls-client-ca`;
    case "not-tls":
      return `the TLS handshake failed: the daemon does not speak TLS there (${f.detail}): is it serving h2c (an http:// address)?`;
  }
}
