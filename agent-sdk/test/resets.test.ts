/**
 * A call torn down by the daemon's side (a stream reset with INTERNAL_ERROR, CANCEL or
 * REFUSED_STREAM, the connection dropped under it as when the daemon's process dies, a GOAWAY
 * with an error code) reaches the SDK's callers as UNAVAILABLE, the code that says "try again",
 * on both transports the SDK offers (fastTransport true and false) and for unary calls, the agent
 * stream and server streams alike; the interceptors an agent is given see the same code. Before,
 * these read as INTERNAL (as if the daemon had answered with a bug) or CANCELED (as if the caller
 * had cancelled). A call the caller cancelled, one whose deadline passed, and an INTERNAL status
 * the daemon did send keep their codes.
 *
 * The daemon here is a bare HTTP/2 server that does to each stream what the case says.
 */
import http2 from "node:http2";
import type { AddressInfo, Socket } from "node:net";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Link, type AgentClient } from "../src/link.js";
import { resolveOptions } from "../src/options.js";
import { testLogger } from "./support.js";

const GRPC = { ":status": 200, "content-type": "application/grpc" };
type Serve = (s: http2.ServerHttp2Stream) => void;

let serve: Serve = () => {};
const server = http2.createServer();
const sockets = new Set<Socket>();
let address = "";

beforeAll(async () => {
  server.on("connection", (socket: Socket) => sockets.add(socket.once("close", () => sockets.delete(socket))));
  server.on("session", (session) => session.on("error", () => {}));
  server.on("stream", (stream) => {
    stream.on("error", () => {});
    stream.resume();
    serve(stream);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  for (const s of sockets) s.destroy();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

/** The connection drops: what the daemon's process dying looks like from the agent. */
const dropConnections = () => {
  for (const s of sockets) s.destroy();
};

const TORN_DOWN: [string, Serve][] = [
  ["the daemon resets the stream with INTERNAL_ERROR", (s) => s.close(http2.constants.NGHTTP2_INTERNAL_ERROR)],
  ["the daemon resets the stream with CANCEL", (s) => s.close(http2.constants.NGHTTP2_CANCEL)],
  ["the daemon refuses the stream (REFUSED_STREAM)", (s) => s.close(http2.constants.NGHTTP2_REFUSED_STREAM)],
  ["the connection drops after the daemon's headers", (s) => (s.respond(GRPC), setImmediate(dropConnections))],
  [
    "the connection is reset (TCP RST) after the daemon's headers",
    (s) => (
      s.respond(GRPC),
      setImmediate(() => {
        for (const k of sockets) k.resetAndDestroy();
      })
    ),
  ],
  [
    "the daemon ends its session with GOAWAY INTERNAL_ERROR after its headers",
    (s) => (s.respond(GRPC), setImmediate(() => (s.session?.goaway(http2.constants.NGHTTP2_INTERNAL_ERROR), s.session?.destroy()))),
  ],
];

/** The agent's request side of the stream: open, sending nothing, until the call ends. */
async function* silent(signal: AbortSignal): AsyncGenerator<never> {
  await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
}

type Call = (client: AgentClient, options: { signal?: AbortSignal; timeoutMs?: number }) => Promise<unknown>;
const CALLS: [string, Call][] = [
  ["a unary call", (c, o) => c.claim({ name: "x" }, o)],
  [
    "the agent stream",
    async (c, o) => {
      const done = new AbortController();
      try {
        for await (const _ of c.connect(silent(done.signal), o));
      } finally {
        done.abort();
      }
    },
  ],
  [
    "a server stream",
    async (c, o) => {
      for await (const _ of c.watchDirectives({ name: "x" }, o));
    },
  ],
];

/** How a call through a fresh Link ended, as its caller and as the agent's own interceptor saw it. */
async function ending(
  fastTransport: boolean,
  call: Call,
  options: { signal?: AbortSignal; timeoutMs?: number } = {},
): Promise<{ caller: Code | "ok"; interceptor: Code | "ok" }> {
  let seen: Code | "ok" = "ok";
  const watch: Interceptor = (next) => async (req) => {
    try {
      const res = await next(req);
      if (!res.stream) return res;
      const messages = res.message;
      return {
        ...res,
        message: (async function* () {
          try {
            yield* messages;
          } catch (err) {
            seen = ConnectError.from(err).code;
            throw err;
          }
        })(),
      };
    } catch (err) {
      seen = ConnectError.from(err).code;
      throw err;
    }
  };
  const opts = resolveOptions({
    address,
    name: "resets",
    tenants: ["t1"],
    handlers: { k: async () => null },
    fastTransport,
    interceptors: [watch],
    logger: testLogger(),
  });
  const link = new Link(opts, testLogger(), { register: async () => {}, onDisconnected: () => {}, onFatal: () => {} });
  try {
    await call(link.client, { timeoutMs: 10_000, ...options });
    return { caller: "ok", interceptor: seen };
  } catch (err) {
    return { caller: ConnectError.from(err).code, interceptor: seen };
  } finally {
    link.close();
  }
}

describe.each([true, false])("fastTransport: %s", (fastTransport) => {
  describe.each(CALLS)("%s", (_, call) => {
    it.each(TORN_DOWN)("%s: UNAVAILABLE, to the caller and to its interceptors", async (_what, script) => {
      serve = script;
      expect(await ending(fastTransport, call)).toEqual({ caller: Code.Unavailable, interceptor: Code.Unavailable });
    });

    it("the caller's own cancel stays CANCELED", async () => {
      const cancel = new AbortController();
      serve = (s) => (s.respond(GRPC), setImmediate(() => cancel.abort()));
      expect(await ending(fastTransport, call, { signal: cancel.signal })).toEqual({ caller: Code.Canceled, interceptor: Code.Canceled });
    });

    it("a deadline that passes stays DEADLINE_EXCEEDED", async () => {
      serve = (s) => s.respond(GRPC);
      expect(await ending(fastTransport, call, { timeoutMs: 50 })).toEqual({ caller: Code.DeadlineExceeded, interceptor: Code.DeadlineExceeded });
    });

    it("an INTERNAL status the daemon sent stays INTERNAL", async () => {
      serve = (s) => s.respond({ ...GRPC, "grpc-status": String(Code.Internal), "grpc-message": "a bug" }, { endStream: true });
      expect(await ending(fastTransport, call)).toEqual({ caller: Code.Internal, interceptor: Code.Internal });
    });
  });
});
