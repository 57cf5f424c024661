/**
 * What calls may hold across the daemon (src/server/gate.ts), against a real daemon with small
 * limits: request bytes in flight (--max-inflight-bytes) on both paths, a body's time to arrive
 * (--http2-body-timeout), and Health.Watch streams per address and in total. A release is seen
 * after a PING round trip on the same connection: the server handles the frames before the PING
 * (the stream's close among them) before it answers it.
 */
import { once } from "node:events";
import http2 from "node:http2";
import net from "node:net";
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { TOKENS } from "./support/daemon.js";
import { useTestDaemon } from "./support/kit.js";
import { AgentStream } from "./support/agent-stream.js";
import { TestAgent } from "./support/queue.js";

const fx = useTestDaemon({ label: "h2gate", config: { maxInflightBytes: 100_000, http2BodyTimeout: 300, healthWatchMaxPerAddress: 2, healthWatchMax: 3 } });
let daemon: Daemon;
beforeAll(() => void ({ daemon } = fx));

const ENQUEUE = "/aiflow.cluster.v1.QueueService/Enqueue";
const WATCH = "/grpc.health.v1.Health/Watch";

function connect(localAddress = "127.0.0.1"): http2.ClientHttp2Session {
  const s = http2.connect(`http://${daemon.address}`, { createConnection: () => net.connect({ host: "127.0.0.1", port: daemon.port, localAddress }) });
  s.on("error", () => {});
  return s;
}

const roundTrip = (s: http2.ClientHttp2Session) => new Promise<void>((r) => s.ping(() => r()));

interface Call {
  req: http2.ClientHttp2Stream;
  /** grpc-status (or HTTP status for Connect) once the call ends. */
  done: Promise<{ grpcStatus: string | undefined; httpStatus: number; message: string }>;
  /** Resolves with the response headers. */
  headers: Promise<http2.IncomingHttpHeaders>;
}

function call(s: http2.ClientHttp2Session, headers: http2.OutgoingHttpHeaders, body: Buffer, end: boolean): Call {
  const req = s.request({ ":method": "POST", te: "trailers", ...headers });
  req.on("error", () => {});
  let head: http2.IncomingHttpHeaders = {};
  let grpcStatus: string | undefined;
  let message = "";
  const headersP = new Promise<http2.IncomingHttpHeaders>((r) => req.once("response", r));
  req.on("response", (h) => {
    head = h;
    grpcStatus = h["grpc-status"] as string | undefined;
    message = decodeURIComponent(String(h["grpc-message"] ?? ""));
  });
  req.on("trailers", (h) => {
    grpcStatus = h["grpc-status"] as string;
    message = decodeURIComponent(String(h["grpc-message"] ?? ""));
  });
  const chunks: Buffer[] = [];
  req.on("data", (c: Buffer) => chunks.push(c));
  const done = once(req, "close").then(() => ({ grpcStatus, httpStatus: Number(head[":status"]), message: message || Buffer.concat(chunks).toString() }));
  if (end) req.end(body);
  else req.write(body);
  return { req, done, headers: headersP };
}

const grpcBody = (n: number) => {
  const b = Buffer.alloc(n);
  b.writeUInt32BE(n - 5, 1);
  return b;
};
const engineGrpc = { ":path": ENQUEUE, "content-type": "application/grpc", authorization: `Bearer ${TOKENS.engine}` };

