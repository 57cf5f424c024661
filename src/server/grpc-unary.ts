/**
 * Plain gRPC unary calls served straight from the HTTP/2 stream. connect-node carries every protocol
 * through generic async-iterable plumbing, which cost about 0.6 ms of CPU per call on the machines we
 * measured (a bare HTTP/2 exchange about 0.1 ms); with an enqueue per item and a claim per batch that
 * was most of the daemon's time per call. This path takes only gRPC unary calls with binary
 * messages and no compression — what the SDK, grpc-js and every stock gRPC client send by default —
 * and runs them through the same implementations and interceptors, with connect's timeout parsing
 * and status trailers, and a handler context of its own whose signal is made only when read. Everything else (gRPC-Web, Connect, JSON,
 * compression, streaming, anything malformed enough to need connect's answer) goes to connect-node.
 */
import { randomUUID } from "node:crypto";
import http2, { type Http2ServerRequest, type Http2ServerResponse, type IncomingHttpHeaders, type ServerHttp2Stream } from "node:http2";
import { create, fromBinary, isMessage, toBinary, type DescMessage } from "@bufbuild/protobuf";
import { compileCodec, nodeHeaders, webHeaders } from "@aiflow/agent-sdk/codec";
import {
  Code,
  ConnectError,
  createContextValues,
  createServiceImplSpec,
  type ConnectRouter,
  type ContextValues,
  type HandlerContext,
  type Interceptor,
  type MethodImplSpec,
  type UnaryRequest,
  type UnaryResponse,
} from "@connectrpc/connect";
import { parseTimeout, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";

import type { Logger } from "../log.js";

export type UnarySpec = Extract<MethodImplSpec, { kind: "unary" }>;

/**
 * The daemon-wide hold on request bodies (gate.ts): this path reserves each chunk as it arrives and
 * releases the call's bytes when the call ends, and a body must be complete within bodyTimeoutMs.
 */
export interface BodyBudget {
  reserve(bytes: number): boolean;
  release(bytes: number): void;
  readonly bodyTimeoutMs: number;
  /** Told of each call refused over the budget or for a late body (for the counters). */
  refused(why: "bytes" | "timeout"): void;
  /** The refusal over the budget (one message for both paths). */
  overBudget(): ConnectError;
}

export interface GrpcUnaryOptions {
  interceptors: readonly Interceptor[];
  readMaxBytes: number;
  budget?: BodyBudget;
  /** Aborted when the server stops for good: handlers still running see their signal abort. */
  shutdownSignal: AbortSignal;
  /** Where a reply that cannot be encoded is logged (a bug of ours, not of the request). */
  log?: Logger;
}

const CONTENT_TYPES = new Set(["application/grpc", "application/grpc+proto"]);

/**
 * Records the unary methods the routes register (and registers them with connect as before), so
 * both paths serve the same implementations.
 */
export function recordUnary(routes: (router: ConnectRouter) => void, specs: Map<string, UnarySpec>): (router: ConnectRouter) => void {
  return (router) =>
    routes(
      Object.assign(Object.create(router) as ConnectRouter, {
        service(...args: Parameters<ConnectRouter["service"]>) {
          const [service, impl] = args;
          for (const m of Object.values(createServiceImplSpec(service, impl).methods))
            if (m.kind === "unary") specs.set(`/${service.typeName}/${m.method.name}`, m);
          return router.service(...args);
        },
      }),
    );
}

/** How one method's messages are read and written on this path. */
interface FastMethod {
  spec: UnarySpec;
  decode(bytes: Uint8Array): unknown;
  /** The reply as one gRPC message, envelope and all. */
  frame(message: unknown): Buffer;
}

/**
 * The compiled codec (@aiflow/agent-sdk/codec) where the message types allow it, protobuf-es where
 * not. With a compiled output codec the implementation's reply is made a message only one level
 * deep (codec.shallow): its nested parts may stay init objects, which the codec encodes by schema,
 * so connect's create() of every nested message (7 % of the daemon's time in the drain benchmark)
 * is skipped.
 */
function fastMethod(spec: UnarySpec): FastMethod {
  const { input, output } = spec.method;
  const inCodec = compileCodec(input);
  const outCodec = compileCodec(output);
  const decode = inCodec ? (b: Uint8Array) => inCodec.decode(b) : (b: Uint8Array) => fromBinary(input, b);
  if (!outCodec) return { spec, decode, frame: (m) => envelope(toBinary(output, m as never)) };
  const impl = spec.impl as (req: unknown, ctx: unknown) => Promise<object> | object;
  const unnormalized = {
    ...spec,
    impl: async (req: unknown, ctx: unknown) => outCodec.shallow((await impl(req, ctx)) as never),
  } as unknown as UnarySpec;
  return { spec: unnormalized, decode, frame: (m) => outCodec.frame(m as never) };
}

/** protobuf-es's bytes behind gRPC's 5-byte envelope (the compiled codec writes its own in place). */
function envelope(bytes: Uint8Array): Buffer {
  const body = Buffer.allocUnsafe(5 + bytes.byteLength);
  body[0] = 0;
  body.writeUInt32BE(bytes.byteLength, 1);
  body.set(bytes, 5);
  return body;
}

/**
 * Returns a 'stream' listener that serves the call and returns true, or returns false (having read
 * nothing) to leave the stream to connect. It takes the server's core 'stream' event, before Node's
 * compatibility layer would wrap the stream in a request and a response object: those are two more
 * stream objects per call, with the body piped from one to the other (a bare HTTP/2 exchange cost
 * about a tenth more CPU through them on this project's benchmark machine).
 */
export function grpcUnaryFastPath(specs: ReadonlyMap<string, UnarySpec>, opts: GrpcUnaryOptions): (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => boolean {
  const interceptors = [...opts.interceptors];
  const methods = new Map<string, FastMethod>();
  for (const [path, spec] of specs) methods.set(path, fastMethod(spec));
  const inflight = new Set<Cancel>();
  opts.shutdownSignal.addEventListener("abort", () => {
    for (const c of [...inflight]) c.cancel(opts.shutdownSignal.reason);
  });
  return (stream, headers) => {
    if (headers[":method"] !== "POST") return false;
    const path = headers[":path"];
    const method = path === undefined ? undefined : methods.get(path);
    if (!method) return false;
    const contentType = headers["content-type"];
    if (contentType === undefined || !CONTENT_TYPES.has(contentType)) return false;
    const encoding = headers["grpc-encoding"];
    if (encoding !== undefined && encoding !== "identity") return false;
    // A stream reset by the client emits 'error'; unheard, that would be an uncaught exception.
    // The call's own listeners (close, read) turn it into a cancelled call.
    stream.on("error", ignore);
    stream.once("close", release);
    // serve() answers every error itself; this only catches a write to a stream that died between
    // its checks and the write, which must not become an unhandled rejection (a crash).
    serve(method, stream, headers, path!, contentType, interceptors, opts, inflight).catch(() => {
      if (!stream.destroyed) stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
    });
    return true;
  };
}

const ignore = () => {};

/**
 * A finished stream outlives its call: Node keeps it alive through young-generation collections
 * until the next full one, and with it whatever its listeners reach (the request's body and the
 * call's signal and promises). Nothing is emitted after 'close'.
 */
function release(this: ServerHttp2Stream): void {
  this.removeAllListeners();
}

/**
 * Routes a server's streams: the direct path's first, the rest to the compatibility layer's
 * 'request' handler (connect-node). Node adds that layer as a 'stream' listener of its own when the
 * first 'request' listener is added; it is taken off and called here for the streams the direct
 * path leaves, so that it never wraps a stream the direct path serves.
 */
export function routeStreams(server: http2.Http2Server, direct: (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => boolean, request: (req: Http2ServerRequest, res: Http2ServerResponse) => void): void {
  const before = new Set(server.listeners("stream"));
  server.on("request", request);
  const compat = server.listeners("stream").filter((l) => !before.has(l));
  if (compat.length !== 1) throw new Error(`expected Node's HTTP/2 compatibility layer as one 'stream' listener, found ${compat.length}`);
  const wrap = compat[0] as (...args: unknown[]) => void;
  server.off("stream", wrap);
  server.on("stream", function (this: http2.Http2Server, stream: ServerHttp2Stream, headers: IncomingHttpHeaders, ...rest: unknown[]) {
    if (!direct(stream, headers)) wrap.call(this, stream, headers, ...rest);
  });
}

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
class Cancel {
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
class CallContext implements HandlerContext {
  readonly protocolName = "grpc";
  readonly requestMethod = "POST";
  readonly responseHeader = new Headers();
  readonly responseTrailer = new Headers();
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

/** A call's context: its deadline timer and its stream's close, both ending in its Cancel. */
function callContext(spec: UnarySpec, stream: ServerHttp2Stream, headers: IncomingHttpHeaders, url: string, timeoutMs: number | undefined, inflight: Set<Cancel>, shutdown: AbortSignal): { ctx: CallContext; end(): void } {
  const cancel = new Cancel(inflight);
  const deadlineAt = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
  const timer = timeoutMs === undefined ? undefined : setTimeout(() => cancel.cancel(new ConnectError("the operation timed out", Code.DeadlineExceeded)), timeoutMs);
  const onClose = () => cancel.cancel(shutdown.aborted ? shutdown.reason : new ConnectError("the client cancelled the call", Code.Canceled));
  stream.once("close", onClose);
  return {
    ctx: new CallContext(spec.method, url, webHeaders(headers), createContextValues(), cancel, deadlineAt),
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
async function invoke(spec: UnarySpec, ctx: CallContext, input: UnaryRequest["message"], interceptors: readonly Interceptor[]): Promise<unknown> {
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
  from.forEach((value, key) => to.set(key, value));
}

async function serve(
  fast: FastMethod,
  stream: ServerHttp2Stream,
  headers: IncomingHttpHeaders,
  url: string,
  contentType: string,
  interceptors: Interceptor[],
  opts: GrpcUnaryOptions,
  inflight: Set<Cancel>,
): Promise<void> {
  const { spec } = fast;
  const timeout = parseTimeout(headerText(headers, "grpc-timeout"), Number.MAX_SAFE_INTEGER);
  const { ctx, end } = callContext(spec, stream, headers, url, timeout.timeoutMs, inflight, opts.shutdownSignal);
  const held: Held = { bytes: 0, late: false };
  try {
    if (timeout.error) throw timeout.error;
    const input = fast.decode(unwrap(await readBody(stream, opts.readMaxBytes, ctx.cancel, opts.budget, held), opts.readMaxBytes));
    const output = await invoke(spec, ctx, input as never, interceptors);
    const body = encodeReply(fast, output, url, opts.log);
    if (stream.destroyed || stream.closed) return;
    const trailers = { ...nodeHeaders(ctx.responseTrailer), "grpc-status": "0" };
    stream.once("wantTrailers", () => stream.sendTrailers(trailers));
    stream.respond({ ...nodeHeaders(ctx.responseHeader), ":status": 200, "content-type": contentType }, { waitForTrailers: true });
    stream.end(body);
  } catch (err) {
    // Errors from the implementation come mapped by the error interceptor (unknown ones logged and
    // turned into INTERNAL); what is left here is the call's own fault (framing, size, decoding).
    const status = setTrailerStatus(new Headers(ctx.responseTrailer), err instanceof ConnectError ? err : protocolError(err));
    if (stream.destroyed || stream.closed || stream.headersSent) return;
    // A trailers-only response: status and message in the one HEADERS frame that ends the stream.
    stream.respond({ ...nodeHeaders(ctx.responseHeader), ...nodeHeaders(status), ":status": 200, "content-type": contentType }, { endStream: true });
    // A body still trickling in after its time is cut; a refused one is otherwise read to its end
    // and dropped (readBody resumed the stream), which a Node client needs (refuse.ts says why).
    if (held.late) stream.close(http2.constants.NGHTTP2_NO_ERROR);
  } finally {
    if (held.bytes > 0) opts.budget!.release(held.bytes);
    // Releases the deadline timer and the close listener; the signal, if made, is left as it is
    // (nothing listens on a finished call's signal, and aborting it would build an exception per call).
    end();
  }
}

/** The reply framed; a reply the codec refuses is our bug: logged with a reference, INTERNAL on the wire. */
function encodeReply(fast: FastMethod, output: unknown, path: string, log: Logger | undefined): Buffer {
  try {
    return fast.frame(output);
  } catch (err) {
    const ref = randomUUID();
    log?.error({ err, method: path, ref }, "could not encode a reply");
    throw new ConnectError(`internal error (ref ${ref})`, Code.Internal);
  }
}

function protocolError(err: unknown): ConnectError {
  return new ConnectError(`could not read the request message: ${err instanceof Error ? err.message : String(err)}`, Code.Internal);
}

/** What a call holds of the budget, released when it ends; `late`: its body missed its time. */
interface Held {
  bytes: number;
  late: boolean;
}

function readBody(stream: ServerHttp2Stream, max: number, cancel: Cancel, budget: BodyBudget | undefined, held: Held): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const timer = budget
      ? setTimeout(() => {
          held.late = true;
          budget.refused("timeout");
          fail(new ConnectError(`the request body did not arrive within ${budget.bodyTimeoutMs}ms`, Code.DeadlineExceeded));
        }, budget.bodyTimeoutMs)
      : undefined;
    const fail = (e: unknown) => {
      clearTimeout(timer);
      cancel.watch(undefined);
      stream.off("data", onData);
      stream.off("error", onError);
      // Reads on, discarding, so that the client's flow-control window is not left full.
      stream.resume();
      reject(e);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > max + 5) return fail(new ConnectError(`message larger than ${max} bytes`, Code.ResourceExhausted));
      if (budget) {
        if (!budget.reserve(chunk.length)) {
          budget.refused("bytes");
          return fail(budget.overBudget());
        }
        held.bytes += chunk.length;
      }
      chunks.push(chunk);
    };
    const onError = (e: Error) => fail(new ConnectError(e.message, Code.Canceled));
    stream.on("data", onData);
    stream.once("error", onError);
    stream.once("end", () => {
      clearTimeout(timer);
      cancel.watch(undefined);
      stream.off("error", onError);
      resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks));
    });
    // A client that goes away mid-request never sends the end of it.
    cancel.watch(fail);
  });
}

/**
 * The one enveloped message of a unary request. None, or more than one, is a cardinality violation,
 * which the gRPC status-code table answers UNIMPLEMENTED; a message cut short is a protocol error.
 */
function unwrap(body: Buffer, max: number): Uint8Array {
  if (body.length === 0) throw new ConnectError("a unary request needs exactly one message; it had none", Code.Unimplemented);
  if (body.length < 5) throw new ConnectError("protocol error: the request message was cut short", Code.Internal);
  if ((body[0]! & 1) === 1) throw new ConnectError("protocol error: a compressed message without grpc-encoding", Code.Internal);
  const length = body.readUInt32BE(1);
  if (length > max) throw new ConnectError(`message larger than ${max} bytes`, Code.ResourceExhausted);
  if (body.length < 5 + length) throw new ConnectError("protocol error: the request message was cut short", Code.Internal);
  if (body.length > 5 + length) throw new ConnectError("a unary request needs exactly one message; it had more", Code.Unimplemented);
  return body.subarray(5);
}

/** A request header as one string (repeated values joined as HTTP does), or null. */
export function headerText(h: IncomingHttpHeaders, name: string): string | null {
  const v = h[name];
  return v === undefined ? null : Array.isArray(v) ? v.join(", ") : v;
}
