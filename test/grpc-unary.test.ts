/**
 * The direct gRPC unary path (wire/src/server/unary-fast-path.ts), spoken to byte by byte over a raw HTTP/2
 * client: answers and refusals as gRPC status trailers, framing and size errors with a clear status
 * (and the daemon serving on, through clients that reset their streams), deadlines and cancellation
 * reaching the handler, the same methods still served over gRPC-Web and Connect by connect-node, and
 * the streams it serves never wrapped by Node's compatibility layer.
 */
import { once } from "node:events";
import http2 from "node:http2";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import type { AddressInfo } from "node:net";
import { Code, ConnectError, createClient, createContextKey, createContextValues, type Interceptor, type ServiceImpl } from "@connectrpc/connect";
import { connectNodeAdapter, createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grpcUnaryFastPath, recordUnary, routeStreams, type UnarySpec } from "@aiflow/wire/server";
import type { Daemon } from "../src/daemon.js";
import { AgentService, ClaimRequestSchema, ClaimResponseSchema, RegisterRequestSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import {
  Health,
  HealthCheckRequestSchema,
  HealthCheckResponseSchema,
  HealthCheckResponse_ServingStatus as Serving,
} from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import { TOKENS } from "./support/daemon.js";
import type { TestDb } from "./support/db.js";
import { until, useTestDaemon } from "./support/kit.js";
import { serverNow, STATEMENT, untilStatementRan } from "./support/queue.js";
import type { Logger } from "../src/log.js";
import { captureLog } from "./support/agents.js";
import { grpcMessage as frame } from "./support/wire.js";

const fx = useTestDaemon({ label: "gunary", config: { tenants: ["t1"] } });
let db: TestDb;
let daemon: Daemon;
let session: http2.ClientHttp2Session;

beforeAll(() => {
  ({ db, daemon } = fx);
  session = http2.connect(`http://${daemon.address}`);
});
afterAll(() => session?.close());

interface Answer {
  headers: http2.IncomingHttpHeaders;
  trailers: http2.IncomingHttpHeaders;
  body: Buffer;
  /** grpc-status, from the trailers or (trailers-only) the headers. */
  status: number;
  message: string;
}

function call(
  path: string,
  body: Buffer,
  headers: Record<string, string> = {},
  opts: { cancelAfterMs?: number; on?: http2.ClientHttp2Session } = {},
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = (opts.on ?? session).request({ ":method": "POST", ":path": path, "content-type": "application/grpc", te: "trailers", ...headers });
    let head: http2.IncomingHttpHeaders = {};
    let trailers: http2.IncomingHttpHeaders = {};
    const chunks: Buffer[] = [];
    req.on("response", (h) => (head = h));
    req.on("trailers", (t) => (trailers = t));
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("error", reject);
    req.on("close", () => {
      const st = trailers["grpc-status"] ?? head["grpc-status"];
      const msg = trailers["grpc-message"] ?? head["grpc-message"];
      resolve({
        headers: head,
        trailers,
        body: Buffer.concat(chunks),
        status: st === undefined ? -1 : Number(st),
        message: decodeURIComponent(String(msg ?? "")),
      });
    });
    if (opts.cancelAfterMs !== undefined) {
      req.end(body);
      setTimeout(() => req.close(http2.constants.NGHTTP2_CANCEL), opts.cancelAfterMs);
    } else req.end(body);
  });
}

const HEALTH = "/grpc.health.v1.Health/Check";
const CLAIM = "/aiflow.cluster.v1.AgentService/Claim";
const agentAuth = { authorization: `Bearer ${TOKENS.agent}` };
const healthy = async () => {
  const a = await call(HEALTH, frame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema))));
  expect(a.status).toBe(0);
  expect(fromBinary(HealthCheckResponseSchema, a.body.subarray(5)).status).toBe(Serving.SERVING);
};