describe("request bytes in flight", () => {
  it("refuses a gRPC call past --max-inflight-bytes with RESOURCE_EXHAUSTED, and admits again once the holder ends", async () => {
    const s = connect();
    // Holds 60 kB by its declared length, and never finishes its body.
    const holder = call(
      s,
      { ":path": ENQUEUE, "content-type": "application/json", "content-length": "60000", authorization: `Bearer ${TOKENS.engine}` },
      Buffer.alloc(10, 32),
      false,
    );
    const over = call(s, engineGrpc, grpcBody(60_000), true);
    const refused = await over.done;
    expect(refused.grpcStatus).toBe("8");
    expect(refused.message).toMatch(/requests in flight/);
    expect(daemon.serverStats.inflightRefused).toBeGreaterThanOrEqual(1);

    holder.req.close();
    await holder.done;
    await roundTrip(s);
    const admitted = await call(s, engineGrpc, grpcBody(60_000), true).done;
    // Past the budget: the handler's own answer to a message that is not an EnqueueRequest.
    expect(admitted.grpcStatus).not.toBe("8");
    s.close();
  });

  it("discards the rest of a gRPC body refused part way, so a Node client's session survives many refusals", async () => {
    // A stream reset while a Node client still writes keeps the unsent bytes counted against the
    // client's session memory (10 MB by default); past that its session refuses every new stream.
    const s = connect();
    const holder = call(
      s,
      { ":path": ENQUEUE, "content-type": "application/json", "content-length": "60000", authorization: `Bearer ${TOKENS.engine}` },
      Buffer.alloc(10, 32),
      false,
    );
    await roundTrip(s);
    for (let i = 0; i < 15; i++) expect((await call(s, engineGrpc, grpcBody(1_000_000), true).done).grpcStatus).toBe("8");
    holder.req.close();
    await holder.done;
    expect((await call(s, { ":path": "/grpc.health.v1.Health/Check", "content-type": "application/grpc" }, grpcBody(5), true).done).grpcStatus).toBe("0");
    s.close();
  });

  it("refuses a Connect call whose content-length is past it (HTTP 429) before reading it, and one that passes it mid-body", async () => {
    const s = connect();
    const declared = await call(
      s,
      { ":path": ENQUEUE, "content-type": "application/json", "content-length": "200000", authorization: `Bearer ${TOKENS.engine}` },
      Buffer.alloc(10, 32),
      false,
    ).done;
    expect(declared.httpStatus).toBe(429);
    expect(JSON.parse(declared.message)).toMatchObject({ code: "resource_exhausted" });

    // No declared length: refused when its bytes pass the budget, with connect-node already reading it.
    const midBody = await call(
      s,
      { ":path": ENQUEUE, "content-type": "application/proto", authorization: `Bearer ${TOKENS.engine}` },
      Buffer.alloc(150_000),
      false,
    ).done;
    expect(midBody.httpStatus).toBe(429);
    await roundTrip(s);
    // The daemon serves on, and the budget is whole again.
    const after = await call(s, { ":path": "/grpc.health.v1.Health/Check", "content-type": "application/grpc" }, grpcBody(5), true).done;
    expect(after.grpcStatus).toBe("0");
    const again = await call(s, engineGrpc, grpcBody(90_000), true).done;
    expect(again.grpcStatus).not.toBe("8");
    s.close();
  });

  it("answers DEADLINE_EXCEEDED to a body that does not arrive within --http2-body-timeout", async () => {
    const s = connect();
    const trickle = await call(s, engineGrpc, grpcBody(1000).subarray(0, 100), false).done;
    expect(trickle.grpcStatus).toBe("4");
    expect(trickle.message).toMatch(/did not arrive within 300ms/);
    s.close();
  });
});

describe("the agent stream", () => {
  it("outlives --http2-body-timeout and sends more than --max-inflight-bytes in all: its request is a stream, not a body to time or hold", async () => {
    const agent = fx.closers.add(await TestAgent.register(daemon.address, "h2gate-stream", { tenants: ["t1"], engineKinds: ["dag"] }));
    const stream = new AgentStream(agent.conn.agent, agent.name);
    await stream.next("the status", (r) => r.status !== 0);
    // A body that trickles, sent after the stream opened, is cut at the timeout: the stream is by
    // then older than the timeout.
    const s = connect();
    expect((await call(s, engineGrpc, grpcBody(1000).subarray(0, 100), false).done).grpcStatus).toBe("4");
    s.close();
    // 3 × 60 kB of releases, past the 100 kB budget in all, each answered per item.
    for (let m = 0; m < 3; m++) {
      const releases = Array.from({ length: 1000 }, (_, i) => ({ workItemId: `01J${String(m * 1000 + i).padStart(23, "0")}`, leaseToken: "x".repeat(30) }));
      stream.send({ releases });
      await stream.next(`release batch ${m}'s outcomes`, (r) => r.releaseOutcomes.some((o) => o.workItemId === releases.at(-1)!.workItemId));
    }
    await stream.settled();
    stream.goodbye();
    expect(await stream.ended).toBeUndefined();
  });
});

describe("Health.Watch caps", () => {
  const watch = (s: http2.ClientHttp2Session) => call(s, { ":path": WATCH, "content-type": "application/grpc" }, grpcBody(5), true);

  it("refuses a watch past the per-address cap and past the total, and admits again when one ends", async () => {
    const a = connect("127.0.0.1");
    const b = connect("127.0.0.2");
    const c = connect("127.0.0.3");
    const open = [watch(a), watch(a)];
    for (const w of open) expect((await w.headers)["grpc-status"]).toBeUndefined();
    const perAddress = await watch(a).done;
    expect(perAddress.grpcStatus).toBe("8");
    expect(perAddress.message).toMatch(/from this address/);

    const third = watch(b);
    expect((await third.headers)["grpc-status"]).toBeUndefined();
    const total = await watch(c).done;
    expect(total.grpcStatus).toBe("8");
    expect(total.message).toMatch(/in total/);

    open[0]!.req.close();
    await open[0]!.done;
    await roundTrip(a);
    const reopened = watch(c);
    expect((await reopened.headers)["grpc-status"]).toBeUndefined();
    expect(daemon.serverStats.healthWatchRefused).toBe(2);
    for (const s of [a, b, c]) s.destroy();
  });
});
