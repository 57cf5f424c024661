/**
 * The agent stream (a bidi call) on both client transports the SDK offers — connect-node's gRPC
 * transport (the default) and the SDK's own (fastTransport) — against a real HTTP/2 server whose
 * answers each test scripts: every way a server can end the response must end the caller's
 * iteration with the right code while the caller's request side is still open. An agent keeps its
 * request side open for the life of the stream, so a response end that waited for the request side
 * (the HTTP/2 stream's `close`) would leave the agent waiting forever: that is what stranded every
 * streaming agent after a database blip.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { AgentService, ConnectResponseSchema, type ConnectRequest } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ConnectRequestSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { createSdkGrpcTransport } from "../src/client/transport.js";

type Script = (stream: http2.ServerHttp2Stream) => void;

let server: http2.Http2Server;
let baseUrl: string;
let script: Script;
/** Resolves with the RST_STREAM code once the server's stream closed (both sides). */
let closed: Promise<number>;
const sessions: Http2SessionManager[] = [];

beforeAll(async () => {
  server = http2.createServer();
  server.on("stream", (stream) => {
    closed = new Promise((resolve) => stream.on("close", () => resolve(stream.rstCode ?? 0)));
    stream.on("error", () => {});
    // The script answers once the first request frame arrived; the request side stays open.
    stream.once("data", () => script(stream));
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

function frame(payload: Uint8Array): Buffer {
  const out = Buffer.alloc(5 + payload.length);
  out.writeUInt32BE(payload.length, 1);
  out.set(payload, 5);
  return out;
}

const GRPC = { ":status": 200, "content-type": "application/grpc+proto" };
const STATUS_MESSAGE = frame(toBinary(ConnectResponseSchema, create(ConnectResponseSchema, { refused: "first" })));

const TRANSPORTS: [string, (url: string, sm: Http2SessionManager) => Transport][] = [
  ["connect-node", (url, sessionManager) => createGrpcTransport({ baseUrl: url, sessionManager })],
  ["sdk (fastTransport)", (url, sessionManager) => createSdkGrpcTransport({ baseUrl: url, sessionManager, interceptors: [] })],
];

/** Requests that never end: the agent's side of its stream. */
function openRequests(): { requests: AsyncIterable<MessageInitShape<typeof ConnectRequestSchema>>; stop(): void } {
  let stop!: () => void;
  const stopped = new Promise<void>((r) => (stop = r));
  async function* requests() {
    yield { name: "agent-1", credits: 4 } satisfies Partial<ConnectRequest>;
    await stopped;
  }
  return { requests: requests(), stop };
}

/** Iterates the call to its end: the messages it brought and how it ended. */
async function runCall(transport: Transport): Promise<{ messages: number; code: Code | "ok"; message: string }> {
  const client = createClient(AgentService, transport);
  const { requests, stop } = openRequests();
  let messages = 0;
  try {
    for await (const _ of client.connect(requests)) messages++;
    return { messages, code: "ok", message: "" };
  } catch (e) {
    const err = ConnectError.from(e);
    return { messages, code: err.code, message: err.rawMessage };
  } finally {
    stop();
  }
}

describe.each(TRANSPORTS)("agent stream over %s: the response's end ends the call while the request side is open", (_name, make) => {
  const transport = () => {
    const sm = new Http2SessionManager(baseUrl);
    sessions.push(sm);
    return make(baseUrl, sm);
  };

  it("an error status in the trailers after a message (the daemon's database away: UNAVAILABLE)", async () => {
    script = (stream) => {
      stream.respond(GRPC, { waitForTrailers: true });
      stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "14", "grpc-message": "database unavailable, retry shortly" }));
      stream.end(STATUS_MESSAGE);
    };
    expect(await runCall(transport())).toEqual({ messages: 1, code: Code.Unavailable, message: "database unavailable, retry shortly" });
    // The client let go of its side too: nothing of the call is left open on the server.
    expect(await closed).toBeGreaterThanOrEqual(0);
  });

  it("a trailers-only error (the status in the one HEADERS frame)", async () => {
    script = (stream) => stream.respond({ ...GRPC, "grpc-status": "14", "grpc-message": "shutting down" }, { endStream: true });
    expect(await runCall(transport())).toMatchObject({ messages: 0, code: Code.Unavailable });
    expect(await closed).toBeGreaterThanOrEqual(0);
  });

  it("status OK in the trailers ends the iteration without an error", async () => {
    script = (stream) => {
      stream.respond(GRPC, { waitForTrailers: true });
      stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
      stream.end(STATUS_MESSAGE);
    };
    expect(await runCall(transport())).toEqual({ messages: 1, code: "ok", message: "" });
    expect(await closed).toBeGreaterThanOrEqual(0);
  });

  it("a reset by the server ends the call with an error (the SDK's link reads any reset as UNAVAILABLE)", async () => {
    script = (stream) => {
      stream.respond(GRPC);
      stream.write(STATUS_MESSAGE, () => stream.close(http2.constants.NGHTTP2_REFUSED_STREAM));
    };
    const ended = await runCall(transport());
    expect(ended.messages).toBe(1);
    // connect-node reads a reset as INTERNAL; the SDK's own transport as UNAVAILABLE.
    expect([Code.Unavailable, Code.Internal]).toContain(ended.code);
  });
});
