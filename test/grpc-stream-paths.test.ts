/**
 * The agent stream (AgentService.Connect) on the daemon's direct bidi path
 * (wire/src/server/bidi-fast-path.ts) and on connect-node's handler answer the same requests alike,
 * as test/grpc-paths.test.ts holds the unary path to: one daemon with the direct path, one with
 * `--grpc-fast-path=off`, on one database, the same raw HTTP/2 requests to both, and the status,
 * message and number of answers compared. Refusals of a malformed request agree on the code; their
 * messages are each path's own words.
 */
import http2 from "node:http2";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { AgentService, ConnectRequestSchema, ConnectResponseSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { Daemon } from "../src/daemon.js";
import { startTestDaemon, TOKENS } from "./support/daemon.js";
import { createTestDb, type TestDb } from "./support/db.js";
import { Connection } from "./support/kit.js";
import { grpcMessage as frame } from "./support/wire.js";

const PAYLOAD_MAX = 64 * 1024;
let db: TestDb;
const daemons: Record<"direct" | "connect", Daemon> = {} as never;
const sessions: Record<"direct" | "connect", http2.ClientHttp2Session> = {} as never;
let registrar: Connection;

beforeAll(async () => {
  db = await createTestDb({ label: "streampaths" });
  daemons.direct = await startTestDaemon({ schema: db.schema, config: { payloadMaxBytes: PAYLOAD_MAX } });
  daemons.connect = await startTestDaemon({ schema: db.schema, config: { payloadMaxBytes: PAYLOAD_MAX, grpcFastPath: "off" } });
  for (const k of ["direct", "connect"] as const) sessions[k] = http2.connect(`http://${daemons[k].address}`);
  registrar = new Connection(daemons.direct.address, { token: TOKENS.agent });
  for (const name of ["paths-a", "paths-b"]) await registrar.client(AgentService).register({ name, metadata: { tenants: ["t1"], slots: 2 } });
});
afterAll(async () => {
  registrar?.close();
  for (const s of Object.values(sessions)) s?.close();
  for (const d of Object.values(daemons)) await d?.stop();
  await db?.drop();
});

interface Answer {
  status: number;
  message: string;
  /** The statuses the answers carried, in order (a push would show as an item count instead). */
  answers: string[];
}

const CONNECT = "/aiflow.cluster.v1.AgentService/Connect";
const agent = { authorization: `Bearer ${TOKENS.agent}` };
const msg = (init: Parameters<typeof create<typeof ConnectRequestSchema>>[1]) => frame(toBinary(ConnectRequestSchema, create(ConnectRequestSchema, init)));

/** Sends `body` and half-closes, as a client that says all it has at once; reads to the end. */
function call(on: http2.ClientHttp2Session, body: Buffer, headers: Record<string, string>): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = on.request({ ":method": "POST", ":path": CONNECT, "content-type": "application/grpc", te: "trailers", ...headers });
    let head: http2.IncomingHttpHeaders = {};
    let trailers: http2.IncomingHttpHeaders = {};
    const chunks: Buffer[] = [];
    req.on("response", (h) => (head = h));
    req.on("trailers", (t) => (trailers = t));
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("error", reject);
    req.on("close", () => {
      const st = trailers["grpc-status"] ?? head["grpc-status"];
      const answers: string[] = [];
      for (let b = Buffer.concat(chunks); b.length >= 5; ) {
        const n = b.readUInt32BE(1);
        const res = fromBinary(ConnectResponseSchema, b.subarray(5, 5 + n));
        answers.push(res.items.length > 0 ? `items:${res.items.length}` : `status:${AgentStatus[res.status]}${res.refused ? ` refused:${res.refused}` : ""}`);
        b = b.subarray(5 + n);
      }
      resolve({
        status: st === undefined ? -1 : Number(st),
        message: decodeURIComponent(String(trailers["grpc-message"] ?? head["grpc-message"] ?? "")),
        answers,
      });
    });
    req.end(body);
  });
}

const both = async (body: Buffer, headers: Record<string, string> = agent) => ({
  direct: await call(sessions.direct, body, headers),
  connect: await call(sessions.connect, body, headers),
});

describe("the agent stream on the direct path and on connect-node", () => {
  it("answer the same statuses, messages and answers", async () => {
    const cases: [string, Buffer, Record<string, string>][] = [
      ["no token", msg({ name: "paths-a" }), {}],
      ["a token of another role", msg({ name: "paths-a" }), { authorization: `Bearer ${TOKENS.engine}` }],
      ["no message at all", Buffer.alloc(0), agent],
      ["a first message without a name", msg({ credits: 1 }), agent],
      ["an agent nobody registered", msg({ name: "paths-nobody" }), agent],
      ["a name that is no agent name", msg({ name: "bad name!" }), agent],
      ["a goodbye at once", Buffer.concat([msg({ name: "paths-a" }), msg({ goodbye: true })]), agent],
      ["a message naming another agent", Buffer.concat([msg({ name: "paths-a" }), msg({ name: "paths-b", credits: 1 })]), agent],
      ["a half-close without a goodbye", msg({ name: "paths-b", credits: 1 }), agent],
      ["a deadline", Buffer.concat([msg({ name: "paths-a" }), msg({ goodbye: true })]), { ...agent, "grpc-timeout": "5S" }],
    ];
    for (const [what, body, headers] of cases) {
      const { direct, connect } = await both(body, headers);
      expect({ what, ...direct }).toEqual({ what, ...connect });
    }
  });

  it("refuse a malformed message, a compressed one without its encoding, one past the limit and a bad deadline with the same codes", async () => {
    const huge = Buffer.alloc(5);
    huge.writeUInt32BE(64 * 1024 * 1024, 1);
    const cases: [string, Buffer, Record<string, string>][] = [
      ["bytes that are no ConnectRequest", frame(Buffer.from([0xff, 0xff, 0xff])), agent],
      ["a compressed flag without grpc-encoding", frame(Buffer.from([]), 1), agent],
      ["a message longer than the limit", huge, agent],
      ["a deadline that does not parse", msg({ name: "paths-a" }), { ...agent, "grpc-timeout": "soon" }],
    ];
    for (const [what, body, headers] of cases) {
      const { direct, connect } = await both(body, headers);
      expect({ what, status: direct.status }).toEqual({ what, status: connect.status });
      expect(direct.message.length).toBeGreaterThan(0);
    }
  });
});
