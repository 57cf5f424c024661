/**
 * Plain gRPC bidirectional streams served straight from the HTTP/2 stream, as unary-fast-path.ts
 * serves unary calls: binary messages, no compression, the same implementations and interceptors.
 * connect-node carries a stream through a pipeline of async generators per direction; a long-lived
 * agent stream kept about 65 KB of them alive while it waited (25 generators and their promises),
 * and every message went through protobuf-es's reflective codec. Here a call is one frame reader,
 * one writer and the compiled codec.
 *
 * What must stay true:
 * - Flow control both ways: the request side pauses the HTTP/2 stream while decoded messages wait
 *   for the implementation to ask for them (the client's writes then wait on the window), and the
 *   next reply is asked of the implementation only once the previous one was taken by the socket.
 * - The implementation's generator is always closed: when the call ends, fails or is cancelled, its
 *   `return()` runs, so its `finally` blocks (which decide what becomes of the work a stream held)
 *   run exactly as they do under connect-node.
 * - Status as gRPC says: trailers-only when nothing was sent, trailers after the last message
 *   otherwise; errors mapped by the interceptors, and what is left (framing, size) answered here.
 */
import http2, { type IncomingHttpHeaders, type ServerHttp2Stream } from "node:http2";
import { create, fromBinary, toBinary, type DescMessage } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextValues, type HandlerContext, type Interceptor, type StreamRequest, type StreamResponse } from "@connectrpc/connect";
import { parseTimeout } from "@connectrpc/connect/protocol-grpc";
import { compileCodec } from "../codec/index.js";
import { drained, envelope, FrameReader } from "../grpc/frames.js";
import { headerText, nodeHeaders } from "../grpc/headers.js";
import { setGrpcStatus } from "../grpc/message.js";
import { callContext, cancelledAtShutdown, type CallContext, type Cancel } from "./call.js";
import { directCall, type GrpcUnaryOptions } from "./unary-fast-path.js";
import type { BidiSpec, UnarySpec } from "./routes.js";

interface Codecs {
  decode(bytes: Uint8Array): unknown;
  frame(message: unknown): Buffer;
}

function codecsOf(spec: BidiSpec): Codecs {
  const { input, output } = spec.method;
  const inCodec = compileCodec(input);
  const outCodec = compileCodec(output);
  return {
    decode: inCodec ? (b) => inCodec.decode(b) : (b) => fromBinary(input, b),
    frame: outCodec ? (m) => outCodec.frame(m as never) : (m) => envelope(toBinary(output as DescMessage, create(output as DescMessage, m as never))),
  };
}