describe("the direct gRPC unary path", () => {
  it("answers a plain gRPC call with the message, content type and status 0 in the trailers", async () => {
    const a = await call(HEALTH, frame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema))));
    expect(a.headers[":status"]).toBe(200);
    expect(a.headers["content-type"]).toBe("application/grpc");
    expect(a.trailers["grpc-status"]).toBe("0");
    expect(a.body.readUInt32BE(1)).toBe(a.body.length - 5);
    expect(fromBinary(HealthCheckResponseSchema, a.body.subarray(5)).status).toBe(Serving.SERVING);
  });

  it("refuses through the same interceptors and implementations: status and message in a trailers-only answer", async () => {
    const claim = frame(toBinary(ClaimRequestSchema, create(ClaimRequestSchema, { name: "nobody" })));
    const noToken = await call(CLAIM, claim);
    expect(noToken).toMatchObject({ status: Code.Unauthenticated, message: "missing bearer token: send 'authorization: Bearer <token>'" });
    expect(noToken.trailers).toEqual({});
    const badName = await call(CLAIM, frame(toBinary(ClaimRequestSchema, create(ClaimRequestSchema, { name: "no spaces allowed" }))), agentAuth);
    expect(badName.status).toBe(Code.InvalidArgument);
    expect(badName.message).toContain("name");
    await healthy();
  });

  it("gives framing, decoding and size errors a clear status, and serves on", async () => {
    const ok = toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema));
    expect(await call(HEALTH, frame(ok, 1))).toMatchObject({ status: Code.Internal, message: "protocol error: a compressed message without grpc-encoding" });
    // Cardinality violations are UNIMPLEMENTED (the gRPC status-code table); a message cut short is a protocol error.
    expect(await call(HEALTH, Buffer.concat([frame(ok), frame(ok)]))).toMatchObject({
      status: Code.Unimplemented,
      message: "a unary request needs exactly one message; it had more",
    });
    expect(await call(HEALTH, Buffer.alloc(0))).toMatchObject({
      status: Code.Unimplemented,
      message: "a unary request needs exactly one message; it had none",
    });
    expect(await call(HEALTH, frame(ok).subarray(0, 3))).toMatchObject({ status: Code.Internal, message: "protocol error: the request message was cut short" });
    expect(await call(HEALTH, Buffer.concat([frame(Buffer.from([8, 1, 16]))]).subarray(0, 6))).toMatchObject({
      status: Code.Internal,
      message: "protocol error: the request message was cut short",
    });
    expect((await call(HEALTH, frame(Buffer.from([0xff, 0xff, 0xff])))).status).toBe(Code.Internal);
    const huge = Buffer.alloc(5);
    huge.writeUInt32BE(64 * 1024 * 1024, 1);
    expect(await call(HEALTH, huge)).toMatchObject({ status: Code.ResourceExhausted, message: expect.stringMatching(/^message larger than \d+ bytes$/) });
    expect((await call(HEALTH, frame(ok), { "grpc-timeout": "soon" })).status).toBe(Code.InvalidArgument);
    await healthy();
  });

  it("ends a long-poll at the client's deadline, and a cancelled one leaves the daemon serving", async () => {
    await createClient(AgentService, createConnectTransport({ baseUrl: `http://${daemon.address}`, httpVersion: "2" })).register(
      create(RegisterRequestSchema, { name: "unary-poller", metadata: { tenants: ["t1"], engineKinds: ["k"], tags: {}, slots: 1 } }),
      { headers: agentAuth },
    );
    const poll = frame(toBinary(ClaimRequestSchema, create(ClaimRequestSchema, { name: "unary-poller", maxItems: 1, wait: durationFromMs(20_000) })));
    // Without the deadline reaching the handler, this call would hold for the whole 20 s wait.
    const due = await call(CLAIM, poll, { ...agentAuth, "grpc-timeout": "200m" });
    expect(due.status).toBe(0);
    expect(fromBinary(ClaimResponseSchema, due.body.subarray(5)).items).toEqual([]);
    const cancelled = await call(CLAIM, poll, agentAuth, { cancelAfterMs: 50 });
    expect(cancelled.status).toBe(-1);
    await healthy();
  });

  it("outlives clients that reset their streams with an error, mid-request and mid-call", async () => {
    await createClient(AgentService, createConnectTransport({ baseUrl: `http://${daemon.address}`, httpVersion: "2" })).register(
      create(RegisterRequestSchema, { name: "unary-resetter", metadata: { tenants: ["t1"], engineKinds: ["k"], tags: {}, slots: 1 } }),
      { headers: agentAuth },
    );
    const poll = frame(toBinary(ClaimRequestSchema, create(ClaimRequestSchema, { name: "unary-resetter", maxItems: 1, wait: durationFromMs(20_000) })));
    // A stream reset with an error code (not CANCEL) is an 'error' event on the daemon's stream:
    // unheard, an uncaught exception. Half a message, reset once it is on the wire; a whole one,
    // reset once the daemon's claim has looked at the table and waits (the long-poll).
    const reset = async (body: Buffer, whole: boolean) => {
      const since = await serverNow(db);
      const req = session.request({ ":method": "POST", ":path": CLAIM, "content-type": "application/grpc", te: "trailers", ...agentAuth });
      req.on("error", () => {});
      const closed = new Promise((resolve) => req.on("close", resolve));
      if (whole) {
        req.end(body);
        await untilStatementRan(db, STATEMENT.claim, since);
      } else await new Promise((resolve) => req.write(body, resolve));
      req.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
      await closed;
    };
    await reset(poll.subarray(0, 8), false);
    await reset(poll, true);
    await healthy();
  });

  it("serves many calls at once, each reading its signal, without Node's listener-leak warning", async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.name);
    process.on("warning", onWarning);
    // All 30 are in the handler, their signals made, before any answers: the shutdown signal is
    // one, and nothing may add a listener to it per call.
    let arrived = 0;
    let release!: () => void;
    const allIn = new Promise<void>((r) => (release = r));
    const { on, close } = await directHealthServer({
      shutdownSignal: new AbortController().signal,
      async check(_req, ctx) {
        expect(ctx.signal.aborted).toBe(false);
        if (++arrived === 30) release();
        await allIn;
        return { status: Serving.SERVING };
      },
    });
    try {
      const answers = await Promise.all(
        Array.from({ length: 30 }, () => call(HEALTH, frame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema))), {}, { on })),
      );
      expect(answers.every((a) => a.status === 0)).toBe(true);
      await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
    } finally {
      process.off("warning", onWarning);
      await close();
    }
    expect(arrived).toBe(30);
    expect(warnings).not.toContain("MaxListenersExceededWarning");
  });

  it("leaves gRPC-Web and Connect calls of the same methods to connect-node", async () => {
    for (const transport of [
      createGrpcWebTransport({ baseUrl: `http://${daemon.address}`, httpVersion: "2" }),
      createConnectTransport({ baseUrl: `http://${daemon.address}`, httpVersion: "2" }),
    ]) {
      expect((await createClient(Health, transport).check({})).status).toBe(Serving.SERVING);
    }
  });
});

