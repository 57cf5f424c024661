/**
 * /api reads a call's deadline as the gRPC port does: a `connect-timeout-ms` past what a timer holds
 * (2^31-1 ms, about 24.8 days) runs the call as one with no deadline, on both ports, instead of
 * cutting it after 1 ms (Node arms an overflowing timer for 1 ms). Health.Watch shows it: a watch
 * with no deadline is still open when the daemon stops, and so sees NOT_SERVING before its end; a
 * watch cut by an overflowed timer has ended long before, with SERVING alone.
 */
import http2 from "node:http2";
import { describe, expect, it } from "vitest";
import { connectStream, envelope } from "./support/hostile-api.js";
import { useTestDb } from "./support/kit.js";

const fx = useTestDb("hapidl");
const OVERFLOW = String(2 ** 31);

/** A Health.Watch over Connect on the gRPC port (HTTP/2): resolves with its messages and end once it ends. */
function grpcPortWatch(address: string, headers: Record<string, string>, onMessage: () => void): Promise<{ messages: unknown[]; end: unknown }> {
  const session = http2.connect(`http://${address}`);
  session.on("error", () => {});
  const req = session.request({ ":method": "POST", ":path": "/grpc.health.v1.Health/Watch", "content-type": "application/connect+json", ...headers });
  const out: { messages: unknown[]; end: unknown } = { messages: [], end: undefined };
  let buf = Buffer.alloc(0);
  req.on("data", (c: Buffer) => {
    buf = Buffer.concat([buf, c]);
    while (buf.length >= 5 && buf.length >= 5 + buf.readUInt32BE(1)) {
      const m = JSON.parse(buf.subarray(5, 5 + buf.readUInt32BE(1)).toString()) as unknown;
      if (buf[0]! & 2) out.end = m;
      else {
        out.messages.push(m);
        onMessage();
      }
      buf = buf.subarray(5 + buf.readUInt32BE(1));
    }
  });
  req.on("error", () => {});
  req.end(envelope({}));
  return new Promise((resolve) =>
    req.once("close", () => {
      session.destroy();
      resolve(out);
    }),
  );
}

describe("a connect-timeout-ms past what a timer holds", () => {
  it("runs the call with no deadline on /api as on the gRPC port: both watches see the daemon stop", async () => {
    const daemon = await fx.startDaemon({ config: { httpListen: { host: "127.0.0.1", port: 0 } } });
    const port = Number(new URL(daemon.httpUrl!).port);
    let apiFirst!: () => void;
    let grpcFirst!: () => void;
    const firsts = [new Promise<void>((r) => (apiFirst = r)), new Promise<void>((r) => (grpcFirst = r))];
    const api = connectStream({ port }, "/api/grpc.health.v1.Health/Watch", { "connect-timeout-ms": OVERFLOW }, {}, () => apiFirst()).done;
    const grpc = grpcPortWatch(daemon.address, { "connect-timeout-ms": OVERFLOW }, () => grpcFirst());
    await Promise.all(firsts);
    await daemon.stop();
    const [a, g] = await Promise.all([api, grpc]);
    expect(a.messages).toEqual([{ status: "SERVING" }, { status: "NOT_SERVING" }]);
    expect(a.end).toEqual({});
    expect(g.messages).toEqual([{ status: "SERVING" }, { status: "NOT_SERVING" }]);
    expect(g.end).toEqual({});
  });
});
