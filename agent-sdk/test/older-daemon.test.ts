/**
 * Against a daemon that has no agent stream: a real HTTP/2 server in front of a real daemon that
 * serves every AgentService method but Connect (which it therefore answers UNIMPLEMENTED, as a
 * daemon from before the stream does) and passes the rest through. The agent falls back to unary
 * claims and the WatchDirectives stream, and works and drains as before.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { createClient, type ConnectRouter, type HandlerContext } from "@connectrpc/connect";
import { connectNodeAdapter, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AgentService } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { useTestDaemon } from "../../test/support/kit.js";
import { callLog, Producer, testAgent, WorkItemStatus } from "./support.js";

const fx = useTestDaemon({ label: "sdkolder", config: { heartbeatInterval: 500, heartbeatFlush: 50, sweepInterval: 50 } });
let producer: Producer;
let server: http2.Http2Server;
let address: string;
const sessions = new Set<http2.ServerHttp2Session>();

/** AgentService without Connect, each call passed to the daemon with the caller's authorization. */
function withoutStream(daemonUrl: string) {
  const daemon = createClient(AgentService, createGrpcTransport({ baseUrl: daemonUrl }));
  const auth = (ctx: HandlerContext) => ({ headers: { authorization: ctx.requestHeader.get("authorization") ?? "" }, signal: ctx.signal });
  return (router: ConnectRouter) =>
    router.service(AgentService, {
      register: (req, ctx) => daemon.register(req, auth(ctx)),
      heartbeat: (req, ctx) => daemon.heartbeat(req, auth(ctx)),
      deregister: (req, ctx) => daemon.deregister(req, auth(ctx)),
      claim: (req, ctx) => daemon.claim(req, auth(ctx)),
      extendLease: (req, ctx) => daemon.extendLease(req, auth(ctx)),
      complete: (req, ctx) => daemon.complete(req, auth(ctx)),
      fail: (req, ctx) => daemon.fail(req, auth(ctx)),
      release: (req, ctx) => daemon.release(req, auth(ctx)),
      watchDirectives: (req, ctx) => daemon.watchDirectives(req, auth(ctx)),
    });
}

beforeAll(async () => {
  producer = fx.closers.add(new Producer(fx.daemon.address, "t1"));
  server = http2.createServer(connectNodeAdapter({ routes: withoutStream(`http://${fx.daemon.address}`), grpc: true, connect: false, grpcWeb: false }));
  server.on("session", (session) => sessions.add(session.once("close", () => sessions.delete(session))));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  for (const session of sessions) session.destroy();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

describe("a daemon without the agent stream", () => {
  it("answers Connect UNIMPLEMENTED; the agent claims by unary calls, follows directives on WatchDirectives, and drains", async () => {
    const calls = callLog();
    const agent = testAgent(address, {
      engineKinds: ["older"],
      slots: 2,
      interceptors: [calls.interceptor],
      handlers: { older: async (item) => item.payload },
    });
    await agent.start();
    const ids = await producer.enqueue(Array.from({ length: 6 }, (_, i) => ({ engineKind: "older", payloadJson: String(i) })));
    const done = await producer.waitDone(ids);
    expect(done.map((d) => [d.status, d.resultJson])).toEqual(ids.map((_, i) => [WorkItemStatus.COMPLETED, String(i)]));
    // One try at the stream, refused; then the unary calls did the work.
    expect(calls.count("Connect")).toBe(1);
    expect(calls.stream.filter((e) => e.method === "Connect" && e.dir === "received")).toEqual([]);
    expect(calls.count("Claim")).toBeGreaterThan(0);
    expect(calls.count("WatchDirectives")).toBe(1);
    await agent.drain();
    expect(agent.state).toBe("stopped");
    expect(calls.calls.at(-1)?.method).toBe("Deregister");
  });
});
