/**
 * The SDK's unary gRPC path (grpc-transport.ts) against a real HTTP/2 server whose answers each test
 * scripts frame by frame: what goes on the wire, and how every kind of answer — a reply, an error
 * in the trailers, a trailers-only error, an HTTP error, a reset, a bad frame, silence — reaches the
 * caller as connect would hand it over. The SDK's other tests run it against the real daemon.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, createClient, type Interceptor } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { AgentService, ClaimRequestSchema, ClaimResponseSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { createSdkGrpcTransport } from "../src/client/transport.js";
import { refusal } from "../../test/support/refusals.js";

type Script = (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, body: Buffer) => void;

let server: http2.Http2Server;
let baseUrl: string;
let script: Script;
/** Resolves with the RST_STREAM code the server saw when the client's stream closed. */
let closed: Promise<number>;
const sessions: Http2SessionManager[] = [];

beforeAll(async () => {
  server = http2.createServer();
  server.on("stream", (stream, headers) => {
    closed = new Promise((resolve) => stream.on("close", () => resolve(stream.rstCode ?? 0)));
    stream.on("error", () => {}); // a reset by the client is what some tests look for
    const chunks: Buffer[] = [];
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("end", () => script(stream, headers, Buffer.concat(chunks)));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterEach(() => {
  for (const s of sessions.splice(0)) s.abort();
});

afterAll(async () => {
  await new Promise((resolve) => server.close(resolve));
});

function client(opts: { interceptors?: Interceptor[]; readMaxBytes?: number; url?: string } = {}) {
  const url = opts.url ?? baseUrl;
  const sessionManager = new Http2SessionManager(url);
  sessions.push(sessionManager);
  return createClient(
    AgentService,
    createSdkGrpcTransport({ baseUrl: url, sessionManager, interceptors: opts.interceptors ?? [], readMaxBytes: opts.readMaxBytes }),
  );
}

function frame(payload: Uint8Array, flags = 0): Buffer {
  const out = Buffer.alloc(5 + payload.length);
  out[0] = flags;
  out.writeUInt32BE(payload.length, 1);
  out.set(payload, 5);
  return out;
}

const GRPC = { ":status": 200, "content-type": "application/grpc+proto" };

/** Answers with `reply` and status OK in trailers, as a gRPC server does. */
function answer(reply: Uint8Array, trailers: http2.OutgoingHttpHeaders = {}, headers: http2.OutgoingHttpHeaders = {}): Script {
  return (stream) => {
    stream.respond({ ...GRPC, ...headers }, { waitForTrailers: true });
    stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0", ...trailers }));
    stream.end(frame(reply));
  };
}

const REPLY = toBinary(
  ClaimResponseSchema,
  create(ClaimResponseSchema, {
    items: [{ id: "01J", payloadJson: '{"a":1}', leaseToken: "tok", dispatchedAtNs: 1_764_000_000_000_000_001n }],
    affinityKeys: ["k"],
  }),
);

describe("SDK gRPC transport (unary)", () => {
  it("sends one gRPC frame with gRPC headers and reads the reply, its headers and trailers", async () => {
    let seen: { headers: http2.IncomingHttpHeaders; request: unknown } | undefined;
    script = (stream, headers, body) => {
      seen = { headers, request: fromBinary(ClaimRequestSchema, body.subarray(5)) };
      expect(body.readUInt32BE(1)).toBe(body.length - 5);
      answer(REPLY, { "x-trailer": "t" }, { "x-header": "h" })(stream, headers, body);
    };
    const auth: Interceptor = (next) => (req) => {
      req.header.set("authorization", "Bearer secret");
      return next(req);
    };
    let header: Headers | undefined;
    let trailer: Headers | undefined;
    const res = await client({ interceptors: [auth] }).claim(
      { name: "agent-1", maxItems: 32, completions: [{ workItemId: "01H", leaseToken: "t1" }] },
      { timeoutMs: 5_000, onHeader: (h) => (header = h), onTrailer: (t) => (trailer = t) },
    );
    expect(res).toEqual(fromBinary(ClaimResponseSchema, REPLY));
    expect(seen!.request).toEqual(create(ClaimRequestSchema, { name: "agent-1", maxItems: 32, completions: [{ workItemId: "01H", leaseToken: "t1" }] }));
    expect(seen!.headers["content-type"]).toBe("application/grpc+proto");
    expect(seen!.headers.te).toBe("trailers");
    expect(seen!.headers["grpc-timeout"]).toBe("5000m");
    expect(seen!.headers.authorization).toBe("Bearer secret");
    expect(seen!.headers[":path"]).toBe("/aiflow.cluster.v1.AgentService/Claim");
    expect(header?.get("x-header")).toBe("h");
    expect(trailer?.get("x-trailer")).toBe("t");
  });

  it("hands interceptors a request with every field of its own, and the decoded reply", async () => {
    script = answer(REPLY);
    let request: Record<string, unknown> | undefined;
    let reply: unknown;
    const spy: Interceptor = (next) => async (req) => {
      request = req.message as Record<string, unknown>;
      const res = await next(req);
      reply = res.message;
      return res;
    };
    await client({ interceptors: [spy] }).claim({ name: "agent-1" });
    expect(request).toMatchObject({ $typeName: "aiflow.cluster.v1.ClaimRequest", name: "agent-1", maxItems: 0, completions: [] });
    expect(reply).toEqual(fromBinary(ClaimResponseSchema, REPLY));
  });

  // Node keeps a finished client stream alive through young-generation collections (until the next
  // full one), and with it everything its listeners reach: the call's request, reply and promises.
  it("leaves no listener on a finished stream, after a reply or an error", async () => {
    const sessionManager = new Http2SessionManager(baseUrl);
    sessions.push(sessionManager);
    const streams: http2.ClientHttp2Stream[] = [];
    const request = sessionManager.request.bind(sessionManager);
    sessionManager.request = async (...args) => {
      const stream = await request(...args);
      streams.push(stream);
      return stream;
    };
    const c = createClient(AgentService, createSdkGrpcTransport({ baseUrl, sessionManager, interceptors: [] }));
    script = answer(REPLY);
    await c.claim({ name: "agent-1" });
    script = answer(new Uint8Array(0), { "grpc-status": String(Code.NotFound), "grpc-message": "gone" });
    expect(await refusal(c.claim({ name: "agent-1" }))).toMatchObject({ code: Code.NotFound, rawMessage: "gone" });
    expect(streams).toHaveLength(2);
    for (const s of streams) expect(s.eventNames()).toEqual([]);
  });

  it("maps an error status in the trailers, with its message", async () => {
    script = answer(new Uint8Array(0), { "grpc-status": String(Code.NotFound), "grpc-message": encodeURIComponent("no agent named 'x'") });
    // An empty reply frame then a NOT_FOUND trailer: the status wins.
    expect(await refusal(client().claim({ name: "x" }))).toMatchObject({ code: Code.NotFound, rawMessage: "no agent named 'x'" });
  });

  it("maps a trailers-only error (status in the one HEADERS frame)", async () => {
    script = (stream) => stream.respond({ ...GRPC, "grpc-status": String(Code.Unauthenticated), "grpc-message": "bad token" }, { endStream: true });
    expect(await refusal(client().claim({ name: "x" }))).toMatchObject({ code: Code.Unauthenticated, rawMessage: "bad token" });
  });

  it("maps an HTTP error without a gRPC status as gRPC does (503: UNAVAILABLE)", async () => {
    script = (stream) => stream.respond({ ":status": 503 }, { endStream: true });
    expect((await refusal(client().claim({ name: "x" }))).code).toBe(Code.Unavailable);
  });

  it("refuses a reply without a status, a compressed frame, a malformed message and a second message", async () => {
    script = (stream) => {
      stream.respond(GRPC);
      stream.end(frame(REPLY));
    };
    expect(await refusal(client().claim({ name: "x" }))).toMatchObject({ code: Code.Internal, rawMessage: "protocol error: missing status" });
    script = (stream) => {
      stream.respond(GRPC, { waitForTrailers: true });
      stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
      stream.end(frame(REPLY, 1));
    };
    expect((await refusal(client().claim({ name: "x" }))).code).toBe(Code.Internal);
    script = answer(Buffer.from([0x1a, 0x05, 0x61]));
    expect(await refusal(client().claim({ name: "x" }))).toMatchObject({
      code: Code.Internal,
      rawMessage: expect.stringContaining("could not parse the reply"),
    });
    script = (stream) => {
      stream.respond(GRPC, { waitForTrailers: true });
      stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
      stream.end(Buffer.concat([frame(REPLY), frame(REPLY)]));
    };
    expect((await refusal(client().claim({ name: "x" }))).code).toBe(Code.Unimplemented);
  });

  it("refuses a reply larger than readMaxBytes with RESOURCE_EXHAUSTED", async () => {
    script = answer(REPLY);
    expect((await refusal(client({ readMaxBytes: 16 }).claim({ name: "x" }))).code).toBe(Code.ResourceExhausted);
  });

  it("a deadline ends the call with DEADLINE_EXCEEDED and resets the stream with CANCEL", async () => {
    script = (stream) => stream.respond(GRPC); // and never answers
    expect((await refusal(client().claim({ name: "x" }, { timeoutMs: 50 }))).code).toBe(Code.DeadlineExceeded);
    expect(await closed).toBe(http2.constants.NGHTTP2_CANCEL);
  });

  it("a cancelled call ends with CANCELED and resets the stream with CANCEL", async () => {
    script = (stream) => stream.respond(GRPC);
    const abort = new AbortController();
    const call = client().claim({ name: "x" }, { signal: abort.signal });
    const serverClosed = new Promise<void>((resolve) => server.once("stream", () => setImmediate(resolve)));
    await serverClosed;
    abort.abort();
    expect((await refusal(call)).code).toBe(Code.Canceled);
    expect(await closed).toBe(http2.constants.NGHTTP2_CANCEL);
  });

  it("a call whose signal is already aborted ends CANCELED without reaching the server", async () => {
    let reached = false;
    script = (stream) => {
      reached = true;
      answer(REPLY)(stream, {}, Buffer.alloc(0));
    };
    expect((await refusal(client().claim({ name: "x" }, { signal: AbortSignal.abort() }))).code).toBe(Code.Canceled);
    expect(reached).toBe(false);
  });

  it("with both a deadline and a caller's signal, whichever comes first ends the call", async () => {
    script = (stream) => stream.respond(GRPC);
    const abort = new AbortController();
    const call = client().claim({ name: "x" }, { signal: abort.signal, timeoutMs: 60_000 });
    await new Promise<void>((resolve) => server.once("stream", () => setImmediate(resolve)));
    abort.abort();
    expect((await refusal(call)).code).toBe(Code.Canceled);
    expect((await refusal(client().claim({ name: "x" }, { signal: new AbortController().signal, timeoutMs: 30 }))).code).toBe(Code.DeadlineExceeded);
  });

  it("applies interceptors in order, the first outermost, as connect does", async () => {
    script = answer(REPLY);
    const order: string[] = [];
    const named =
      (name: string): Interceptor =>
      (next) =>
      async (req) => {
        order.push(`${name}>`);
        const res = await next(req);
        order.push(`<${name}`);
        return res;
      };
    await client({ interceptors: [named("a"), named("b")] }).claim({ name: "x" });
    expect(order).toEqual(["a>", "b>", "<b", "<a"]);
  });

  it("maps a stream reset by the server: REFUSED_STREAM is UNAVAILABLE (safe to retry)", async () => {
    script = (stream) => stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
    expect((await refusal(client().claim({ name: "x" }))).code).toBe(Code.Unavailable);
  });

  it("a daemon that is not listening is UNAVAILABLE", async () => {
    const probe = http2.createServer();
    await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
    const port = (probe.address() as AddressInfo).port;
    await new Promise((resolve) => probe.close(resolve));
    expect((await refusal(client({ url: `http://127.0.0.1:${port}` }).claim({ name: "x" }))).code).toBe(Code.Unavailable);
  });
});
