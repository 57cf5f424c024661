/**
 * /api (the Connect API on the HTTP port) holds callers to the gRPC port's checks, made by the same
 * gate (src/server/gate.ts): a call is refused on its request headers before a byte of its body is
 * read (no token, an unknown one, a token of the wrong role), a body is held to the message size
 * limit and the daemon-wide --max-inflight-bytes on its declared length, a refused request's
 * connection is closed rather than drained, and Health.Watch, the one stream open to anyone, is
 * capped per address across both ports. HTTP/2 cannot reach /api at all: the port speaks HTTP/1.1.
 *
 * Every refusal here is of a request that declared megabytes and sent a little: an answer proves
 * nothing waited for the body, and the server's close that it will not read the rest.
 */
import http2 from "node:http2";
import net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { TOKENS } from "./support/daemon.js";
import { connectStream, partialPost, post, type Target } from "./support/hostile-api.js";
import { useTestDaemon } from "./support/kit.js";

const fx = useTestDaemon({
  label: "hapibody",
  config: {
    httpListen: { host: "127.0.0.1", port: 0 },
    // The flood below is of failures: this file is not about the failure limit (hostile-api-lockout is).
    authFailureLimit: 1_000,
    maxInflightBytes: 2_000_000,
    healthWatchMaxPerAddress: 2,
  },
});
let daemon: Daemon;
let port: number;
beforeAll(() => {
  daemon = fx.daemon;
  port = Number(new URL(daemon.httpUrl!).port);
});

const LIST_AGENTS = "/api/aiflow.cluster.v1.OpsService/ListAgents";
const WATCH = "/api/grpc.health.v1.Health/Watch";
const MB3 = 3_000_000;
/** The start of a deeply nested JSON body: what cost the daemon seconds of CPU to decode. */
const nested = (n: number) => Buffer.from("[".repeat(n));
const json = { "content-type": "application/json" };
const at = (localAddress?: string): Target => ({ port, localAddress });

describe("/api refuses on the request headers, before reading the body", () => {
  it("no token: 401 with Connect's error, answered while the client is still sending, and the connection closed", async () => {
    const a = await partialPost(at(), LIST_AGENTS, json, MB3, nested(64 * 1024));
    expect(a.status).toBe(401);
    expect(JSON.parse(a.body)).toEqual({ code: "unauthenticated", message: "missing bearer token: send 'authorization: Bearer <token>'" });
    expect(a.headers.connection).toBe("close");
    expect(a.closedByServer).toBe(true);
  });

  it("an unknown token is 401, a token of the wrong role 403, each before the body", async () => {
    const unknown = await partialPost(at(), LIST_AGENTS, { ...json, authorization: "Bearer not-a-token" }, MB3, nested(1024));
    expect(unknown.status).toBe(401);
    expect(JSON.parse(unknown.body)).toEqual({ code: "unauthenticated", message: "unknown bearer token" });
    const role = await partialPost(at(), LIST_AGENTS, { ...json, authorization: `Bearer ${TOKENS.agent}` }, MB3, nested(1024));
    expect(role.status).toBe(403);
    expect(JSON.parse(role.body)).toEqual({ code: "permission_denied", message: "ListAgents needs a token with role 'ops'" });
    expect(role.closedByServer).toBe(true);
  });

  it("a Connect stream with no token ends at once with the error as its end-stream message", async () => {
    const s = await connectStream(at(), "/api/aiflow.cluster.v1.AgentService/WatchDirectives", {}, {}).done;
    expect(s.status).toBe(200);
    expect(s.messages).toEqual([]);
    expect(s.end).toEqual({ error: { code: "unauthenticated", message: "missing bearer token: send 'authorization: Bearer <token>'" } });
  });

  it("counts each refusal as the gRPC port does", async () => {
    const before = daemon.serverStats.authFailures.missing;
    await partialPost(at(), LIST_AGENTS, json, MB3, nested(10));
    expect(daemon.serverStats.authFailures.missing).toBe(before + 1);
  });

  it("20 parallel 3 MB nested-JSON bodies with no token are all refused unread", async () => {
    const body = Buffer.concat([nested(MB3 / 2), Buffer.from("]".repeat(MB3 / 2))]);
    const before = { missing: daemon.serverStats.authFailures.missing, rss: process.memoryUsage().rss, cpu: process.cpuUsage() };
    const answers = await Promise.all(Array.from({ length: 20 }, () => post(at(), LIST_AGENTS, json, body)));
    const cpu = process.cpuUsage(before.cpu);
    // A figure to read, not to hold the daemon to: the test's own client runs in this process too.
    console.log(
      `20 x 3 MB unauthenticated /api bodies: process CPU ${Math.round((cpu.user + cpu.system) / 1000)} ms, RSS ${Math.round((process.memoryUsage().rss - before.rss) / 1e6)} MB more`,
    );
    expect(answers.map((a) => a.status)).toEqual(Array(20).fill(401));
    expect(daemon.serverStats.authFailures.missing).toBe(before.missing + 20);
  });
});

