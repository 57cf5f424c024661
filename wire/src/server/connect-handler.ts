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
 */
import type { Http2ServerRequest, Http2ServerResponse, ServerHttp2Stream } from "node:http2";
import http2 from "node:http2";
import { Code, ConnectError, createConnectRouter, type ConnectRouter, type ConnectRouterOptions, type ContextValues } from "@connectrpc/connect";
import { compressionBrotli, compressionGzip, universalRequestFromNodeRequest, universalResponseToNodeResponse } from "@connectrpc/connect-node";
import { parseTimeout } from "@connectrpc/connect/protocol-grpc";
import { hasLoneSurrogate, wellFormed } from "../grpc/text.js";
import type { ErrorLog } from "./unary-fast-path.js";
import { TIMER_MAX_MS } from "./call.js";

export interface ConnectHandlerOptions extends ConnectRouterOptions {
  routes: (router: ConnectRouter) => void;
  log?: ErrorLog;
  /** The context values a call starts with (what the server knows of its connection); default: none. */
  contextValues?: (stream: ServerHttp2Stream) => ContextValues;
}

export function connectHandler(opts: ConnectHandlerOptions): (req: Http2ServerRequest, res: Http2ServerResponse) => void {
  const { routes, log, contextValues, ...routerOptions } = opts;
  const router = createConnectRouter({
    // connectNodeAdapter's default.
    acceptCompression: [compressionGzip, compressionBrotli],
    ...routerOptions,
    // connect hands jsonOptions as they are to its JSON serialization, which takes a textDecoder
    // (its JsonSerializationOptions); the router's options type does not list it.
    jsonOptions: { ...routerOptions.jsonOptions, textDecoder: checkedJsonText } as ConnectRouterOptions["jsonOptions"],
  });
  routes(router);
  const handlers = new Map(router.handlers.map((h) => [h.requestPath, h]));
  return (req, res) => {
    const handler = handlers.get(req.url.split("?", 1)[0]!);
    if (!handler) {
      res.writeHead(404);
      res.end();
      return;
    }
    const uReq = universalRequestFromNodeRequest(req, res, undefined, contextValues?.(req.stream));
    dropTimerOverflow(uReq.header);
    handler(uReq)
      .then((uRes) => universalResponseToNodeResponse(uRes, res))
      .catch((reason: unknown) => {
        // The client went away while the reply was being written: nobody is left to answer.
        if (ConnectError.from(reason).code === Code.Aborted) return;
        log?.error({ err: reason, path: handler.requestPath }, "a call could not be answered as its handler meant; answered INTERNAL");
        answerInternal(res);
      });
  };
}

function answerInternal(res: Http2ServerResponse): void {
  if (res.stream.destroyed || res.stream.closed) return;
  if (res.headersSent) {
    res.stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
    return;
  }
  const contentType = String(res.req.headers["content-type"] ?? "");
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
