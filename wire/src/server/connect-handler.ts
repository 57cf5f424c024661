/**
 * connect-node's router behind a Node request handler of our own, in place of connectNodeAdapter,
 * for three things that adapter does not do:
 * - a call it fails to answer is answered anyway: connectNodeAdapter prints the reason with
 *   console.error and leaves the stream open, so the caller waits for its deadline or for ever; here
 *   the reason goes to the log and the caller gets INTERNAL (or a reset, once the reply has begun);
 * - a JSON request is checked before protobuf-es reads it (checkedJsonText), so that an error about
 *   it never quotes half a surrogate pair, which gRPC's trailers cannot carry (that is how a call
 *   went unanswered);
 * - a deadline past what a timer holds (2^31-1 ms, about 24.8 days) is dropped, so the call runs as
 *   one with no deadline, as on the direct path, instead of being cut after 1 ms.
 * - grpc-message is percent-encoded as gRPC's spec says (../grpc/message.ts), where connect writes
 *   encodeURIComponent, which grpc-js shows half-decoded: in the trailers of gRPC, and in gRPC-Web's
 *   trailer frame (an uncompressed one: a compressed trailer frame, which needs over 1 KiB of
 *   trailers and a client that asked for compression, goes out as connect wrote it).
 * It serves HTTP/1.1 requests as well as HTTP/2 ones, so that a server's Connect API on an HTTP/1.1
 * port (the daemon's /api) is this same handler, with these same three guarantees.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { UniversalServerResponse } from "@connectrpc/connect/protocol";
import type { Http2ServerRequest, Http2ServerResponse, ServerHttp2Stream } from "node:http2";
import http2 from "node:http2";
import { Code, ConnectError, createConnectRouter, type ConnectRouter, type ConnectRouterOptions, type ContextValues } from "@connectrpc/connect";
import { compressionBrotli, compressionGzip, universalRequestFromNodeRequest, universalResponseToNodeResponse } from "@connectrpc/connect-node";
import { parseTimeout } from "@connectrpc/connect/protocol-grpc";
import { hasLoneSurrogate, wellFormed } from "../grpc/text.js";
import { respecGrpcMessage } from "../grpc/message.js";
import type { ErrorLog } from "./unary-fast-path.js";
import { TIMER_MAX_MS } from "./call.js";

export interface ConnectHandlerOptions extends ConnectRouterOptions {
  routes: (router: ConnectRouter) => void;
  log?: ErrorLog;
  /** The context values an HTTP/2 call starts with (what the server knows of its connection); default: none. */
  contextValues?: (stream: ServerHttp2Stream) => ContextValues;
  /** Serve each method at this prefix before its path ("/api": /api/pkg.Service/Method); default: none. */
  requestPathPrefix?: string;
}

/**
 * An HTTP/2 or HTTP/1.1 request handler. `values`, when given, are the call's context values (an
 * HTTP/1.1 caller has no stream for `contextValues` to read).
 */
export type NodeConnectHandler = (req: Http2ServerRequest | IncomingMessage, res: Http2ServerResponse | ServerResponse, values?: ContextValues) => void;

export function connectHandler(opts: ConnectHandlerOptions): NodeConnectHandler {
  const { routes, log, contextValues, requestPathPrefix = "", ...routerOptions } = opts;
  const router = createConnectRouter({
    // connectNodeAdapter's default.
    acceptCompression: [compressionGzip, compressionBrotli],
    ...routerOptions,
    // connect hands jsonOptions as they are to its JSON serialization, which takes a textDecoder
    // (its JsonSerializationOptions); the router's options type does not list it.
    jsonOptions: { ...routerOptions.jsonOptions, textDecoder: checkedJsonText } as ConnectRouterOptions["jsonOptions"],
  });
  routes(router);
  const handlers = new Map(router.handlers.map((h) => [requestPathPrefix + h.requestPath, h]));
  return (req, res, values) => {
    const handler = handlers.get((req.url ?? "").split("?", 1)[0]!);
    if (!handler) {
      res.writeHead(404);
      res.end();
      return;
    }
    const uReq = universalRequestFromNodeRequest(req, res, undefined, values ?? ("stream" in req ? contextValues?.(req.stream) : undefined));
    dropTimerOverflow(uReq.header);
    handler(uReq)
      .then((uRes) => universalResponseToNodeResponse(spec(uRes, req.headers["content-type"]), res))
      .catch((reason: unknown) => {
        // The client went away while the reply was being written: nobody is left to answer.
        if (ConnectError.from(reason).code === Code.Aborted) return;
        log?.error({ err: reason, path: handler.requestPath }, "a call could not be answered as its handler meant; answered INTERNAL");
        answerInternal(res);
      });
  };
}

/**
 * The reply with its grpc-message as the spec has it. connect's gRPC handler sets the status in
 * `trailer` when its body ends, and connect-node reads `trailer` only after the body, so the
 * getter sees the final one; gRPC-Web carries it in the body's last frame, rewritten as it passes.
 */
