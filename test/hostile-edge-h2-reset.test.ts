/**
 * Issue 51, item 1: nothing one client sends on one connection may end the daemon's process or
 * grow its memory without bound. The rapid-reset guard (src/server/http2-limits.ts) cuts a
 * connection that resets too many streams; it once did so from inside a stream's 'close' listener,
 * which runs while nghttp2 is still parsing the read that held the reset, and node aborted
 * (`Assertion failed: (current_nghttp2_memory_) >= (previous_size)`) or, with open WatchDirectives
 * calls cancelled, kept the cut session's socket reading in a loop that grew RSS by hundreds of MB a
 * second while health checks timed out.
 *
 * The daemon runs in a child process, so an abort fails the test instead of killing the runner.
 * Every wait is on a frame, a socket's close or the child's exit.
 */
import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
import { readFileSync } from "node:fs";
import http2 from "node:http2";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawnDaemon } from "../agent-sdk/test/daemon-process.js";
import { agentClient, ok, registerRequest } from "./support/agents.js";
import { TOKENS } from "./support/daemon.js";
import { freePort } from "./support/free-port.js";
import { useTestDb } from "./support/kit.js";
import { END_HEADERS, END_STREAM, FRAME, grpcRequest, RawH2Peer, rstCode, within } from "./support/raw-h2.js";
import { grpcMessage, h2Frame as frame } from "./support/wire.js";

const MAX_RESETS = 40;
const CHECK = "/grpc.health.v1.Health/Check";
const fx = useTestDb("edgereset");
let daemon: ChildProcess;
let port: number;
/** Rejects (naming how) once the child exits: raced against every wait on the daemon. */
let exited: Promise<never>;

beforeAll(async () => {
  port = await freePort();
  daemon = await spawnDaemon(
    fx.db.schema,
    port,
    "edge-reset",
    { heartbeatInterval: "5s", leaseTtl: "30s" },
    {
      AIFLOW_HTTP2_MAX_RESETS: String(MAX_RESETS),
      AIFLOW_HTTP2_RESET_WINDOW: "1m",
      // The first test sends hundreds of calls without a token from loopback: the second must still get its token in.
      AIFLOW_AUTH_FAILURE_LIMIT: "1000000",
    },
  );
  exited = once(daemon, "exit").then(([code, signal]) => {
    throw new Error(`the daemon exited (code ${code}, signal ${signal})`);
  });
  exited.catch(() => {});
});
afterAll(async () => {
  if (!daemon || daemon.exitCode !== null || daemon.signalCode !== null) return;
  const gone = once(daemon, "exit");
  daemon.kill("SIGTERM");
  // A daemon wedged by a regression would not take SIGTERM: it must not outlive the run.
  const kill = setTimeout(() => daemon.kill("SIGKILL"), 10_000);
  await gone;
  clearTimeout(kill);
});

/** `p` within a bound (./support/raw-h2.ts), failing at once, saying so, if the daemon exits first. */
const bounded = <T>(p: Promise<T>, what: string): Promise<T> => within(Promise.race([p, exited]), what);

/** A Health.Check on a connection of its own: its grpc-status, or a rejection if the daemon exits first. */
async function healthCheck(): Promise<string> {
  const client = http2.connect(`http://127.0.0.1:${port}`);
  client.on("error", () => {});
  try {
    const req = client.request({ ":method": "POST", ":path": CHECK, "content-type": "application/grpc", te: "trailers" });
    req.end(grpcMessage(new Uint8Array()));
    req.resume();
    const [trailers] = (await bounded(once(req, "trailers"), "a health check's answer")) as [http2.IncomingHttpHeaders];
    return String(trailers["grpc-status"]);
  } finally {
    client.close();
  }
}

const rssMb = () => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${daemon.pid}/status`, "utf8"))![1]) / 1024;

describe("a rapid-reset flood on one connection", () => {
  it("is cut with GOAWAY ENHANCE_YOUR_CALM, and the process lives on and answers (an open Check, then HEADERS+RST_STREAM pairs in one write)", async () => {
    expect(await healthCheck()).toBe("0");
    const peer = new RawH2Peer(port);
    // A call that needs no token, left open: its headers, and no body yet.
    peer.write(frame(FRAME.headers, END_HEADERS, 1, grpcRequest(CHECK)));
    // Calls the gate answers on their headers (no token), each reset at once by the client: far
    // more than --http2-max-resets, in one write so the guard fires with frames still unparsed.
    const enqueue = grpcRequest("/aiflow.cluster.v1.QueueService/Enqueue");
    const cancel = rstCode(http2.constants.NGHTTP2_CANCEL);
    peer.write(
      ...Array.from({ length: MAX_RESETS * 5 }, (_, i) => [
        frame(FRAME.headers, END_HEADERS, 3 + 2 * i, enqueue),
        frame(FRAME.rst, 0, 3 + 2 * i, cancel),
      ]).flat(),
    );
    await bounded(peer.closed, "the flooding connection's close");
    expect(peer.goaways).toEqual([http2.constants.NGHTTP2_ENHANCE_YOUR_CALM]);
    expect(await healthCheck()).toBe("0");
    expect([daemon.exitCode, daemon.signalCode]).toEqual([null, null]);
  });

  it("of cancelled WatchDirectives calls is cut, and leaves no socket reading in a loop (memory flat, health answered)", async () => {
    const agents = agentClient(`127.0.0.1:${port}`);
    try {
      await ok(agents, "register", registerRequest("edge-watcher"));
    } finally {
      agents.close();
    }
    const peer = new RawH2Peer(port);
    const watches = MAX_RESETS + 10;
    const auth: [string, string][] = [["authorization", `Bearer ${TOKENS.agent}`]];
    // WatchDirectivesRequest { name: "edge-watcher" }
    const body = grpcMessage(Buffer.concat([Buffer.from([0x0a, "edge-watcher".length]), Buffer.from("edge-watcher")]));
    const ids = Array.from({ length: watches }, (_, i) => 1 + 2 * i);
    // Each watch answers with the agent's status first: once all have, every call is open and held by a handler.
    const answered = () => new Set(peer.frames.filter((f) => f.type === FRAME.data).map((f) => f.stream)).size;
    const allOpen = peer.until(() => answered() === watches);
    peer.write(
      ...ids.flatMap((id) => [
        frame(FRAME.headers, END_HEADERS, id, grpcRequest("/aiflow.cluster.v1.AgentService/WatchDirectives", auth)),
        frame(FRAME.data, END_STREAM, id, body),
      ]),
    );
    expect(await bounded(allOpen, "every watch's first message")).toBe(true);
    expect(answered()).toBe(watches);
    const before = rssMb();

    const cancel = rstCode(http2.constants.NGHTTP2_CANCEL);
    peer.write(...ids.map((id) => frame(FRAME.rst, 0, id, cancel)));
    await bounded(peer.closed, "the cut connection's close");
    expect(peer.goaways).toEqual([http2.constants.NGHTTP2_ENHANCE_YOUR_CALM]);
    // Answered twenty times over: a socket left reading in a loop starves these and grows memory.
    for (let i = 0; i < 20; i++) expect(await healthCheck()).toBe("0");
    // A cut session holds nothing: what the process grew by is a heap's noise, not a leak of
    // hundreds of MB (the loop grew it by more than that in the time these checks take).
    expect(rssMb() - before).toBeLessThan(100);
    expect([daemon.exitCode, daemon.signalCode]).toEqual([null, null]);
  });
});
