/**
 * A status message reaches every client as it was written. gRPC's spec percent-encodes grpc-message
 * only where it must (bytes outside 0x20-0x7E, and '%'); connect's encodeURIComponent also encodes
 * ':', '/', '?', '#', '@', '&', '=', '+', '$', ',' and ';', which grpc-js's decodeURI leaves as they
 * are: grpc-js users read `node 'a'%3A is on a cycle%3A a -> c`. The messages here hold ':', '%',
 * non-ASCII and a newline, on every way a status leaves the daemon: the direct unary and bidi paths,
 * connect-node's handler (the daemon with the direct path off, and a gzip call, which the direct path
 * leaves to connect), a gate refusal (src/server/refuse.ts), and gRPC-Web's trailer frame. They are
 * read by a stock grpc-js client, by the SDK's transport and on the wire itself.
 */
import http2 from "node:http2";
import { gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { create, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import { createSdkGrpcTransport } from "@aiflow/wire/client";
import { QueueService, EnqueueRequestSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import type { Daemon } from "../src/daemon.js";
import { startTestDaemon, TOKENS } from "./support/daemon.js";
import { createTestDb, type TestDb } from "./support/db.js";
import { grpc, loadService, metadata } from "./support/grpc-js.js";
import { refusal, withToken } from "./support/kit.js";
import { grpcMessage as frame } from "./support/wire.js";

/** Caller text the daemon quotes back in its refusal: every kind of character the encoding treats apart. */
const TENANT = "a:b/c?d#e@f&g=h+i$j,k;l 100% é\nfin";
const TENANT_REFUSAL = `tenant_key: '${TENANT}' may only contain letters, digits and . _ : -`;
const NAME = "agent:1 50% ü\nx";
const NAME_REFUSAL = `name: '${NAME}' may only contain letters, digits and . _ : -`;
const NO_TOKEN = "missing bearer token: send 'authorization: Bearer <token>'";

let db: TestDb;
const daemons: Record<"direct" | "connect", Daemon> = {} as never;

beforeAll(async () => {
  db = await createTestDb({ label: "grpcmsg" });
  daemons.direct = await startTestDaemon({ schema: db.schema });
  daemons.connect = await startTestDaemon({ schema: db.schema, config: { grpcFastPath: "off" } });
});
afterAll(async () => {
  for (const d of Object.values(daemons)) await d?.stop();
  await db?.drop();
});

const PATHS = ["direct", "connect"] as const;
const QUEUE = loadService("aiflow/cluster/v1/queue.proto", "aiflow.cluster.v1.QueueService");
const AGENTS = loadService("aiflow/cluster/v1/agent.proto", "aiflow.cluster.v1.AgentService");

/** A grpc-js Enqueue: the details grpc-js hands its caller. */
function grpcJsEnqueue(address: string, tenantKey: string, token: string | undefined, options: grpc.ClientOptions = {}): Promise<string> {
  const client = new QUEUE(address, grpc.credentials.createInsecure(), options);
  return new Promise((resolve, reject) => {
    (client as unknown as Record<string, Function>).enqueue!.call(
      client,
      { tenantKey, items: [{ engineKind: "dag", payloadJson: "{}" }] },
      metadata(token),
      (err: grpc.ServiceError | null) => {
        client.close();
        if (err) resolve(err.details);
        else reject(new Error("expected the Enqueue to be refused"));
      },
    );
  });
}

/** A grpc-js agent stream that opens with `name`: the details of the status it ends with. */
function grpcJsConnect(address: string, name: string): Promise<string> {
  const client = new AGENTS(address, grpc.credentials.createInsecure());
  return new Promise((resolve) => {
    const call = (client as unknown as Record<string, Function>).connect!.call(client, metadata(TOKENS.agent)) as grpc.ClientDuplexStream<object, object>;
    call.on("data", () => {});
    call.on("error", (err: grpc.ServiceError) => {
      client.close();
      resolve(err.details);
    });
    call.on("end", () => undefined);
    call.write({ name });
  });
}

/** One raw request: the grpc-message as sent (header or trailer), and the body. */
function raw(
  address: string,
  path: string,
  contentType: string,
  body: Buffer,
  headers: Record<string, string> = {},
): Promise<{ message: string | undefined; body: Buffer }> {
  const session = http2.connect(`http://${address}`);
  return new Promise((resolve, reject) => {
    const req = session.request({ ":method": "POST", ":path": path, "content-type": contentType, te: "trailers", ...headers });
    let message: string | undefined;
    const chunks: Buffer[] = [];
    req.on("response", (h) => (message ??= h["grpc-message"] as string | undefined));
    req.on("trailers", (t) => (message = t["grpc-message"] as string | undefined));
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("error", reject);
    req.on("close", () => {
      session.close();
      resolve({ message, body: Buffer.concat(chunks) });
    });
    req.end(body);
  });
}

const ENQUEUE = "/aiflow.cluster.v1.QueueService/Enqueue";
const enqueueRequest = toBinary(EnqueueRequestSchema, create(EnqueueRequestSchema, { tenantKey: TENANT, items: [{ engineKind: "dag", payloadJson: "{}" }] }));
const enqueueBody = frame(enqueueRequest);
const engine = { authorization: `Bearer ${TOKENS.engine}` };

describe("grpc-message", () => {
  it("reaches a stock grpc-js client as written, on the direct path and on connect-node's, unary and streaming", async () => {
    for (const path of PATHS) {
      const address = daemons[path].address;
      expect({ path, details: await grpcJsEnqueue(address, TENANT, TOKENS.engine) }).toEqual({ path, details: TENANT_REFUSAL });
      expect({ path, details: await grpcJsConnect(address, NAME) }).toEqual({ path, details: NAME_REFUSAL });
      expect({ path, details: await grpcJsEnqueue(address, "t1", undefined) }).toEqual({ path, details: NO_TOKEN });
    }
    // A compressed call is connect-node's even on a daemon with the direct path.
    const gzip = { "grpc.default_compression_algorithm": 2 } as grpc.ClientOptions;
    expect(await grpcJsEnqueue(daemons.direct.address, TENANT, TOKENS.engine, gzip)).toBe(TENANT_REFUSAL);
  });

  it("is percent-encoded only where gRPC's spec says, on every path", async () => {
    const wire = "tenant_key: 'a:b/c?d#e@f&g=h+i$j,k;l 100%25 %C3%A9%0Afin' may only contain letters, digits and . _ : -";
    for (const path of PATHS) {
      expect({ path, sent: (await raw(daemons[path].address, ENQUEUE, "application/grpc", enqueueBody, engine)).message }).toEqual({ path, sent: wire });
    }
    // A compressed call is connect-node's even on a daemon with the direct path.
    const gzipped = await raw(daemons.direct.address, ENQUEUE, "application/grpc", frame(gzipSync(enqueueRequest), 1), { ...engine, "grpc-encoding": "gzip" });
    expect(gzipped.message).toBe(wire);
    expect((await raw(daemons.direct.address, ENQUEUE, "application/grpc", enqueueBody)).message).toBe(
      "missing bearer token: send 'authorization: Bearer <token>'",
    );
  });

  it("is percent-encoded the same way in gRPC-Web's trailer frame", async () => {
    const { body } = await raw(daemons.direct.address, ENQUEUE, "application/grpc-web+proto", enqueueBody, engine);
    // The body is the trailer frame alone: flag 0x80, length, then "name: value\r\n" lines.
    expect(body[0]).toBe(0x80);
    const lines = body.subarray(5).toString("utf8").split("\r\n");
    expect(lines).toContain("grpc-message: tenant_key: 'a:b/c?d#e@f&g=h+i$j,k;l 100%25 %C3%A9%0Afin' may only contain letters, digits and . _ : -");
  });

  it("is read back as written by the SDK's transport", async () => {
    for (const path of PATHS) {
      const sessionManager = new Http2SessionManager(`http://${daemons[path].address}`);
      try {
        const queue = createClient(
          QueueService,
          createSdkGrpcTransport({ baseUrl: `http://${daemons[path].address}`, sessionManager, interceptors: [withToken(TOKENS.engine)] }),
        );
        const err = await refusal(queue.enqueue({ tenantKey: TENANT, items: [{ engineKind: "dag", payloadJson: "{}" }] }));
        expect({ path, message: err.rawMessage }).toEqual({ path, message: TENANT_REFUSAL });
      } finally {
        sessionManager.abort();
      }
    }
  });
});