/**
 * A bare HTTP/2 server whose Health calls take the direct path (check answers them), every other
 * stream going to `request`; and a client session on it. close() ends both.
 */
async function directHealthServer(
  opts: {
    check?: ServiceImpl<typeof Health>["check"];
    request?: (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void;
    shutdownSignal?: AbortSignal;
    interceptors?: Interceptor[];
    log?: Logger;
  } = {},
) {
  const specs = new Map<string, UnarySpec>();
  connectNodeAdapter({
    routes: recordUnary((router) => router.service(Health, { check: opts.check ?? (() => ({ status: Serving.SERVING })), async *watch() {} }), specs),
  });
  const fast = grpcUnaryFastPath(specs, {
    interceptors: opts.interceptors ?? [],
    readMaxBytes: 1 << 20,
    shutdownSignal: opts.shutdownSignal ?? new AbortController().signal,
    log: opts.log,
  });
  const server = http2.createServer();
  routeStreams(server, fast, opts.request ?? ((_req, res) => res.writeHead(404).end()));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const on = http2.connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  return {
    server,
    on,
    close: async () => {
      on.close();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

describe("routing a server's streams", () => {
  it("gives the direct path's calls to it alone, and every other stream to the request handler", async () => {
    const handled: string[] = [];
    const { server, on, close } = await directHealthServer({
      request: (req, res) => {
        handled.push(req.url);
        res.writeHead(404).end();
      },
    });
    let requests = 0;
    server.on("request", () => requests++);
    try {
      // Served directly: Node's compatibility layer never made a request of it.
      expect((await call(HEALTH, frame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema))), {}, { on })).status).toBe(0);
      expect(requests).toBe(0);
      // Not the direct path's (another method, another content type): the request handler answers.
      expect((await call("/no.Such/Method", Buffer.alloc(0), {}, { on })).headers[":status"]).toBe(404);
      expect((await call(HEALTH, Buffer.alloc(0), { "content-type": "application/grpc-web" }, { on })).headers[":status"]).toBe(404);
      expect(handled).toEqual(["/no.Such/Method", HEALTH]);
      expect(requests).toBe(2);
    } finally {
      await close();
    }
  });
});

describe("a reply that cannot be encoded", () => {
  it("is logged with a reference and answered INTERNAL with that reference, not as a bad request", async () => {
    const captured = captureLog("error");
    // A bigint where the reply's enum wants a number: the codec refuses it.
    const { on, close } = await directHealthServer({ check: () => ({ status: 1n as unknown as Serving }), log: captured.log });
    try {
      const res = await call(HEALTH, frame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema))), {}, { on });
      expect(res.status).toBe(Code.Internal);
      const ref = /^internal error \(ref ([0-9a-f-]{36})\)$/.exec(res.message)?.[1];
      expect(ref).toBeDefined();
      expect(res.message).not.toContain("could not read the request");
      const [line] = captured.lines().filter((l) => l.msg === "could not encode a reply");
      expect(line).toMatchObject({ ref, method: HEALTH });
    } finally {
      await close();
    }
  });
});

