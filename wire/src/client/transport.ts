/**
 * The SDK's gRPC transport: connect's client API on top, with unary calls carried straight over the
 * HTTP/2 session. connect-node's gRPC transport runs every call through generic async-iterable
 * plumbing and protobuf-es's reflective codec; in the drain benchmark that was most of an agent's
 * CPU (an agent's calls are unary: claim, complete, heartbeat, extend). Here a unary call encodes its
 * request with the compiled codec (../codec; protobuf-es's for the few messages it does not cover),
 * writes one frame, collects the reply and its trailers and decodes once. It keeps connect's
 * semantics: interceptors wrap the call as connect applies them, deadlines and cancels end it as
 * connect's runUnaryCall does (errors are ConnectErrors), and the request headers are connect's own;
 * a reply's status is read as the gRPC spec says (./status.ts), where connect reads it otherwise.
 * Bidi calls (the agent stream) are carried the same way (./bidi.ts); server streams go through
 * connect-node's gRPC transport on the same session.
 */
import { setMaxListeners } from "node:events";
import http2 from "node:http2";
import type { DescMessage, DescMethodStreaming, DescMethodUnary, MessageInitShape, MessageShape } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createContextValues,
  type ContextValues,
  type Interceptor,
  type StreamRequest,
  type StreamResponse,
  type Transport,
  type UnaryRequest,
  type UnaryResponse,
} from "@connectrpc/connect";
import { createGrpcTransport, type Http2SessionManager } from "@connectrpc/connect-node";
import { createMethodUrl } from "@connectrpc/connect/protocol";
import { headerGrpcStatus, requestHeader } from "@connectrpc/connect/protocol-grpc";
import { codecFor, type Codec } from "../codec/index.js";
import { nodeHeaders, webHeaders } from "../grpc/headers.js";
import { responseError, statusError } from "./status.js";
import { bidiExchange } from "./bidi.js";

export interface GrpcTransportOptions {
  baseUrl: string;
  sessionManager: Http2SessionManager;
  interceptors: Interceptor[];
  /** The largest reply accepted, in bytes (connect's default: 4 GiB, i.e. no limit worth the name). */
  readMaxBytes?: number;
}

const DEFAULT_READ_MAX = 0xffffffff;

type AnyUnaryFn = (req: UnaryRequest<DescMessage, DescMessage>) => Promise<UnaryResponse<DescMessage, DescMessage>>;
type AnyStreamFn = (req: StreamRequest<DescMessage, DescMessage>) => Promise<StreamResponse<DescMessage, DescMessage>>;

/** The response messages, and `end` (the call's deadline timer released) once they end, however. */
async function* ending<T>(messages: AsyncIterable<T>, end: () => void): AsyncGenerator<T> {
  try {
    yield* messages;
  } finally {
    end();
  }
}

/** Never aborted: the signal of a call with neither a deadline nor a caller's signal. */
const NEVER = new AbortController().signal;
// Every such call in flight listens on it; that is not a leak.
setMaxListeners(0, NEVER);

