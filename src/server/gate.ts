/**
 * The check every stream passes on its request headers, before either path (wire/src/server/unary-fast-path.ts or
 * connect-node) reads a byte of its body. It guarantees:
 * - a call that needs a token and has none, an unknown one or one of the wrong role is answered
 *   there, with the interceptor's own error (Authenticator.check decides for both), and logged at
 *   warn with the address and the reason, never the token;
 * - an address over --auth-failure-limit has its failing calls (no token, or an unknown one) refused
 *   RESOURCE_EXHAUSTED, cheaply, until its window ends; a call with valid credentials from it is
 *   served, and resets nothing;
 * - request bodies held by calls in flight stay within --max-inflight-bytes daemon-wide (one budget:
 *   the direct path reserves from it as it reads, `body` watches connect-node's streams): a call that
 *   would pass it is answered RESOURCE_EXHAUSTED, and what a call holds is released when it ends;
 * - a body must be complete within --http2-body-timeout of its headers;
 * - Health.Watch, the one stream open to anyone, is capped per address and in total;
 * - a session some call of which passed with credentials is reported (`authenticated`): the
 *   connection caps (./http2-limits.ts) never evict it to make room for a stranger.
 * The HTTP port's /api (./console.ts) passes the same checks on its HTTP/1.1 requests (`admit`,
 * `hold`), with the same failure counts, byte budget and Health.Watch caps: one gate for both ports.
 * The interceptor stays the second line: tenant and agent checks need the message and run in handlers.
 * Services not in the access map pass here; connect answers them (unimplemented, or the
 * interceptor's deny by default).
 */
import type { Http2Session, IncomingHttpHeaders, ServerHttp2Stream } from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import { Health } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import type { Clock } from "../clock.js";
import type { Logger } from "../log.js";
import type { Access, Authenticator } from "./auth.js";
import type { CertReading, PeerIdentities } from "./cert-identity.js";
import { AuthFailures } from "./auth-failures.js";
import { headerText } from "@aiflow/wire/headers";
import type { BodyBudget } from "@aiflow/wire/server";
import { refuse } from "./refuse.js";
import type { ServerStats } from "./stats.js";

/** The limits the gate holds callers to (config/limits.ts documents each setting and its default). */
export interface GateLimits {
  maxInflightBytes: number;
  bodyTimeoutMs: number;
  authFailureLimit: number;
  authFailureWindowMs: number;
  healthWatchMax: number;
  healthWatchMaxPerAddress: number;
}

export interface GateOptions extends GateLimits {
  auth: Authenticator;
  /** Under mutual TLS: what each connection's client certificate says. */
  peers?: PeerIdentities;
  access: ReadonlyMap<string, Access>;
  /**
   * Paths whose request is a stream (the agent stream, AgentService.Connect): their body lasts as
   * long as the call and is read message by message as it comes, so it is neither timed nor held
   * to the byte budget (which would cut every such call after --http2-body-timeout, or once it had
   * sent --max-inflight-bytes in all). Each message is bounded by the message size limit, and the
   * handler's reading by HTTP/2 flow control.
   */
  streamingRequests?: ReadonlySet<string>;
  log: Logger;
  clock: Clock;
  stats: ServerStats;
  /** A call on `session` presented credentials the gate accepted. */
  authenticated?: (session: Http2Session) => void;
}

const HEALTH_WATCH = `/${Health.typeName}/Watch`;

export interface Gate {
  /** The 'stream' listener's first step: true when it answered the stream itself, false to pass it on. */
  (stream: ServerHttp2Stream, headers: IncomingHttpHeaders): boolean;
  /**
   * For a stream connect-node will read: holds its body to the budget and its time; true when it
   * refused it (on its declared length) instead.
   */
  body(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): boolean;
  /** The same budget for the direct path (wire/src/server/unary-fast-path.ts), which reserves as it reads. */
  readonly budget: BodyBudget;
  /** A failed authentication outside a call (a refused client certificate): counts as a call's does. */
  authFailed(address: string): void;
  /**
   * The same checks on the headers of a call that is not an HTTP/2 stream (the HTTP port's /api):
   * undefined to serve it, or the error to refuse it with, before any of its body is read.
   */
  admit(call: CallHeaders): ConnectError | undefined;
  /**
   * Holds `bytes` of a body read by other means (the HTTP port's /api) to the same daemon-wide
   * budget: undefined when held (give them back with `budget.release`), or the refusal, counted.
   */
  hold(bytes: number): ConnectError | undefined;
}