describe("direct gRPC path: finished streams", () => {
  // Node keeps a finished stream alive through young-generation collections (until the next full
  // one), and with it everything its listeners reach: the request's body, the call's signal.
  it("leaves no listener on a stream it served, after an answer or a refusal", async () => {
    const { server, on, close } = await directHealthServer();
    const closed: Promise<http2.ServerHttp2Stream>[] = [];
    // After routeStreams' listener, so the direct path's listeners go on first (as in the daemon).
    server.on("stream", (stream: http2.ServerHttp2Stream) => closed.push(once(stream, "close").then(() => stream)));
    try {
      expect((await call(HEALTH, frame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema))), {}, { on })).status).toBe(0);
      expect((await call(HEALTH, Buffer.alloc(0), {}, { on })).status).toBe(Code.Unimplemented);
      const streams = await Promise.all(closed);
      expect(streams).toHaveLength(2);
      for (const stream of streams) expect(stream.eventNames()).toEqual([]);
    } finally {
      await close();
    }
  });
});

describe("direct gRPC path: the handler's context", () => {
  it("makes a call's AbortSignal only when something reads it (minor collections do not free one per call)", async () => {
    const Real = globalThis.AbortController;
    let made = 0;
    globalThis.AbortController = class extends Real {
      constructor() {
        super();
        made++;
      }
    };
    let read = false;
    const { on, close } = await directHealthServer({
      check(_req, ctx) {
        if (read) expect(ctx.signal.aborted).toBe(false);
        return { status: Serving.SERVING };
      },
    });
    try {
      made = 0; // the server's own, made as it started
      const request = frame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema)));
      for (let i = 0; i < 5; i++) expect((await call(HEALTH, request, { "grpc-timeout": "10S" }, { on })).status).toBe(0);
      expect(made).toBe(0);
      read = true;
      expect((await call(HEALTH, request, {}, { on })).status).toBe(0);
      expect(made).toBe(1);
    } finally {
      globalThis.AbortController = Real;
      await close();
    }
  });

  it("aborts the signal of a call whose client goes away, read before or after it went", async () => {
    const reasons: unknown[] = [];
    let entered!: () => void;
    const inHandler = new Promise<void>((r) => (entered = r));
    let gone!: () => void;
    const clientGone = new Promise<void>((r) => (gone = r));
    const { on, close } = await directHealthServer({
      async check(_req, ctx) {
        const early = ctx.signal;
        entered();
        await clientGone;
        await until("the first signal is aborted too", () => early.aborted);
        reasons.push(early.reason, ctx.signal.reason);
        throw new ConnectError("gone", Code.Canceled);
      },
    });
    try {
      const answer = call(HEALTH, frame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema))), {}, { on, cancelAfterMs: 0 });
      await inHandler;
      await answer;
      gone();
      await until("the handler saw both signals aborted", () => reasons.length === 2);
      expect(reasons.map((r) => ConnectError.from(r).code)).toEqual([Code.Canceled, Code.Canceled]);
    } finally {
      await close();
    }
  });

  it("gives the handler the headers and values an interceptor passes on, and sends the headers it sets", async () => {
    const who = createContextKey<string>("nobody", { description: "who" });
    const swap: Interceptor = (next) => (req) => {
      const header = new Headers(req.header);
      header.set("x-checked", "by-interceptor");
      return next({ ...req, header, contextValues: createContextValues().set(who, req.header.get("x-caller") ?? "?") });
    };
    const seen: { checked?: string | null; who?: string; aborted?: boolean } = {};
    const { on, close } = await directHealthServer({
      interceptors: [swap],
      check(_req, ctx) {
        seen.checked = ctx.requestHeader.get("x-checked");
        seen.who = ctx.values.get(who);
        seen.aborted = ctx.signal.aborted;
        ctx.responseHeader.set("x-handled", "yes");
        ctx.responseTrailer.set("x-trailer", "done");
        return { status: Serving.SERVING };
      },
    });
    try {
      const a = await call(HEALTH, frame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema))), { "x-caller": "ops-7" }, { on });
      expect(a.status).toBe(0);
      expect(seen).toEqual({ checked: "by-interceptor", who: "ops-7", aborted: false });
      expect(a.headers["x-handled"]).toBe("yes");
      expect(a.trailers["x-trailer"]).toBe("done");
    } finally {
      await close();
    }
  });

  it("aborts a call in flight when the server stops for good, and tells the handler its deadline", async () => {
    const shutdown = new AbortController();
    const seen: { timeoutMs?: number; reason?: unknown } = {};
    const { on, close } = await directHealthServer({
      shutdownSignal: shutdown.signal,
      async check(_req, ctx) {
        seen.timeoutMs = ctx.timeoutMs();
        await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
        seen.reason = ctx.signal.reason;
        throw new ConnectError("stopped", Code.Unavailable);
      },
    });
    try {
      const answer = call(HEALTH, frame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema))), { "grpc-timeout": "60S" }, { on });
      await until("the handler runs", () => seen.timeoutMs !== undefined);
      // The handler's deadline is the header's minute, less what passed since the call began (less
      // than the test's own timeout): not the server's default, nor another unit.
      expect(seen.timeoutMs).toBeGreaterThan(60_000 - 30_000);
      expect(seen.timeoutMs).toBeLessThanOrEqual(60_000);
      shutdown.abort(new ConnectError("the server is stopping", Code.Unavailable));
      expect((await answer).status).toBe(Code.Unavailable);
      expect(ConnectError.from(seen.reason).rawMessage).toBe("the server is stopping");
    } finally {
      await close();
    }
  });
});
