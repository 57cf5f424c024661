/**
 * Answers a call with an error before anything has read its body, in the protocol the caller speaks:
 * gRPC and gRPC-Web as a trailers-only response (grpc-status in the one HEADERS frame), Connect unary
 * (and GET) as an HTTP error status with Connect's JSON error body, Connect streaming as an end-stream
 * message. What a request still sends of its body is read and discarded until it ends, for at most
 * `discardMs`; then (or at once, with no `discardMs`) the stream is reset with NO_ERROR, which tells
 * the client to stop sending (RFC 9113 §8.1) without turning the answer into a failure.
 * Discarding first matters to Node clients (grpc-js among them): a stream reset while they still
 * write keeps its unsent bytes counted against their session memory, and after about 10 MB of that
 * their session refuses every new stream (ENHANCE_YOUR_CALM).
 */
import type { OutgoingHttpHeaders } from "node:http";
import http2, { type IncomingHttpHeaders, type ServerHttp2Stream } from "node:http2";
import { nodeHeaders } from "@aiflow/wire/headers";
import { setGrpcStatus } from "@aiflow/wire/message";
import type { ConnectError } from "@connectrpc/connect";
import { codeToHttpStatus, endStreamFlag, errorToJson } from "@connectrpc/connect/protocol-connect";

/**
 * A refusal as its caller's protocol has it (`contentType`): the status, the headers, and the body,
 * if any. gRPC's is trailers-only (no body): its status is in these headers. Both ports answer
 * refusals with it (this file on HTTP/2, ./console.ts's /api on HTTP/1.1).
 */
export function refusalOf(contentType: string, err: ConnectError): { status: number; headers: OutgoingHttpHeaders; body?: Buffer } {
  if (contentType.startsWith("application/grpc"))
    return { status: 200, headers: { "content-type": contentType, ...nodeHeaders(setGrpcStatus(new Headers(), err)) } };
  if (contentType.startsWith("application/connect+")) {
    const json = Buffer.from(JSON.stringify({ error: errorToJson(err, undefined) }));
    const body = Buffer.alloc(5 + json.length);
    body[0] = endStreamFlag;
    body.writeUInt32BE(json.length, 1);
    json.copy(body, 5);
    return { status: 200, headers: { "content-type": contentType }, body };
  }
  return {
    status: codeToHttpStatus(err.code),
    headers: { "content-type": "application/json" },
    body: Buffer.from(JSON.stringify(errorToJson(err, undefined))),
  };
}

export function refuse(stream: ServerHttp2Stream, headers: IncomingHttpHeaders, err: ConnectError, discardMs?: number): void {
  // A reset from the client emits 'error'; unheard, that would be an uncaught exception.
  stream.on("error", ignore);
  if (stream.destroyed || stream.closed) return;
  if (!stream.headersSent) {
    const r = refusalOf(String(headers["content-type"] ?? ""), err);
    stream.respond({ ":status": r.status, ...r.headers }, { endStream: r.body === undefined });
    if (r.body !== undefined) stream.end(r.body);
  }
  if (stream.endAfterHeaders || stream.readableEnded) return;
  // Whatever of the body still arrives is read and dropped, so the connection's flow-control
  // window is not left full of bytes nobody reads.
  stream.resume();
  if (discardMs === undefined) {
    stream.close(http2.constants.NGHTTP2_NO_ERROR);
    return;
  }
  const timer = setTimeout(() => stream.close(http2.constants.NGHTTP2_NO_ERROR), discardMs);
  timer.unref();
  stream.once("close", () => clearTimeout(timer));
}

const ignore = () => {};