export function createSdkGrpcTransport(opts: GrpcTransportOptions): Transport {
  const fallback = createGrpcTransport({
    baseUrl: opts.baseUrl,
    sessionManager: opts.sessionManager,
    interceptors: opts.interceptors,
    readMaxBytes: opts.readMaxBytes,
  });
  const readMax = opts.readMaxBytes ?? DEFAULT_READ_MAX;
  const exchangeFn: AnyUnaryFn = (req) => exchange(opts.sessionManager, req, codecFor(req.method.input), codecFor(req.method.output), readMax);
  // The interceptors wrap the exchange once, first one outermost, as connect applies them.
  const chain = opts.interceptors.reduceRight<AnyUnaryFn>((next, interceptor) => interceptor(next as never) as unknown as AnyUnaryFn, exchangeFn);
  const urls = new Map<DescMethodUnary, string>();
  const bidiFn: AnyStreamFn = (req) =>
    bidiExchange(opts.sessionManager, req, codecFor(req.method.input), codecFor(req.method.output), readMax, {
      fromReset: errorFromReset,
      fromNode: errorFromNode,
    });
  const streamChain = opts.interceptors.reduceRight<AnyStreamFn>((next, interceptor) => interceptor(next as never) as unknown as AnyStreamFn, bidiFn);
  return {
    async unary<I extends DescMessage, O extends DescMessage>(
      method: DescMethodUnary<I, O>,
      signal: AbortSignal | undefined,
      timeoutMs: number | undefined,
      header: ConstructorParameters<typeof Headers>[0],
      input: MessageInitShape<I>,
      contextValues?: ContextValues,
    ): Promise<UnaryResponse<I, O>> {
      const inCodec = codecFor(method.input);
      const timeout = timeoutMs === undefined || timeoutMs <= 0 ? undefined : timeoutMs;
      let url = urls.get(method as DescMethodUnary);
      if (url === undefined) urls.set(method as DescMethodUnary, (url = createMethodUrl(opts.baseUrl, method)));
      // What connect's runUnaryCall does (interceptors, deadline, cancel, errors as ConnectError),
      // without its two AbortControllers per call and the abort event it fires at every call's end.
      const call = callSignal(signal, timeout);
      try {
        return (await chain({
          stream: false,
          service: method.parent,
          method,
          requestMethod: "POST",
          url,
          signal: call.signal,
          header: requestHeader(true, timeout, header),
          contextValues: contextValues ?? createContextValues(),
          // A message one level deep, so nothing rebuilds every nested part with create(); the
          // codec reads the nested parts by schema either way.
          message: inCodec.shallow(input),
        } as UnaryRequest<DescMessage, DescMessage>)) as unknown as UnaryResponse<I, O>;
      } catch (err) {
        throw call.signal.aborted ? ConnectError.from(call.signal.reason, Code.Canceled) : ConnectError.from(err);
      } finally {
        call.end();
      }
    },
    stream<I extends DescMessage, O extends DescMessage>(
      method: DescMethodStreaming<I, O>,
      signal: AbortSignal | undefined,
      timeoutMs: number | undefined,
      header: ConstructorParameters<typeof Headers>[0],
      input: AsyncIterable<MessageInitShape<I>>,
      contextValues?: ContextValues,
    ) {
      if (method.methodKind !== "bidi_streaming") return fallback.stream(method, signal, timeoutMs, header, input, contextValues);
      const timeout = timeoutMs === undefined || timeoutMs <= 0 ? undefined : timeoutMs;
      const call = callSignal(signal, timeout);
      const req = {
        stream: true,
        service: method.parent,
        method,
        requestMethod: "POST",
        url: createMethodUrl(opts.baseUrl, method),
        signal: call.signal,
        header: requestHeader(true, timeout, header),
        contextValues: contextValues ?? createContextValues(),
        message: input,
      } as unknown as StreamRequest<DescMessage, DescMessage>;
      return streamChain(req).then(
        (res) => ({ ...res, message: ending(res.message, call.end) }) as never,
        (err: unknown) => {
          call.end();
          throw call.signal.aborted ? ConnectError.from(call.signal.reason, Code.Canceled) : ConnectError.from(err);
        },
      );
    },
  };
}

/** A call's signal: the caller's, aborted too at the deadline (with DEADLINE_EXCEEDED, as connect does). */
function callSignal(caller: AbortSignal | undefined, timeoutMs: number | undefined): { signal: AbortSignal; end(): void } {
  if (timeoutMs === undefined) return { signal: caller ?? NEVER, end: () => {} };
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new ConnectError("the operation timed out", Code.DeadlineExceeded)), timeoutMs);
  if (!caller) return { signal: controller.signal, end: () => clearTimeout(timer) };
  const onAbort = () => controller.abort(caller.reason);
  if (caller.aborted) onAbort();
  else caller.addEventListener("abort", onAbort, { once: true });
  return {
    signal: controller.signal,
    end: () => {
      clearTimeout(timer);
      caller.removeEventListener("abort", onAbort);
    },
  };
}

const parsedUrls = new Map<string, URL>();

/** A call's URL, parsed once per URL (a method's URL is the same on every call). */
function parsedUrl(url: string): URL {
  let parsed = parsedUrls.get(url);
  if (!parsed) {
    parsed = new URL(url);
    if (parsedUrls.size < 1000) parsedUrls.set(url, parsed);
  }
  return parsed;
}

