/**
 * Calls are refused on their request headers (src/server/gate.ts), in the caller's protocol, before
 * any of the body is read: every request here sends headers and part of a body and never ends it,
 * so an answer proves nothing waited for the body. Failures are logged (never the token) and counted,
 * and an address that keeps failing has its failing calls refused for a window on the daemon's clock
 * (its calls with a valid token are served).
 */
import { once } from "node:events";
import http2 from "node:http2";
import net from "node:net";
import { beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { captureLog, type CapturedLog } from "./support/agents.js";
import { TOKENS } from "./support/daemon.js";
import { useTestDaemon } from "./support/kit.js";

const clock = new FakeClock();
const log: CapturedLog = captureLog("warn");
const fx = useTestDaemon({ label: "authhdr", clock, log: log.log, config: { authFailureLimit: 20, authFailureWindow: 60_000 } });
let daemon: Daemon;
beforeAll(() => void ({ daemon } = fx));

const ENQUEUE = "/aiflow.cluster.v1.QueueService/Enqueue";
/** Part of a gRPC message that says it is 1 MB long: the rest never comes. */
const partialGrpc = () => {
  const b = Buffer.alloc(5 + 100);
  b.writeUInt32BE(1_000_000, 1);
  return b;
};

interface Answer {
  status: number;
  headers: http2.IncomingHttpHeaders;
  body: string;
}

/** Sends the headers and `body` without ending the request; resolves with whatever comes back. */
function unfinished(headers: http2.OutgoingHttpHeaders, body: Buffer, opts: { localAddress?: string } = {}): Promise<Answer> {
  const session = http2.connect(`http://${daemon.address}`, {
    createConnection: () => net.connect({ host: "127.0.0.1", port: daemon.port, localAddress: opts.localAddress }),
  });
  session.on("error", () => {});
  return new Promise((resolve, reject) => {
    const req = session.request({ ":method": "POST", ...headers });
    const chunks: Buffer[] = [];
    let head: http2.IncomingHttpHeaders = {};
    req.on("response", (h) => (head = h));
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("error", reject);
    // The answer's end, not the stream's close: the server reads and drops the rest of a refused
    // body for a while, and this body never ends.
    req.on("end", () => {
      session.destroy();
      resolve({ status: Number(head[":status"]), headers: head, body: Buffer.concat(chunks).toString() });
    });
    req.write(body);
  });
}

/** A whole call with an empty message; its grpc-status. */
async function whole(headers: http2.OutgoingHttpHeaders, opts: { localAddress?: string } = {}): Promise<unknown> {
  const session = http2.connect(`http://${daemon.address}`, {
    createConnection: () => net.connect({ host: "127.0.0.1", port: daemon.port, localAddress: opts.localAddress }),
  });
  const req = session.request({ ":method": "POST", ...headers });
  let status: unknown;
  req.on("response", (h) => (status ??= h["grpc-status"]));
  req.on("trailers", (h) => (status = h["grpc-status"]));
  req.end(Buffer.alloc(5));
  req.resume();
  await once(req, "close");
  session.close();
  return status;
}

const grpc = (token?: string, path = ENQUEUE, contentType = "application/grpc") => ({
  ":path": path,
  "content-type": contentType,
  te: "trailers",
  ...(token ? { authorization: `Bearer ${token}` } : {}),
});

describe("refusing on the request headers", () => {
  it("gRPC: no token is UNAUTHENTICATED, an unknown one too, a wrong role PERMISSION_DENIED, each trailers-only", async () => {
    const none = await unfinished(grpc(), partialGrpc());
    expect(none.headers["grpc-status"]).toBe("16");
    expect(decodeURIComponent(String(none.headers["grpc-message"]))).toBe("missing bearer token: send 'authorization: Bearer <token>'");
    const unknown = await unfinished(grpc("not-a-token"), partialGrpc());
    expect(unknown.headers["grpc-status"]).toBe("16");
    expect(decodeURIComponent(String(unknown.headers["grpc-message"]))).toBe("unknown bearer token");
    const role = await unfinished(grpc(TOKENS.agent), partialGrpc());
    expect(role.headers["grpc-status"]).toBe("7");
    expect(decodeURIComponent(String(role.headers["grpc-message"]))).toBe("Enqueue needs a token with role 'engine'");
    // A streaming method goes to connect-node: refused the same way, before it is reached.
    const watch = await unfinished(grpc(TOKENS.engine, "/aiflow.cluster.v1.AgentService/WatchDirectives"), partialGrpc());
    expect(watch.headers["grpc-status"]).toBe("7");
  });

  it("gRPC-Web: the status in the response headers", async () => {
    const a = await unfinished(grpc(undefined, ENQUEUE, "application/grpc-web+proto"), partialGrpc());
    expect(a.status).toBe(200);
    expect(a.headers["grpc-status"]).toBe("16");
  });

  it("Connect: HTTP 401 and 403 with Connect's JSON error body; a streaming call an end-stream message", async () => {
    const body = Buffer.from('{"tenantKey":"default","items":[');
    const none = await unfinished({ ":path": ENQUEUE, "content-type": "application/json", "content-length": "3000000" }, body);
    expect(none.status).toBe(401);
    expect(JSON.parse(none.body)).toEqual({ code: "unauthenticated", message: "missing bearer token: send 'authorization: Bearer <token>'" });
    const role = await unfinished({ ":path": ENQUEUE, "content-type": "application/proto", authorization: `Bearer ${TOKENS.ops}` }, Buffer.alloc(10));
    expect(role.status).toBe(403);
    expect(JSON.parse(role.body)).toEqual({ code: "permission_denied", message: "Enqueue needs a token with role 'engine'" });
    const stream = await unfinished(
      { ":path": "/aiflow.cluster.v1.AgentService/WatchDirectives", "content-type": "application/connect+json" },
      Buffer.alloc(5),
    );
    expect(stream.status).toBe(200);
    expect(stream.body.charCodeAt(0)).toBe(2);
    expect(JSON.parse(stream.body.slice(5))).toEqual({
      error: { code: "unauthenticated", message: "missing bearer token: send 'authorization: Bearer <token>'" },
    });
  });

  it("drops the rest of a refused body rather than resetting it, so a Node client's session survives many refusals", async () => {
    // A stream reset while a Node client still writes keeps the unsent bytes counted against that
    // client's session memory (10 MB by default); past it the session refuses every new stream.
    // From an address of its own, so that these failures do not throttle the other tests' calls.
    const session = http2.connect(`http://${daemon.address}`, {
      createConnection: () => net.connect({ host: "127.0.0.1", port: daemon.port, localAddress: "127.0.0.4" }),
    });
    const body = Buffer.alloc(1_000_000, 32);
    const statuses: number[] = [];
    // One after another: in parallel, the client's own buffered writes alone would pass that limit.
    for (let i = 0; i < 18; i++) {
      const req = session.request({ ":method": "POST", ":path": ENQUEUE, "content-type": "application/json", "content-length": String(body.length) });
      req.on("error", () => {});
      req.on("response", (h) => statuses.push(Number(h[":status"])));
      req.resume();
      req.end(body);
      await once(req, "close");
    }
    expect(statuses).toEqual(Array(18).fill(401));
    session.close();
  });

  it("a Connect GET is refused on its headers too", async () => {
    const session = http2.connect(`http://${daemon.address}`);
    const req = session.request({ ":method": "GET", ":path": "/aiflow.cluster.v1.QueueService/GetItem?encoding=json&message=%7B%7D&connect=v1" });
    req.end();
    const [head] = (await once(req, "response")) as [http2.IncomingHttpHeaders];
    expect(head[":status"]).toBe(401);
    req.resume();
    session.close();
  });

  it("health stays open, and a valid token passes to the handler", async () => {
    const session = http2.connect(`http://${daemon.address}`);
    for (const headers of [grpc(undefined, "/grpc.health.v1.Health/Check"), grpc(TOKENS.engine, "/aiflow.cluster.v1.QueueService/GetItem")]) {
      const req = session.request({ ":method": "POST", ...headers });
      let status: unknown;
      req.on("response", (h) => (status ??= h["grpc-status"]));
      req.on("trailers", (h) => (status = h["grpc-status"]));
      req.end(Buffer.alloc(5));
      req.resume();
      await once(req, "close");
      // GetItem of no id is the handler's INVALID_ARGUMENT: the call got past both checks.
      expect(["0", "3"]).toContain(status);
    }
    session.close();
  });

  it("logs each failure at warn with the address and reason, never the token, and counts it", async () => {
    const before = { ...daemon.serverStats.authFailures };
    await unfinished(grpc("secret-guess-123"), partialGrpc(), { localAddress: "127.0.0.3" });
    expect(daemon.serverStats.authFailures.unknown).toBe(before.unknown + 1);
    const line = log.lines().find((l) => l.remote === "127.0.0.3");
    expect(line).toMatchObject({ level: 40, reason: "unknown", service: "aiflow.cluster.v1.QueueService", method: "Enqueue" });
    expect(log.raw().join("\n")).not.toContain("secret-guess-123");
  });

  it("refuses an address past --auth-failure-limit its failing calls for the rest of its window, serves its valid ones; others are unaffected", async () => {
    const from = { localAddress: "127.0.0.2" };
    for (let i = 0; i < 21; i++) expect((await unfinished(grpc(`guess-${i}`), partialGrpc(), from)).headers["grpc-status"]).toBe("16");
    const throttled = await unfinished(grpc("guess-22"), partialGrpc(), from);
    expect(throttled.headers["grpc-status"]).toBe("8");
    expect(decodeURIComponent(String(throttled.headers["grpc-message"]))).toMatch(/too many failed authentications/);
    expect(daemon.serverStats.authThrottled).toBe(1);
    // A valid token from that address is served: GetItem of no id is the handler's INVALID_ARGUMENT.
    expect(await whole(grpc(TOKENS.engine, "/aiflow.cluster.v1.QueueService/GetItem"), from)).toBe("3");
    // Another address is not throttled.
    expect((await unfinished(grpc("guess"), partialGrpc())).headers["grpc-status"]).toBe("16");
    clock.advance(60_000);
    expect((await unfinished(grpc("guess-23"), partialGrpc(), from)).headers["grpc-status"]).toBe("16");
  });
});