describe("/api holds bodies to the gRPC port's byte limits on their declared length", () => {
  const ops = { ...json, authorization: `Bearer ${TOKENS.ops}` };

  it("a body past the message size limit is refused before it is read", async () => {
    const a = await partialPost(at(), LIST_AGENTS, ops, 50_000_000, nested(10));
    expect(a.status).toBe(429);
    expect(JSON.parse(a.body)).toMatchObject({
      code: "resource_exhausted",
      message: expect.stringMatching(/^the request body is 50000000 bytes; the limit is \d+$/),
    });
    expect(a.closedByServer).toBe(true);
  });

  it("a body past --max-inflight-bytes is refused before it is read, and counted", async () => {
    const before = daemon.serverStats.inflightRefused;
    const a = await partialPost(at(), LIST_AGENTS, ops, 2_500_000, nested(10));
    expect(a.status).toBe(429);
    expect(JSON.parse(a.body)).toEqual({ code: "resource_exhausted", message: "the daemon holds 2000000 bytes of requests in flight; try again later" });
    expect(daemon.serverStats.inflightRefused).toBe(before + 1);
  });

  it("a valid call within the limits is served, and what it held is given back", async () => {
    for (let i = 0; i < 3; i++) {
      const a = await post(at(), LIST_AGENTS, ops, "{}");
      expect(a.status).toBe(200);
      expect(JSON.parse(a.body)).toEqual({});
    }
    // 3 x 1.5 MB one after another: a leak of what each held would refuse the second.
    for (let i = 0; i < 3; i++) {
      const a = await post(at(), LIST_AGENTS, ops, Buffer.from(`{${" ".repeat(1_500_000)}}`));
      expect(a.status).toBe(200);
    }
  });
});

describe("Health.Watch on /api is capped per address with the gRPC port's streams", () => {
  const open: { cancel(): void }[] = [];
  afterAll(() => {
    for (const s of open) s.cancel();
  });

  it("one watch on each port from an address, and a third from it on /api is refused", async () => {
    const from = "127.0.0.5";
    // On the gRPC port: a Connect stream over HTTP/2 from the same address.
    const session = http2.connect(`http://${daemon.address}`, {
      createConnection: () => net.connect({ host: "127.0.0.1", port: daemon.port, localAddress: from }),
    });
    open.push({ cancel: () => session.destroy() });
    const grpcWatch = session.request({ ":method": "POST", ":path": "/grpc.health.v1.Health/Watch", "content-type": "application/grpc", te: "trailers" });
    grpcWatch.end(Buffer.alloc(5));
    await new Promise((resolve) => grpcWatch.once("data", resolve));

    let first!: () => void;
    const firstMessage = new Promise<void>((r) => (first = r));
    const apiWatch = connectStream(at(from), WATCH, {}, {}, () => first());
    open.push(apiWatch);
    await firstMessage;

    const third = await connectStream(at(from), WATCH, {}, {}).done;
    expect(third.end?.error?.code).toBe("resource_exhausted");
    expect(third.end?.error?.message).toMatch(/too many Health.Watch streams from this address/);
    // Another address still watches.
    let other!: () => void;
    const otherMessage = new Promise<void>((r) => (other = r));
    open.push(connectStream(at("127.0.0.6"), WATCH, {}, {}, () => other()));
    await otherMessage;
  });
});

describe("Health.Watch with a query after its path", () => {
  it("is counted as Health.Watch (connect serves it as one)", async () => {
    const from = "127.0.0.7";
    const session = http2.connect(`http://${daemon.address}`, {
      createConnection: () => net.connect({ host: "127.0.0.1", port: daemon.port, localAddress: from }),
    });
    session.on("error", () => {});
    const watch = () => {
      const req = session.request({ ":method": "POST", ":path": "/grpc.health.v1.Health/Watch?again", "content-type": "application/grpc", te: "trailers" });
      req.on("error", () => {});
      req.end(Buffer.alloc(5));
      return req;
    };
    try {
      for (let i = 0; i < 2; i++) await new Promise((resolve) => watch().once("data", resolve));
      const third = watch();
      const head = await new Promise<http2.IncomingHttpHeaders>((resolve) => third.once("response", (h) => resolve(h)));
      expect(head["grpc-status"]).toBe("8");
    } finally {
      session.destroy();
    }
  });
});

describe("HTTP/2 to the HTTP port", () => {
  it("is not spoken: an h2c request for /api with a big body gets no answer and its connection is closed", async () => {
    const session = http2.connect(`http://127.0.0.1:${port}`);
    session.on("error", () => {});
    const closed = new Promise((resolve) => session.once("close", resolve));
    const req = session.request({ ":method": "POST", ":path": LIST_AGENTS, "content-type": "application/json", "content-length": String(MB3) });
    let answered = false;
    req.on("response", () => (answered = true));
    req.on("error", () => {});
    req.write(nested(64 * 1024));
    await closed;
    expect(answered).toBe(false);
  });
});
