/**
 * Which unary methods the direct path serves, and how a server's HTTP/2 streams are split between
 * it and connect-node: both serve the same implementations, recorded as the routes register them.
 */
import type http2 from "node:http2";
import type { Http2ServerRequest, Http2ServerResponse, IncomingHttpHeaders, ServerHttp2Stream } from "node:http2";
import { createServiceImplSpec, type ConnectRouter, type MethodImplSpec } from "@connectrpc/connect";

export type UnarySpec = Extract<MethodImplSpec, { kind: "unary" }>;

export type BidiSpec = Extract<MethodImplSpec, { kind: "bidi_streaming" }>;

/** What else recordUnary records: bidi methods (for the bidi direct path), and every path whose request is a stream. */
export interface RecordedStreams {
  bidi: Map<string, BidiSpec>;
  /** Paths of client-streaming and bidi methods: their request bodies last as long as the call. */
  streamingRequests: Set<string>;
}

/**
 * Records the unary methods the routes register (and registers them with connect as before), so
 * both paths serve the same implementations; and, in `streams`, the streaming ones.
 */
export function recordUnary(
  routes: (router: ConnectRouter) => void,
  specs: Map<string, UnarySpec>,
  streams?: RecordedStreams,
): (router: ConnectRouter) => void {
  return (router) =>
    routes(
      Object.assign(Object.create(router) as ConnectRouter, {
        service(...args: Parameters<ConnectRouter["service"]>) {
          const [service, impl] = args;
          for (const m of Object.values(createServiceImplSpec(service, impl).methods)) {
            const path = `/${service.typeName}/${m.method.name}`;
            if (m.kind === "unary") specs.set(path, m);
            if (m.kind === "client_streaming" || m.kind === "bidi_streaming") streams?.streamingRequests.add(path);
            if (m.kind === "bidi_streaming") streams?.bidi.set(path, m);
          }
          return router.service(...args);
        },
      }),
    );
}

/**
 * Routes a server's streams: the direct path's first, the rest to the compatibility layer's
 * 'request' handler (connect-node). Node adds that layer as a 'stream' listener of its own when the
 * first 'request' listener is added; it is taken off and called here for the streams the direct
 * path leaves, so that it never wraps a stream the direct path serves.
 */
export function routeStreams(
  server: http2.Http2Server,
  direct: (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => boolean,
  request: (req: Http2ServerRequest, res: Http2ServerResponse) => void,
): void {
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