/** A 'stream' listener for the bidi methods of `specs` (paths as routes.ts records them); false leaves the stream to connect. */
export function grpcBidiFastPath(
  specs: ReadonlyMap<string, BidiSpec>,
  opts: GrpcUnaryOptions,
): (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => boolean {
  const methods = new Map([...specs].map(([path, spec]) => [path, { spec, codecs: codecsOf(spec) }]));
  const inflight = cancelledAtShutdown(opts.shutdownSignal);
  return (stream, headers) => {
    const call = directCall(methods, headers);
    if (!call) return false;
    const { method, path, contentType } = call;
    stream.on("error", ignore);
    serve(method.spec, method.codecs, stream, headers, path, contentType, opts, inflight).catch((err: unknown) => {
      if (stream.destroyed || stream.closed) return;
      opts.log?.error({ err, method: path }, "a stream could not be answered; it is reset");
      stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
    });
    return true;
  };
}

const ignore = () => {};

async function serve(
  spec: BidiSpec,
  codecs: Codecs,
  stream: ServerHttp2Stream,
  headers: IncomingHttpHeaders,
  url: string,
  contentType: string,
  opts: GrpcUnaryOptions,
  inflight: Set<Cancel>,
): Promise<void> {
  const timeout = parseTimeout(headerText(headers, "grpc-timeout"), Number.MAX_SAFE_INTEGER);
  const { ctx, end } = callContext(
    spec as unknown as UnarySpec,
    stream,
    headers,
    url,
    timeout.timeoutMs,
    inflight,
    opts.shutdownSignal,
    opts.contextValues?.(stream) ?? createContextValues(),
  );
  let replies: AsyncIterator<unknown> | undefined;
  let trailer = ctx.responseTrailer;
  try {
    if (timeout.error) throw timeout.error;
    const res = await invokeBidi(spec, ctx, requests(stream, codecs, opts.readMaxBytes, ctx.cancel), opts.interceptors);
    trailer = res.trailer;
    replies = res.message[Symbol.asyncIterator]();
    for (;;) {
      const next = await replies.next();
      if (next.done) break;
      if (stream.destroyed || stream.closed) return;
      if (!stream.headersSent) stream.respond({ ...nodeHeaders(res.header), ":status": 200, "content-type": contentType }, { waitForTrailers: true });
      if (!stream.write(codecs.frame(next.value))) await drained(stream);
    }
    replies = undefined;
    finish(stream, contentType, ctx, trailer, { "grpc-status": "0" });
  } catch (err) {
    const status = setGrpcStatus(
      new Headers(),
      err instanceof ConnectError ? err : new ConnectError(err instanceof Error ? err.message : String(err), Code.Internal),
    );
    finish(stream, contentType, ctx, trailer, nodeHeaders(status));
  } finally {
    // The implementation's own `finally` runs now, whatever ended the call.
    await replies?.return?.(undefined).catch(() => undefined);
    end();
  }
}

/** Ends the call with `status`: in the trailers after the messages, or as a trailers-only response. */
function finish(stream: ServerHttp2Stream, contentType: string, ctx: CallContext, trailer: Headers, status: http2.OutgoingHttpHeaders): void {
  if (stream.destroyed || stream.closed) return;
  const trailers = { ...nodeHeaders(trailer), ...status };
  if (stream.headersSent) {
    stream.once("wantTrailers", () => stream.sendTrailers(trailers));
    stream.end();
  } else stream.respond({ ...nodeHeaders(ctx.responseHeader), ...trailers, ":status": 200, "content-type": contentType }, { endStream: true });
}

/**
 * The request messages as the HTTP/2 stream brings them: unwrapped from gRPC's envelope, decoded,
 * queued while the implementation is busy (the stream paused meanwhile). Ends with the client's
 * half-close; throws CANCELED when the stream goes away first, and the protocol's errors as they come.
 */
async function* requests(stream: ServerHttp2Stream, codecs: Codecs, max: number, cancel: Cancel): AsyncGenerator<unknown> {
  const queue: unknown[] = [];
  let failed: unknown;
  let ended = false;
  let wake: (() => void) | undefined;
  const frames = new FrameReader(max, "protocol error: a compressed message without grpc-encoding");
  const poke = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const onData = (chunk: Buffer) => {
    try {
      for (const m of frames.push(chunk)) queue.push(codecs.decode(m));
    } catch (err) {
      failed ??= err;
      stream.off("data", onData);
    }
    if (queue.length > 0 || failed) {
      stream.pause();
      poke();
    }
  };
  const onEnd = () => {
    ended = true;
    if (frames.partial) failed ??= new ConnectError("protocol error: the request message was cut short", Code.Internal);
    poke();
  };
  stream.on("data", onData);
  stream.once("end", onEnd);
  cancel.watch((reason) => {
    failed ??= reason instanceof ConnectError ? reason : new ConnectError("the client cancelled the call", Code.Canceled);
    poke();
  });
  try {
    for (;;) {
      while (queue.length > 0) yield queue.shift();
      if (failed) throw failed;
      if (ended) return;
      stream.resume();
      await new Promise<void>((r) => (wake = r));
    }
  } finally {
    stream.off("data", onData);
    stream.off("end", onEnd);
    cancel.watch(undefined);
  }
}

/** The interceptor chain around the implementation, as connect runs it for a stream. */
async function invokeBidi(spec: BidiSpec, ctx: CallContext, input: AsyncIterable<unknown>, interceptors: readonly Interceptor[]): Promise<StreamResponse> {
  const last = async (req: StreamRequest): Promise<StreamResponse> => {
    const impl = spec.impl as (requests: AsyncIterable<unknown>, context: HandlerContext) => AsyncIterable<unknown>;
    return {
      stream: true,
      message: impl(req.message, ctx),
      method: spec.method,
      service: ctx.service,
      header: ctx.responseHeader,
      trailer: ctx.responseTrailer,
    } as unknown as StreamResponse;
  };
  let next = last as (req: StreamRequest) => Promise<StreamResponse>;
  for (let i = interceptors.length - 1; i >= 0; i--) next = interceptors[i]!(next as never) as never;
  const req = {
    stream: true,
    requestMethod: "POST",
    message: input,
    method: spec.method,
    service: ctx.service,
    url: ctx.url,
    header: ctx.requestHeader,
    contextValues: ctx.values,
    get signal() {
      return ctx.signal;
    },
  } as unknown as StreamRequest;
  return next(req);
}