function spec(uRes: UniversalServerResponse, contentType: string | undefined): UniversalServerResponse {
  if (!contentType?.startsWith("application/grpc")) return uRes;
  const body = uRes.body && contentType.startsWith("application/grpc-web") ? mapChunks(uRes.body, respecTrailerFrame) : uRes.body;
  return {
    status: uRes.status,
    body,
    get header() {
      return uRes.header && respecGrpcMessage(uRes.header);
    },
    get trailer() {
      return uRes.trailer && respecGrpcMessage(uRes.trailer);
    },
  };
}

/**
 * The chunks of `body` through `f`. next, throw and return reach connect's own iterator, as
 * connect-node calls them (throw reports a failed write to the handler), which an async generator
 * would turn into a return.
 */
function mapChunks(body: AsyncIterable<Uint8Array>, f: (chunk: Uint8Array) => Uint8Array): AsyncIterable<Uint8Array> {
  return {
    [Symbol.asyncIterator]() {
      const it = body[Symbol.asyncIterator]();
      return {
        next: async () => {
          const r = await it.next();
          return r.done ? r : { done: false, value: f(r.value) };
        },
        throw: (e?: unknown) => (it.throw ? it.throw(e) : Promise.reject(e)),
        return: (v?: unknown) => (it.return ? it.return(v) : Promise.resolve({ done: true as const, value: v })),
      };
    },
  };
}

const TRAILER_FRAME = 0x80;

/**
 * A gRPC-Web trailer frame (flag 0x80 alone, its length, then "name: value\r\n" lines, as connect
 * writes one per chunk) with grpc-message rewritten; any other chunk as it is.
 */
function respecTrailerFrame(chunk: Uint8Array): Uint8Array {
  if (chunk.length < 5 || chunk[0] !== TRAILER_FRAME) return chunk;
  const buf = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  if (buf.readUInt32BE(1) !== buf.length - 5) return chunk;
  const lines = buf.subarray(5).toString("latin1").split("\r\n");
  let changed = false;
  for (let i = 0; i < lines.length; i++) {
    const m = /^grpc-message:\s*(.*)$/i.exec(lines[i]!);
    if (!m) continue;
    const h = respecGrpcMessage(new Headers({ "grpc-message": m[1]! }));
    lines[i] = `grpc-message: ${h.get("grpc-message")}`;
    changed = true;
  }
  if (!changed) return chunk;
  const text = Buffer.from(lines.join("\r\n"), "latin1");
  const out = Buffer.alloc(5 + text.length);
  out[0] = TRAILER_FRAME;
  out.writeUInt32BE(text.length, 1);
  text.copy(out, 5);
  return out;
}

function answerInternal(res: Http2ServerResponse | ServerResponse): void {
  if ("stream" in res ? res.stream.destroyed || res.stream.closed : res.destroyed) return;
  if (res.headersSent) {
    // Part of a reply is out: only cutting it says it is not the whole one.
    if ("stream" in res) res.stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
    else res.destroy();
    return;
  }
  const contentType = String(res.req?.headers["content-type"] ?? "");
  if (contentType.startsWith("application/grpc")) {
    res.writeHead(200, { "content-type": contentType, "grpc-status": String(Code.Internal), "grpc-message": "internal error" });
    res.end();
  } else {
    res.writeHead(500, { "content-type": "application/json" });
    res.end(JSON.stringify({ code: "internal", message: "internal error" }));
  }
}

function dropTimerOverflow(header: Headers): void {
  const grpc = header.get("grpc-timeout");
  if (grpc !== null && (parseTimeout(grpc, Number.MAX_SAFE_INTEGER).timeoutMs ?? 0) > TIMER_MAX_MS) header.delete("grpc-timeout");
  const connect = header.get("connect-timeout-ms");
  if (connect !== null && Number(connect) > TIMER_MAX_MS) header.delete("connect-timeout-ms");
}

const utf8 = new TextDecoder();

/**
 * Decodes a JSON request as connect's own decoder does, and refuses one that is not JSON or that
 * holds a lone surrogate (a `\uD83D` escape without its pair: a protobuf string is UTF-8, which has
 * no such character), with an error that quotes no half pair itself. connect makes either refusal
 * INVALID_ARGUMENT. The text is parsed twice (here and by protobuf-es): JSON requests are the rare
 * ones, from browsers and curl, never from the SDK.
 */
const checkedJsonText = {
  decode(data: Uint8Array): string {
    const text = utf8.decode(data);
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (e) {
      throw new Error(`the request is not JSON: ${wellFormed(e instanceof Error ? e.message : String(e))}`);
    }
    if (holdsLoneSurrogate(value)) throw new Error("the request's JSON holds half a surrogate pair (an unpaired \\uD800-\\uDFFF escape), which is not text");
    return text;
  },
};

/** Every string and key of a parsed JSON value, walked without recursion (nesting depth is the sender's). */
function holdsLoneSurrogate(value: unknown): boolean {
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const v = stack.pop();
    if (typeof v === "string") {
      if (hasLoneSurrogate(v)) return true;
    } else if (Array.isArray(v)) {
      for (const item of v) stack.push(item);
    } else if (v !== null && typeof v === "object") {
      for (const [k, item] of Object.entries(v)) {
        if (hasLoneSurrogate(k)) return true;
        stack.push(item);
      }
    }
  }
  return false;
}