/** One unary exchange on the session: the request frame out, the reply frame, headers and trailers in. */
function exchange<I extends DescMessage, O extends DescMessage>(
  sm: Http2SessionManager,
  req: UnaryRequest<I, O>,
  inCodec: Codec<I>,
  outCodec: Codec<O>,
  readMax: number,
): Promise<UnaryResponse<I, O>> {
  const frame = inCodec.frame(req.message);
  const url = parsedUrl(req.url);
  return new Promise((resolve, reject) => {
    if (url.origin !== sm.authority) {
      reject(new ConnectError(`cannot make a request to ${url.origin}: the http2 session is connected to ${sm.authority}`, Code.Internal));
      return;
    }
    let stream: http2.ClientHttp2Stream | undefined;
    let settled = false;
    const fail = (reason: unknown) => {
      if (settled) return;
      settled = true;
      req.signal.removeEventListener("abort", onAbort);
      const err = reason instanceof ConnectError ? reason : errorFromNode(reason);
      // gRPC over HTTP/2 ends a cancelled or timed-out call with CANCEL; anything else is an error of ours.
      const cancel = err.code === Code.Canceled || err.code === Code.DeadlineExceeded;
      if (stream && !stream.closed) stream.close(cancel ? http2.constants.NGHTTP2_CANCEL : http2.constants.NGHTTP2_INTERNAL_ERROR);
      reject(err);
    };
    const onAbort = () => fail(ConnectError.from(req.signal.reason, Code.Canceled));
    if (req.signal.aborted) return onAbort();
    req.signal.addEventListener("abort", onAbort);
    sm.request("POST", url.pathname + url.search, nodeHeaders(req.header), {}).then((s) => {
      stream = s;
      // From here on a stream error (a reset, a write after the peer ended) settles the call, or,
      // once it is settled, is dropped: an 'error' without a listener would crash the process.
      // The reset's code, with what reset it as its cause (a TLS alert that ended the session, say).
      s.on("error", (e) => fail(errorFromReset(s.rstCode, e) ?? e));
      if (settled) {
        s.close(http2.constants.NGHTTP2_CANCEL);
        return;
      }
      let status = 0;
      let responseHeaders: http2.IncomingHttpHeaders | undefined;
      let trailers: http2.IncomingHttpHeaders | undefined;
      const chunks: Buffer[] = [];
      let size = 0;
      s.on("response", (h) => {
        responseHeaders = h;
        status = Number(h[":status"] ?? 0);
      });
      s.on("data", (chunk: Buffer) => {
        sm.notifyResponseByteRead(s);
        size += chunk.length;
        if (size > readMax + 5) fail(new ConnectError(`message larger than ${readMax} bytes`, Code.ResourceExhausted));
        else chunks.push(chunk);
      });
      s.on("trailers", (t) => {
        trailers = t;
      });
      s.on("close", () => {
        // A finished stream outlives its call: Node keeps it alive through young-generation
        // collections until the next full one, and with it whatever its listeners reach (this
        // call's request, reply and promises), so all of that was copied and promoted. Dropping the
        // listeners lets the call die young. In the drain, 29 % of an agent's allocations survived a
        // scavenge, now 17 %, and its collections' pauses fell by a third. Nothing is emitted after
        // 'close', and the emit in progress still reaches every listener it started with.
        s.removeAllListeners();
        if (settled) return;
        const reset = errorFromReset(s.rstCode);
        if (reset) return fail(reset);
        if (!responseHeaders) return fail(new ConnectError("protocol error: the stream closed without a response", Code.Unavailable));
        try {
          const res = finish(req, status, responseHeaders, trailers ?? {}, chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks), outCodec, readMax);
          settled = true;
          req.signal.removeEventListener("abort", onAbort);
          resolve(res);
        } catch (e) {
          fail(e);
        }
      });
      s.end(frame);
    }, fail);
  });
}

function finish<I extends DescMessage, O extends DescMessage>(
  req: UnaryRequest<I, O>,
  status: number,
  headers: http2.IncomingHttpHeaders,
  trailers: http2.IncomingHttpHeaders,
  body: Buffer,
  outCodec: Codec<O>,
  readMax: number,
): UnaryResponse<I, O> {
  const header = webHeaders(headers);
  const trailer = webHeaders(trailers);
  // An HTTP status other than 200 (mapped as gRPC does) or a content type that is not gRPC.
  const refused = responseError(status, header);
  if (refused) throw refused;
  const headerError = statusError(header);
  const message = body.length === 0 ? undefined : readFrame(body, outCodec, readMax);
  const trailerError = statusError(trailer);
  if (trailerError) {
    header.forEach((value, key) => {
      trailerError.metadata.append(key, value);
    });
    throw trailerError;
  }
  if (!header.has(headerGrpcStatus) && !trailer.has(headerGrpcStatus)) throw new ConnectError("protocol error: missing status", Code.Internal);
  if (message === undefined) {
    if (headerError) throw headerError;
    throw new ConnectError("protocol error: missing output message for unary method", trailer.has(headerGrpcStatus) ? Code.Unimplemented : Code.Unknown);
  }
  return { stream: false, service: req.service, method: req.method, header, message, trailer };
}

