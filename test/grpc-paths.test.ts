/**
 * The direct gRPC path (wire/src/server/unary-fast-path.ts) and connect-node answer the same requests alike:
 * one daemon with the direct path, one with `--grpc-fast-path=off`, the same raw HTTP/2 requests
 * to both (valid, malformed, oversized, with and without grpc-timeout, with -bin metadata, gzip),
 * and the status codes and messages compared. Refusals of a malformed request agree on the code;
 * their messages are each path's own words.
 */
import http2 from "node:http2";
import { gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { create, toBinary } from "@bufbuild/protobuf";
import type { Daemon } from "../src/daemon.js";
import { HealthCheckRequestSchema } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import { EnqueueRequestSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { startTestDaemon, TOKENS } from "./support/daemon.js";
import { createTestDb, type TestDb } from "./support/db.js";
import { grpcMessage as frame } from "./support/wire.js";

const PAYLOAD_MAX = 64 * 1024;
let db: TestDb;
const daemons: Record<"direct" | "connect", Daemon> = {} as never;
const sessions: Record<"direct" | "connect", http2.ClientHttp2Session> = {} as never;

beforeAll(async () => {
  db = await createTestDb({ label: "paths" });
  daemons.direct = await startTestDaemon({ schema: db.schema, config: { payloadMaxBytes: PAYLOAD_MAX } });
  daemons.connect = await startTestDaemon({ schema: db.schema, config: { payloadMaxBytes: PAYLOAD_MAX, grpcFastPath: "off" } });
  for (const k of ["direct", "connect"] as const) sessions[k] = http2.connect(`http://${daemons[k].address}`);
});
afterAll(async () => {
  for (const s of Object.values(sessions)) s?.close();
  for (const d of Object.values(daemons)) await d?.stop();
  await db?.drop();
});

interface Answer {
  status: number;
  message: string;
}

function call(on: http2.ClientHttp2Session, path: string, body: Buffer, headers: Record<string, string>): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = on.request({ ":method": "POST", ":path": path, "content-type": "application/grpc", te: "trailers", ...headers });
    let head: http2.IncomingHttpHeaders = {};
    let trailers: http2.IncomingHttpHeaders = {};
    req.on("response", (h) => (head = h));
    req.on("trailers", (t) => (trailers = t));
    req.on("data", () => {});
    req.on("error", reject);
    req.on("close", () => {
      const st = trailers["grpc-status"] ?? head["grpc-status"];
      resolve({ status: st === undefined ? -1 : Number(st), message: decodeURIComponent(String(trailers["grpc-message"] ?? head["grpc-message"] ?? "")) });
    });
    req.end(body);
  });
}

const HEALTH = "/grpc.health.v1.Health/Check";
const ENQUEUE = "/aiflow.cluster.v1.QueueService/Enqueue";
const engine = { authorization: `Bearer ${TOKENS.engine}` };
const health = frame(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema)));
const enqueue = (payloadJson: string) =>
  frame(toBinary(EnqueueRequestSchema, create(EnqueueRequestSchema, { tenantKey: "paths", items: [{ engineKind: "dag", payloadJson }] })));

/** Same request to both daemons. */
const both = async (path: string, body: Buffer, headers: Record<string, string> = {}) => ({
  direct: await call(sessions.direct, path, body, headers),
  connect: await call(sessions.connect, path, body, headers),
});

describe("the direct path and connect-node", () => {
  it("answer the same status and message", async () => {
    const cases: [string, string, Buffer, Record<string, string>][] = [
      ["a valid call", HEALTH, health, {}],
      ["a valid call with a deadline", HEALTH, health, { "grpc-timeout": "5S" }],
      ["a valid call with -bin metadata", HEALTH, health, { "x-trace-bin": Buffer.from([0, 1, 2, 255]).toString("base64") }],
      ["a call without a token", ENQUEUE, enqueue("{}"), {}],
      ["a call the handler refuses", ENQUEUE, enqueue("{nope"), engine],
      ["a payload over the cap", ENQUEUE, enqueue(JSON.stringify({ pad: "x".repeat(PAYLOAD_MAX) })), engine],
      ["an enqueue that succeeds", ENQUEUE, enqueue('{"n":1}'), engine],
      [
        "a gzip-compressed message",
        HEALTH,
        frame(gzipSync(toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema))), 1),
        { "grpc-encoding": "gzip" },
      ],
    ];
    for (const [what, path, body, headers] of cases) {
      const { direct, connect } = await both(path, body, headers);
      expect({ what, ...direct }).toEqual({ what, ...connect });
    }
  });

  it("refuse a malformed message, a compressed one without its encoding, a message past the limit and a bad deadline with the same codes", async () => {
    const huge = Buffer.alloc(5);
    huge.writeUInt32BE(64 * 1024 * 1024, 1);
    const cases: [string, Buffer, Record<string, string>][] = [
      ["bytes that are no HealthCheckRequest", frame(Buffer.from([0xff, 0xff, 0xff])), {}],
      ["a compressed flag without grpc-encoding", frame(Buffer.from([]), 1), {}],
      ["a message longer than the limit", huge, {}],
      ["a deadline that does not parse", health, { "grpc-timeout": "soon" }],
    ];
    for (const [what, body, headers] of cases) {
      const { direct, connect } = await both(HEALTH, body, headers);
      expect({ what, status: direct.status }).toEqual({ what, status: connect.status });
      expect(direct.message.length).toBeGreaterThan(0);
    }
  });

  it("answer a unary request of no or two messages UNIMPLEMENTED, as the gRPC status-code table says", async () => {
    for (const body of [Buffer.alloc(0), Buffer.concat([health, health])]) {
      const { direct, connect } = await both(HEALTH, body);
      expect([direct.status, connect.status]).toEqual([Code.Unimplemented, Code.Unimplemented]);
    }
  });
});