/** What the gate needs to know of a call, read from its request headers and its connection. */
export interface CallHeaders {
  address: string;
  /** "/pkg.Service/Method", perhaps with a query (a Connect GET). */
  path: string;
  authorization: string | undefined;
  /** Under mutual TLS: what the connection's client certificate says. */
  peer: CertReading | undefined;
  /** Takes what to release when the call ends (a Health.Watch slot). */
  onEnd(release: () => void): void;
}

export function createGate(opts: GateOptions): Gate {
  const failures = new AuthFailures(opts.clock, opts.authFailureLimit, opts.authFailureWindowMs);
  const bytes = new ByteBudget(opts.maxInflightBytes);
  const watches = new WatchCaps(opts.healthWatchMax, opts.healthWatchMaxPerAddress);
  const { stats, log } = opts;
  const overBudget = () => new ConnectError(`the daemon holds ${opts.maxInflightBytes} bytes of requests in flight; try again later`, Code.ResourceExhausted);
  const budget: BodyBudget = {
    reserve: (n) => bytes.reserve(n),
    release: (n) => bytes.release(n),
    bodyTimeoutMs: opts.bodyTimeoutMs,
    refused: (why) => void (why === "bytes" ? stats.inflightRefused++ : stats.bodyTimeouts++),
    overBudget,
  };

  /**
   * The checks on a call's headers, whichever port it came by. Credentials are looked at first, and
   * a call they pass is served whatever its address did: the failure limit throttles failures, not
   * the callers beside them (behind a NAT or a TLS-terminating proxy every caller shares an address).
   * Looking costs a SHA-256 of the header and one map lookup (Authenticator.resolve), so a throttled
   * guesser is still refused cheaply: without a log line, a count per reason or a recorded failure.
   */
  const decide = (call: CallHeaders): { error?: ConnectError; authenticated: boolean } => {
    const { address } = call;
    const { service, method, path } = splitPath(call.path);
    const needed = opts.access.get(service);
    let authenticated = false;
    if (needed !== undefined && needed !== "public") {
      const decision = opts.auth.check(opts.access, service, method, call.authorization, call.peer);
      if (!decision.ok) {
        // A guess (no token, or one nobody issued). A valid token of the wrong role is a caller's
        // mistake, not a guess: it neither counts nor is throttled.
        const guess = decision.reason === "missing" || decision.reason === "unknown";
        if (guess && failures.throttled(address)) {
          stats.authThrottled++;
          return { error: new ConnectError("too many failed authentications from this address; try again later", Code.ResourceExhausted), authenticated };
        }
        stats.authFailures[decision.reason]++;
        log.warn({ remote: address, reason: decision.reason, service, method }, "call refused: authentication failed");
        if (guess) authFailed(address);
        return { error: decision.error, authenticated };
      }
      authenticated = true;
    }
    // The path without its query: connect serves "/…/Watch?x" as Watch, so the cap must count it too.
    if (path === HEALTH_WATCH) {
      const full = watches.acquire(address);
      if (full) {
        stats.healthWatchRefused++;
        return { error: new ConnectError(`too many Health.Watch streams ${full}; use Check, or watch again later`, Code.ResourceExhausted), authenticated };
      }
      call.onEnd(() => watches.release(address));
    }
    return { authenticated };
  };

  const gate = (stream: ServerHttp2Stream, headers: IncomingHttpHeaders): boolean => {
    const { error, authenticated } = decide({
      address: addressOf(stream),
      path: headers[":path"] ?? "",
      authorization: headerText(headers, "authorization") ?? undefined,
      peer: opts.peers?.of(stream.session),
      onEnd: (release) => stream.once("close", release),
    });
    if (error) {
      refuse(stream, headers, error, opts.bodyTimeoutMs);
      return true;
    }
    if (authenticated && stream.session) opts.authenticated?.(stream.session);
    return false;
  };

  /** Holds `n` bytes to the budget; the refusal (counted) when they would pass it. */
  const hold = (n: number): ConnectError | undefined => {
    if (bytes.reserve(n)) return undefined;
    stats.inflightRefused++;
    return overBudget();
  };

  /**
   * Reserves the body's declared length at once, and what arrives past it as it arrives. Refused on
   * its declared length, no handler has the stream and the rest of its body is discarded (refuse.ts
   * says why that beats a reset); refused part way, connect-node is reading it and would buffer on,
   * so the stream is reset.
   */
  const body = (stream: ServerHttp2Stream, headers: IncomingHttpHeaders): boolean => {
    if (opts.streamingRequests?.has(splitPath(headers[":path"] ?? "").path)) return false;
    const declared = Number(headers["content-length"] ?? 0);
    let held = 0;
    if (declared > 0) {
      const refused = hold(declared);
      if (refused) {
        refuse(stream, headers, refused, opts.bodyTimeoutMs);
        return true;
      }
      held = declared;
    }
    stream.once("close", () => bytes.release(held));
    if (stream.endAfterHeaders) return false;
    let received = 0;
    const onData = (chunk: Buffer) => {
      received += chunk.length;
      if (received <= held) return;
      if (bytes.reserve(received - held)) held = received;
      else {
        done();
        stats.inflightRefused++;
        refuse(stream, headers, overBudget());
      }
    };
    const timer = setTimeout(() => {
      done();
      stats.bodyTimeouts++;
      refuse(stream, headers, new ConnectError(`the request body did not arrive within ${opts.bodyTimeoutMs}ms`, Code.DeadlineExceeded));
    }, opts.bodyTimeoutMs);
    timer.unref();
    const done = () => {
      clearTimeout(timer);
      stream.off("data", onData);
    };
    stream.on("data", onData);
    stream.once("end", done);
    stream.once("close", done);
    return false;
  };

  const authFailed = (address: string) => {
    if (failures.record(address))
      log.warn(
        { remote: address, limit: opts.authFailureLimit, windowMs: opts.authFailureWindowMs },
        "address over the failed-authentication limit: refusing its failing calls until the window ends (valid credentials are still served)",
      );
  };

  return Object.assign(gate, { body, budget, authFailed, admit: (call: CallHeaders) => decide(call).error, hold });
}