function readFrame<O extends DescMessage>(body: Buffer, outCodec: Codec<O>, readMax: number): MessageShape<O> {
  if (body.length < 5) throw new ConnectError("protocol error: incomplete envelope", Code.Internal);
  if ((body[0]! & 1) === 1) throw new ConnectError("protocol error: received a compressed message, but no compression was asked for", Code.Internal);
  const length = body.readUInt32BE(1);
  if (length > readMax) throw new ConnectError(`message larger than ${readMax} bytes`, Code.ResourceExhausted);
  if (body.length !== 5 + length) {
    throw new ConnectError(
      body.length < 5 + length ? "protocol error: incomplete envelope" : "protocol error: received extra output message for unary method",
      body.length < 5 + length ? Code.Internal : Code.Unimplemented,
    );
  }
  try {
    return outCodec.decode(body.subarray(5));
  } catch (e) {
    throw new ConnectError(`protocol error: could not parse the reply: ${e instanceof Error ? e.message : String(e)}`, Code.Internal);
  }
}

/**
 * What an HTTP/2 reset means for the caller: gRPC's table (PROTOCOL-HTTP2.md#errors), except that a
 * stream torn down under the call is UNAVAILABLE, the code a caller retries. A reset reaches here
 * only when the caller did not end the call (its cancel or deadline settles the call first, and the
 * CANCEL it resets with is not read back), so each of these is the peer's or the connection's:
 * - INTERNAL_ERROR: what Node gives every stream of a session that ends in an error (a daemon that
 *   dies, a GOAWAY with an error code, a failed keepalive), and what a peer resets with when it
 *   gives up on a stream;
 * - CANCEL: what Node gives the streams of a connection that closed under them, and what a server
 *   cancelling its calls in flight resets with;
 * - REFUSED_STREAM: the peer did not process the stream (gRPC's own table says UNAVAILABLE).
 * Read as INTERNAL, a daemon dying looked to callers like a daemon that answered with a bug.
 */
function errorFromReset(rstCode: number | undefined, cause?: unknown): ConnectError | undefined {
  const c = http2.constants;
  if (rstCode === undefined || rstCode === c.NGHTTP2_NO_ERROR) return undefined;
  const message = `http/2 stream closed with error code 0x${rstCode.toString(16)}`;
  const error = (code: Code) => new ConnectError(message, code, undefined, undefined, cause);
  switch (rstCode) {
    case c.NGHTTP2_INTERNAL_ERROR:
    case c.NGHTTP2_CANCEL:
    case c.NGHTTP2_REFUSED_STREAM:
      return error(Code.Unavailable);
    case c.NGHTTP2_ENHANCE_YOUR_CALM:
      return error(Code.ResourceExhausted);
    case c.NGHTTP2_INADEQUATE_SECURITY:
      return error(Code.PermissionDenied);
    default:
      return error(Code.Internal);
  }
}

/** Node's errors for a session that ended under its streams, or would take none: UNAVAILABLE, as a reset that tears a stream down is. */
const TORN_DOWN: ReadonlySet<string> = new Set(["ERR_HTTP2_SESSION_ERROR", "ERR_HTTP2_STREAM_CANCEL", "ERR_HTTP2_GOAWAY_SESSION"]);

/**
 * Node's connection errors: a refused or unknown peer, a reset socket (ECONNRESET, EPIPE) and a
 * session torn down under the call are UNAVAILABLE (connect-node says ABORTED or INTERNAL for the
 * last ones); a write after the daemon ended the stream is ABORTED, as connect-node has it (the
 * daemon's own answer follows).
 */
function errorFromNode(reason: unknown): ConnectError {
  const codes: string[] = [];
  for (let e: unknown = reason; e instanceof Error && codes.length < 8; e = e.cause) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") codes.push(code);
  }
  let code = Code.Internal;
  if (
    codes.some(
      (c) => c === "ETIMEDOUT" || c === "ENOTFOUND" || c === "EAI_AGAIN" || c === "ECONNREFUSED" || c === "ECONNRESET" || c === "EPIPE" || TORN_DOWN.has(c),
    )
  )
    code = Code.Unavailable;
  else if (codes.some((c) => c === "ERR_STREAM_WRITE_AFTER_END" || c === "ERR_STREAM_DESTROYED" || c === "ERR_HTTP2_INVALID_STREAM")) code = Code.Aborted;
  const err = ConnectError.from(reason, code);
  if (err !== reason) err.cause = reason;
  return err;
}
