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
import http2, { type IncomingHttpHeaders, type ServerHttp2Stream } from "node:http2";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextValues, type ContextValues, type Interceptor } from "@connectrpc/connect";
import { parseTimeout } from "@connectrpc/connect/protocol-grpc";
import { compileCodec } from "../codec/index.js";
import { headerText, nodeHeaders } from "../grpc/headers.js";
import { envelope } from "../grpc/frames.js";
import { setGrpcStatus } from "../grpc/message.js";
import { callContext, cancelledAtShutdown, invoke, type Cancel } from "./call.js";
import { readBody, unwrap, type BodyBudget, type Held } from "./request-body.js";
import type { UnarySpec } from "./routes.js";

/** Where the path reports a reply it could not encode (a pino logger fits). */
export interface ErrorLog {
  error(fields: object, message: string): void;
}

export interface GrpcUnaryOptions {
  interceptors: readonly Interceptor[];
  readMaxBytes: number;
  budget?: BodyBudget;
  /** Aborted when the server stops for good: handlers still running see their signal abort. */
  shutdownSignal: AbortSignal;
  /** Where a reply that cannot be encoded is logged (a bug of ours, not of the request). */
  log?: ErrorLog;
  /** The context values a call starts with (what the server knows of its connection); default: none. */
  contextValues?: (stream: ServerHttp2Stream) => ContextValues;
}

const CONTENT_TYPES = new Set(["application/grpc", "application/grpc+proto"]);

/**
 * What a direct path serves of this stream: a POST to one of `methods`, binary gRPC, uncompressed,
 * with its method, path and content type; undefined leaves the stream to connect-node.
 */
export function directCall<M>(methods: ReadonlyMap<string, M>, headers: IncomingHttpHeaders): { method: M; path: string; contentType: string } | undefined {
  if (headers[":method"] !== "POST") return undefined;
  const path = headers[":path"];
  const method = path === undefined ? undefined : methods.get(path);
  if (method === undefined) return undefined;
  const contentType = headers["content-type"];
  if (contentType === undefined || !CONTENT_TYPES.has(contentType)) return undefined;
  const encoding = headers["grpc-encoding"];
  if (encoding !== undefined && encoding !== "identity") return undefined;
  return { method, path: path!, contentType };
}

/** How one method's messages are read and written on this path. */
interface FastMethod {
  spec: UnarySpec;
  decode(bytes: Uint8Array): unknown;
  /** The reply as one gRPC message, envelope and all. */
  frame(message: unknown): Buffer;
}

/**
 * The compiled codec (../codec) where the message types allow it, protobuf-es where
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

/**
 * Returns a 'stream' listener that serves the call and returns true, or returns false (having read
 * nothing) to leave the stream to connect. It takes the server's core 'stream' event, before Node's
 * compatibility layer would wrap the stream in a request and a response object: those are two more
 * stream objects per call, with the body piped from one to the other (a bare HTTP/2 exchange cost
 * about a tenth more CPU through them on this project's benchmark machine).
 */
export function grpcUnaryFastPath(
  specs: ReadonlyMap<string, UnarySpec>,
  opts: GrpcUnaryOptions,
): (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => boolean {
  const interceptors = [...opts.interceptors];
  const methods = new Map<string, FastMethod>();
  for (const [path, spec] of specs) methods.set(path, fastMethod(spec));
  const inflight = cancelledAtShutdown(opts.shutdownSignal);
  return (stream, headers) => {
    const call = directCall(methods, headers);
    if (!call) return false;
    const { method, path, contentType } = call;
    // A stream reset by the client emits 'error'; unheard, that would be an uncaught exception.
    // The call's own listeners (close, read) turn it into a cancelled call.
    stream.on("error", ignore);
    stream.once("close", release);
    // serve() answers every error itself; what reaches here is a write to a stream that died between
    // its checks and the write (nothing to say), or a fault of ours, which is logged and reset. Either
    // must not become an unhandled rejection (a crash).
    serve(method, stream, headers, path, contentType, interceptors, opts, inflight).catch((err: unknown) => {
      if (stream.destroyed || stream.closed) return;
      opts.log?.error({ err, method: path }, "a call could not be answered; its stream is reset");
      stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
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
  const { ctx, end } = callContext(
    spec,
    stream,
    headers,
    url,
    timeout.timeoutMs,
    inflight,
    opts.shutdownSignal,
    opts.contextValues?.(stream) ?? createContextValues(),
  );
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
    const status = setGrpcStatus(new Headers(ctx.responseTrailer), err instanceof ConnectError ? err : protocolError(err));
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
function encodeReply(fast: FastMethod, output: unknown, path: string, log: ErrorLog | undefined): Buffer {
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