/** Bytes held by calls in flight, daemon-wide. */
class ByteBudget {
  #used = 0;
  constructor(private readonly max: number) {}

  reserve(n: number): boolean {
    if (this.#used + n > this.max) return false;
    this.#used += n;
    return true;
  }

  release(n: number): void {
    this.#used -= n;
  }
}

/** Open Health.Watch streams, per address and in total. */
class WatchCaps {
  #total = 0;
  readonly #byAddress = new Map<string, number>();
  constructor(
    private readonly max: number,
    private readonly maxPerAddress: number,
  ) {}

  /** Takes a slot; returns why not ("in total", "from this address") when full. */
  acquire(address: string): string | undefined {
    const mine = this.#byAddress.get(address) ?? 0;
    if (this.#total >= this.max) return "in total";
    if (mine >= this.maxPerAddress) return "from this address";
    this.#total++;
    this.#byAddress.set(address, mine + 1);
    return undefined;
  }

  release(address: string): void {
    this.#total--;
    const mine = (this.#byAddress.get(address) ?? 1) - 1;
    if (mine === 0) this.#byAddress.delete(address);
    else this.#byAddress.set(address, mine);
  }
}

/** A session's peer address, read once: its socket is a proxy, and every call asks. */
const addresses = new WeakMap<object, string>();
function addressOf(stream: ServerHttp2Stream): string {
  const session = stream.session;
  if (!session) return "unknown";
  let a = addresses.get(session);
  if (a === undefined) addresses.set(session, (a = session.socket?.remoteAddress ?? "unknown"));
  return a;
}

/** "/pkg.Service/Method" (a Connect GET has a query after it). */
function splitPath(path: string): { service: string; method: string; path: string } {
  const q = path.indexOf("?");
  const p = q < 0 ? path : path.slice(0, q);
  const slash = p.lastIndexOf("/");
  return { service: p.slice(1, slash), method: p.slice(slash + 1), path: p };
}
