/**
 * A bidirectional gRPC call carried straight over the HTTP/2 session, as transport.ts carries unary
 * ones: the compiled codec both ways, one frame per message, no async-iterable pipeline in between.
 * The agent stream (AgentService.Connect) is the call it is for: every pushed item and every report
 * crosses it, and connect-node's generic path cost an agent about a third more CPU per item than
 * its unary claims did.
 *
 * What must stay true (as connect's own stream calls do):
 * - Flow control both ways: requests are written as the socket takes them (the caller's iterable is
 *   read no faster), and the response side pauses the HTTP/2 stream while decoded messages wait for
 *   the caller, so a slow reader holds the daemon back through the window rather than buffering.
 * - Every end is a ConnectError from the response iterator: the status in the trailers (or a
 *   trailers-only response), a reset's code, the caller's abort (CANCELED) or its deadline.
 * - The response's end is the call's end, with the request side still open: the client then
 *   closes the stream itself (wire/test/client-bidi.test.ts holds both transports to this).
 */
import http2 from "node:http2";
import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type StreamRequest, type StreamResponse } from "@connectrpc/connect";
import type { Http2SessionManager } from "@connectrpc/connect-node";
import type { Codec } from "../codec/index.js";
import { drained, FrameReader } from "../grpc/frames.js";
import { nodeHeaders, webHeaders } from "../grpc/headers.js";
import { responseError, statusError } from "./status.js";

export interface BidiErrors {
  fromReset(rstCode: number | undefined, cause?: unknown): ConnectError | undefined;
  fromNode(reason: unknown): ConnectError;
}

/** Opens the call; resolves with its response once the daemon's headers arrived. */
export async function bidiExchange<I extends DescMessage, O extends DescMessage>(
  sm: Http2SessionManager,
  req: StreamRequest<I, O>,
  inCodec: Codec<I>,
  outCodec: Codec<O>,
  readMax: number,
  errors: BidiErrors,
): Promise<StreamResponse<I, O>> {
  const url = new URL(req.url);
  if (url.origin !== sm.authority)
    throw new ConnectError(`cannot make a request to ${url.origin}: the http2 session is connected to ${sm.authority}`, Code.Internal);
  if (req.signal.aborted) throw ConnectError.from(req.signal.reason, Code.Canceled);
  const s = await sm.request("POST", url.pathname + url.search, nodeHeaders(req.header), {}).catch((e: unknown) => {
    throw errors.fromNode(e);
  });
  const queue: MessageShape<O>[] = [];
  let failed: ConnectError | undefined;
  let ended = false;
  let wake: (() => void) | undefined;
  const frames = new FrameReader(readMax, "protocol error: received a compressed message, but no compression was asked for");
  let trailers: http2.IncomingHttpHeaders | undefined;
  let responseHeaders: http2.IncomingHttpHeaders | undefined;
  const trailer = new Headers();
  const poke = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const fail = (err: ConnectError) => {
    failed ??= err;
    poke();
  };
  const onAbort = () => {
    fail(ConnectError.from(req.signal.reason, Code.Canceled));
    if (!s.closed) s.close(http2.constants.NGHTTP2_CANCEL);
  };
  req.signal.addEventListener("abort", onAbort, { once: true });
  s.on("error", (e) => fail(errors.fromReset(s.rstCode, e) ?? errors.fromNode(e)));
  s.on("data", (chunk: Buffer) => {
    sm.notifyResponseByteRead(s);
    try {
      for (const m of frames.push(chunk)) queue.push(outCodec.decode(m));
    } catch (e) {
      fail(e instanceof ConnectError ? e : new ConnectError(`protocol error: could not parse a reply: ${String(e)}`, Code.Internal));
      s.close(http2.constants.NGHTTP2_CANCEL);
    }
    if (queue.length > 0) {
      s.pause();
      poke();
    }
  });
  s.on("response", (h) => (responseHeaders = h));
  s.on("trailers", (t) => {
    trailers = t;
    webHeaders(t).forEach((value, key) => {
      trailer.set(key, value);
    });
  });
  /** The response is over: its status decides how the call ends (once). */
  const finish = () => {
    if (ended) return;
    const reset = errors.fromReset(s.rstCode);
    if (reset) fail(reset);
    else {
      // The status is in the trailers, or in the headers of a trailers-only response.
      const status = trailers ?? (responseHeaders?.["grpc-status"] !== undefined ? responseHeaders : undefined);
      const err = status ? statusError(webHeaders(status)) : new ConnectError("protocol error: the stream closed without a status", Code.Internal);
      if (err) fail(err);
    }
    ended = true;
    poke();
  };
  // The daemon ending its response ends the call, whether or not the agent's request side is
  // still open (it always is: an agent never half-closes first). `close` alone would wait for
  // both sides and never come; the request side is let go of here instead.
  s.on("end", () => {
    finish();
    if (!s.closed) s.close(http2.constants.NGHTTP2_NO_ERROR);
  });
  s.on("close", () => {
    req.signal.removeEventListener("abort", onAbort);
    finish();
  });
  void pump(s, req.message, inCodec).catch((e: unknown) => {
    fail(e instanceof ConnectError ? e : errors.fromNode(e));
    if (!s.closed) s.close(http2.constants.NGHTTP2_CANCEL);
  });

  const headers = await new Promise<http2.IncomingHttpHeaders>((resolve, reject) => {
    s.once("response", resolve);
    s.once("close", () => reject(failed ?? new ConnectError("protocol error: the stream closed without a response", Code.Unavailable)));
  });
  const header = webHeaders(headers);
  const refused = responseError(Number(headers[":status"] ?? 0), header);
  if (refused) {
    s.close(http2.constants.NGHTTP2_CANCEL);
    throw refused;
  }
  // A trailers-only response (the daemon refused the call at once): its status is in the headers.
  const early = statusError(header);
  if (early) fail(early);

  async function* messages(): AsyncGenerator<MessageShape<O>> {
    try {
      for (;;) {
        while (queue.length > 0) yield queue.shift()!;
        if (failed) throw failed;
        if (ended) return;
        s.resume();
        await new Promise<void>((r) => (wake = r));
      }
    } finally {
      if (!s.closed) s.close(http2.constants.NGHTTP2_CANCEL);
    }
  }
  return { stream: true, service: req.service, method: req.method, header, trailer, message: messages() } as StreamResponse<I, O>;
}

/** Writes the caller's requests as the socket takes them, then half-closes. */
async function pump<I extends DescMessage>(s: http2.ClientHttp2Stream, input: AsyncIterable<unknown>, inCodec: Codec<I>): Promise<void> {
  for await (const m of input) {
    if (s.closed || s.destroyed) return;
    if (!s.write(inCodec.frame(m as never))) await drained(s);
  }
  if (!s.closed && !s.destroyed) s.end();
}
