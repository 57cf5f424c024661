/**
 * The server's connect-node handler (src/server/connect-handler.ts) on a real HTTP/2 server, against
 * a stock client: a call connect-node cannot answer as its implementation meant is answered anyway,
 * a JSON request holding half a surrogate pair is refused as bad input, and a deadline past what a
 * timer holds lets the call run.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Health, HealthCheckResponse_ServingStatus } from "../src/gen/grpc/health/v1/health_pb.js";
import { connectHandler } from "../src/server/connect-handler.js";
import { codeOf } from "../../test/support/refusals.js";

const logged: { fields: object; message: string }[] = [];
let server: http2.Http2Server;
let baseUrl: string;
let sessionManager: Http2SessionManager;
/** What the next Check call's implementation does. */
let check: (service: string, timeoutMs: number | undefined) => Promise<{ status: HealthCheckResponse_ServingStatus }>;

beforeAll(async () => {
  server = http2.createServer();
  server.on(
    "request",
    connectHandler({
      routes: (router) => router.service(Health, { check: (req, ctx) => check(req.service, ctx.timeoutMs()) }),
      log: { error: (fields, message) => logged.push({ fields, message }) },
    }),
  );
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  sessionManager = new Http2SessionManager(baseUrl);
});

afterAll(async () => {
  sessionManager.abort();
  await new Promise((resolve) => server.close(resolve));
});

const health = (useBinaryFormat = true) => createClient(Health, createGrpcTransport({ baseUrl, sessionManager, useBinaryFormat }));

/** A Check with an empty request and this grpc-timeout; the grpc-status it ends with. */
async function rawCheck(grpcTimeout: string): Promise<string | undefined> {
  const session = http2.connect(baseUrl);
  try {
    const stream = session.request({
      ":method": "POST",
      ":path": "/grpc.health.v1.Health/Check",
      "content-type": "application/grpc",
      te: "trailers",
      "grpc-timeout": grpcTimeout,
    });
    let status: string | undefined;
    stream.on("response", (h) => (status ??= h["grpc-status"] as string | undefined));
    stream.on("trailers", (t) => (status = t["grpc-status"] as string | undefined));
    stream.resume();
    stream.end(Buffer.alloc(5));
    await new Promise((resolve) => stream.on("close", resolve));
    return status;
  } finally {
    session.close();
  }
}

describe("connectHandler", () => {
  it("answers INTERNAL, and logs why, when connect-node cannot send the error a handler threw", async () => {
    // A refusal with half a surrogate pair in it: connect's setTrailerStatus throws on it, and
    // connectNodeAdapter would leave the stream open until the client's deadline.
    check = () => Promise.reject(new ConnectError("no such service \ud83d", Code.NotFound));
    logged.length = 0;
    expect(await codeOf(health().check({ service: "x" }, { timeoutMs: 10_000 }))).toBe(Code.Internal);
    expect(logged).toHaveLength(1);
    expect(logged[0]!.message).toMatch(/could not be answered/);
    expect(String((logged[0]!.fields as { err: unknown }).err)).toMatch(/URI malformed/);
  });

  it("refuses a JSON request holding half a surrogate pair as INVALID_ARGUMENT", async () => {
    check = () => Promise.resolve({ status: HealthCheckResponse_ServingStatus.SERVING });
    expect(await codeOf(health(false).check({ service: "\ud83d" }, { timeoutMs: 10_000 }))).toBe(Code.InvalidArgument);
    expect(await codeOf(health(false).check({ service: "🙂" }, { timeoutMs: 10_000 }))).toBe("ok");
  });

  it("runs a call whose deadline is past what a timer holds as one with no deadline", async () => {
    let seen: number | undefined = -1;
    check = (_service, timeoutMs) => {
      seen = timeoutMs;
      return Promise.resolve({ status: HealthCheckResponse_ServingStatus.SERVING });
    };
    // 597 hours is past 2^31-1 ms: armed as it is, connect-node's timer would cut the call after 1 ms.
    // (A stock client cannot send it: its own timer would fire as soon.)
    expect(await rawCheck("597H")).toBe("0");
    expect(seen).toBeUndefined();
    expect(await rawCheck("596H")).toBe("0");
    expect(seen).toBeGreaterThan(2 ** 31 - 2 * 3600_000);
  });
});
