/**
 * One call on the direct path: its cancellation, its handler context and request as connect's
 * interceptors and implementations see them, and the interceptor chain run as connect runs it.
 */
import type { ServerHttp2Stream, IncomingHttpHeaders } from "node:http2";
import { create, isMessage, type DescMessage } from "@bufbuild/protobuf";
import { Code, ConnectError, type ContextValues, type HandlerContext, type Interceptor, type UnaryRequest, type UnaryResponse } from "@connectrpc/connect";
import { webHeaders } from "../grpc/headers.js";
import type { UnarySpec } from "./routes.js";

/**
 * Why a call ends early: the client went away (its stream closed), its deadline passed, or the
 * server stops for good. Its AbortSignal is made only when something reads it (a handler that
 * waits, as a long-poll claim does); an Enqueue never does. What a call allocates around an
 * AbortController (and its place in the set of calls in flight) outlived minor collections: measured
 * in the daemon with a forced minor collection every 50 ms, a refused call left 1.6–1.7 KB in the
 * old generation with them and 0.1–0.2 KB without, a valid Enqueue 1.9–2.4 KB against 0.6–0.8. That
 * garbage is what the full collections, which stall every call in flight, are made of. Calls whose
 * signal exists are the ones the server's stop must reach; the others are cancelled by their stream
 * closing when the server destroys its sessions.
 */
export class Cancel {
  #controller: AbortController | undefined;
  #cancelled = false;
  #reason: unknown;
  #watcher: ((reason: unknown) => void) | undefined;

  constructor(private readonly inflight: Set<Cancel>) {}

