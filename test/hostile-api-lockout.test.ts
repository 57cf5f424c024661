/**
 * Failed authentications are throttled, not the callers who present valid credentials: an address
 * past --auth-failure-limit has its failing calls refused RESOURCE_EXHAUSTED (429 on /api) until its
 * window ends, while a call from the same address with a valid token is served, on the gRPC port
 * (h2c and TLS) and on /api alike; a valid call resets nobody's count. Behind a NAT or a
 * TLS-terminating proxy every caller shares an address, so one bad client must not lock out the rest.
 * The two ports count one address's failures together: a guesser gets no second budget by switching.
 */
import http2 from "node:http2";
import net from "node:net";
import tls from "node:tls";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { TOKENS } from "./support/daemon.js";
import { post } from "./support/hostile-api.js";
import { useTestDb } from "./support/kit.js";
import { Pki } from "./support/pki.js";

const fx = useTestDb("hapilock");
const clock = new FakeClock();
const pki = Pki.create();
/** An address's LIMIT failures in a window are answered as failures; the one after them takes it over the limit. */
const LIMIT = 50;
const config = { httpListen: { host: "127.0.0.1", port: 0 }, authFailureLimit: LIMIT, authFailureWindow: 60_000 };
let plain: Daemon;
let secure: Daemon;
beforeAll(async () => {
  plain = await fx.startDaemon({ clock, config });
  const server = pki.server();
  secure = await fx.startDaemon({ clock, config: { ...config, tlsCert: server.cert, tlsKey: server.key } });
});
afterAll(() => pki.close());

const LIST_AGENTS = "/aiflow.cluster.v1.OpsService/ListAgents";

/** One unary gRPC call on a connection of its own from `localAddress`: its grpc-status, or "cut" when the connection failed. */
function grpcStatus(daemon: Daemon, localAddress: string, token: string | undefined, path = LIST_AGENTS): Promise<string> {
  const connect =
    daemon.scheme === "https"
      ? () =>
          tls.connect({
            socket: net.connect({ host: "127.0.0.1", port: daemon.port, localAddress }),
            servername: "localhost",
            ca: pki.ca.certPem,
            ALPNProtocols: ["h2"],
          })
      : () => net.connect({ host: "127.0.0.1", port: daemon.port, localAddress });
  const session = http2.connect(`${daemon.scheme}://${daemon.address}`, { createConnection: connect });
  return new Promise((resolve) => {
    session.on("error", () => resolve("cut"));
    const req = session.request({
      ":method": "POST",
      ":path": path,
      "content-type": "application/grpc",
      te: "trailers",
      ...(token ? { authorization: `Bearer ${token}` } : {}),
    });
    let status: string | undefined;
    req.on("response", (h) => (status ??= h["grpc-status"] as string | undefined));
    req.on("trailers", (h) => (status = h["grpc-status"] as string | undefined));
    req.on("error", () => {});
    req.on("close", () => {
      session.destroy();
      resolve(status ?? "cut");
    });
    req.resume();
    req.end(Buffer.alloc(5));
  });
}

/** One /api call (a Connect unary over HTTP/1.1) from `localAddress`: its HTTP status. */
const apiStatus = async (daemon: Daemon, localAddress: string, token: string | undefined) =>
  (
    await post(
      { port: Number(new URL(daemon.httpUrl!).port), localAddress },
      `/api${LIST_AGENTS}`,
      { "content-type": "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}) },
      "{}",
    )
  ).status;

const guesses = (n: number, call: (token: string) => Promise<unknown>) =>
  (async () => {
    const out: unknown[] = [];
    for (let i = 0; i < n; i++) out.push(await call(`guess-${i}-abcdef`));
    return out;
  })();

describe("an address past its failure limit", () => {
  it("gRPC port (h2c): its guesses are refused RESOURCE_EXHAUSTED, a valid token from it is served", async () => {
    const from = "127.0.0.2";
    const answers = await guesses(55, (t) => grpcStatus(plain, from, t));
    expect(answers).toEqual([...Array(LIMIT + 1).fill("16"), ...Array(4).fill("8")]);
    expect(await grpcStatus(plain, from, TOKENS.ops)).toBe("0");
    // An agent token is served too (the agent service's own answer, not the throttle's).
    expect(await grpcStatus(plain, from, TOKENS.agent, "/aiflow.cluster.v1.AgentService/ListAgents")).not.toBe("8");
    // A valid token of the wrong role is the caller's mistake, not a guess: answered as such.
    expect(await grpcStatus(plain, from, TOKENS.agent)).toBe("7");
    // The valid calls reset nothing: guesses and missing tokens are still refused.
    expect(await grpcStatus(plain, from, "another-guess")).toBe("8");
    expect(await grpcStatus(plain, from, undefined)).toBe("8");
    clock.advance(60_000);
    expect(await grpcStatus(plain, from, "another-guess")).toBe("16");
  });

  it("/api: its guesses are 429, the ops token from it is served", async () => {
    const from = "127.0.0.3";
    const answers = await guesses(55, (t) => apiStatus(plain, from, t));
    expect(answers).toEqual([...Array(LIMIT + 1).fill(401), ...Array(4).fill(429)]);
    expect(await apiStatus(plain, from, TOKENS.ops)).toBe(200);
    expect(await apiStatus(plain, from, "another-guess")).toBe(429);
    expect(await apiStatus(plain, from, undefined)).toBe(429);
  });

  it("the two ports count an address's failures together", async () => {
    const from = "127.0.0.4";
    expect(await guesses(30, (t) => grpcStatus(plain, from, t))).toEqual(Array(30).fill("16"));
    expect(await guesses(25, (t) => apiStatus(plain, from, t))).toEqual([...Array(LIMIT + 1 - 30).fill(401), ...Array(4).fill(429)]);
    expect(await grpcStatus(plain, from, "another-guess")).toBe("8");
    expect(await grpcStatus(plain, from, TOKENS.ops)).toBe("0");
    expect(await apiStatus(plain, from, TOKENS.ops)).toBe(200);
  });

  it("gRPC port (TLS): a new connection from it with a valid token is served, not cut before its handshake", async () => {
    const from = "127.0.0.5";
    const answers = await guesses(55, (t) => grpcStatus(secure, from, t));
    expect(answers).toEqual([...Array(LIMIT + 1).fill("16"), ...Array(4).fill("8")]);
    expect(await grpcStatus(secure, from, TOKENS.ops)).toBe("0");
    expect(await grpcStatus(secure, from, "another-guess")).toBe("8");
  });
});