  get signal(): AbortSignal {
    if (!this.#controller) {
      this.#controller = new AbortController();
      if (this.#cancelled) this.#controller.abort(this.#reason);
      else this.inflight.add(this);
    }
    return this.#controller.signal;
  }

  cancel(reason: unknown): void {
    if (this.#cancelled) return;
    this.#cancelled = true;
    this.#reason = reason;
    this.inflight.delete(this);
    this.#controller?.abort(reason);
    this.#watcher?.(reason);
  }

  /** While the request is read: `fn` hears the cancellation (at once when it came already); undefined stops that. */
  watch(fn: ((reason: unknown) => void) | undefined): void {
    this.#watcher = fn;
    if (fn && this.#cancelled) fn(this.#reason);
  }

  end(): void {
    this.#watcher = undefined;
    this.inflight.delete(this);
  }
}

/** The handler context of one call: connect's fields, no copied headers, and the signal made on demand. */
export class CallContext implements HandlerContext {
  readonly protocolName = "grpc";
  readonly requestMethod = "POST";
  readonly responseHeader: Headers = new Headers();
  readonly responseTrailer: Headers = new Headers();
  readonly service: HandlerContext["service"];

  constructor(
    readonly method: UnarySpec["method"],
    readonly url: string,
    readonly requestHeader: Headers,
    readonly values: ContextValues,
    readonly cancel: Cancel,
    private readonly deadlineAt: number | undefined,
  ) {
    this.service = method.parent;
  }

  get signal(): AbortSignal {
    return this.cancel.signal;
  }

  timeoutMs = (): number | undefined => (this.deadlineAt === undefined ? undefined : this.deadlineAt - Date.now());

  /** The context an interceptor's changed request leads to (its own headers or values). */
  for(req: UnaryRequest): CallContext {
    if (req.header === this.requestHeader && req.contextValues === this.values) return this;
    const ctx = new CallContext(this.method, this.url, req.header, req.contextValues, this.cancel, this.deadlineAt);
    Object.defineProperties(ctx, { responseHeader: { value: this.responseHeader }, responseTrailer: { value: this.responseTrailer } });
    return ctx;
  }
}

/** The request interceptors see; its signal, like the context's, is made only when read. */
class CallRequest implements UnaryRequest {
  readonly stream = false;
  readonly requestMethod = "POST";

  constructor(
    readonly message: UnaryRequest["message"],
    readonly method: UnaryRequest["method"],
    readonly service: UnaryRequest["service"],
    readonly url: string,
    readonly header: Headers,
    readonly contextValues: ContextValues,
    private readonly cancel: Cancel,
  ) {}

  get signal(): AbortSignal {
    return this.cancel.signal;
  }
}

/** A direct path's calls in flight whose signal exists: each is cancelled when `shutdown` aborts. */
export function cancelledAtShutdown(shutdown: AbortSignal): Set<Cancel> {
  const inflight = new Set<Cancel>();
  shutdown.addEventListener("abort", () => {
    for (const c of [...inflight]) c.cancel(shutdown.reason);
  });
  return inflight;
}

/** The longest delay setTimeout honours; a longer one fires after 1 ms. */
export const TIMER_MAX_MS = 2 ** 31 - 1;

/** A call's context: its deadline timer and its stream's close, both ending in its Cancel. */
export function callContext(
  spec: UnarySpec,
  stream: ServerHttp2Stream,
  headers: IncomingHttpHeaders,
  url: string,
  timeoutMs: number | undefined,
  inflight: Set<Cancel>,
  shutdown: AbortSignal,
  values: ContextValues,
): { ctx: CallContext; end(): void } {
  const cancel = new Cancel(inflight);
  const deadlineAt = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
  // A deadline past what a timer holds (2^31-1 ms, about 24.8 days; "597H" is a valid grpc-timeout)
  // would fire at once if armed as it is: such a call runs without a timer, as one with no deadline.
  const timer =
    timeoutMs === undefined || timeoutMs > TIMER_MAX_MS
      ? undefined
      : setTimeout(() => cancel.cancel(new ConnectError("the operation timed out", Code.DeadlineExceeded)), timeoutMs);
  const onClose = () => cancel.cancel(shutdown.aborted ? shutdown.reason : new ConnectError("the client cancelled the call", Code.Canceled));
  stream.once("close", onClose);
  return {
    ctx: new CallContext(spec.method, url, webHeaders(headers), values, cancel, deadlineAt),
    end() {
      clearTimeout(timer);
      stream.off("close", onClose);
      cancel.end();
    },
  };
}

/**
 * connect's invokeUnaryImplementation, less its eager copies: it reads the context's signal into the
 * request and into a spread copy of the context for every call, which would make the signal Cancel
 * saves. Interceptors run in the same order (the first is outermost) and a reply that is not yet a
 * message is made one, as connect does.
 */
export async function invoke(spec: UnarySpec, ctx: CallContext, input: UnaryRequest["message"], interceptors: readonly Interceptor[]): Promise<unknown> {
  const output: DescMessage = spec.method.output;
  const last = async (req: UnaryRequest): Promise<UnaryResponse> => {
    const reply = await (spec.impl as (m: unknown, c: HandlerContext) => Promise<object> | object)(req.message, ctx.for(req));
    const message = isMessage(reply, output) ? reply : create(output, reply as never);
    return { stream: false, message, method: spec.method, service: ctx.service, header: ctx.responseHeader, trailer: ctx.responseTrailer } as UnaryResponse;
  };
  let next = last as (req: UnaryRequest) => Promise<UnaryResponse>;
  for (let i = interceptors.length - 1; i >= 0; i--) next = interceptors[i]!(next as never) as never;
  const res = await next(new CallRequest(input, spec.method, ctx.service, ctx.url, ctx.requestHeader, ctx.values, ctx.cancel));
  copyHeaders(res.header, ctx.responseHeader);
  copyHeaders(res.trailer, ctx.responseTrailer);
  return res.message;
}

/** As connect copies an interceptor's reply headers onto the call's. */
function copyHeaders(from: Headers, to: Headers): void {
  if (from === to) return;
  for (const key of [...to.keys()]) to.delete(key);
  from.forEach((value, key) => {
    to.set(key, value);
  });
}
