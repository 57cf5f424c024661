import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import { Code, type ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Health, HealthCheckResponse_ServingStatus as Status } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import { HealthState, healthRoutes, limitWatchLifetime, type HealthListener } from "../src/server/health.js";
import { codeOf, Connection } from "./support/kit.js";

const HEALTH_PROTO = fileURLToPath(new URL("../proto/grpc/health/v1/health.proto", import.meta.url));

interface Served {
  port: number;
  close(): Promise<void>;
}

async function serve(routes: (router: ConnectRouter) => void): Promise<Served> {
  const server = http2.createServer(connectNodeAdapter({ routes, grpc: true, connect: true }));
  // server.close() waits for every HTTP/2 session to end, and clients keep theirs open; track them to close.
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (s) => {
    sessions.add(s);
    s.once("close", () => sessions.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.close((err) => (err ? reject(err) : resolve()));
        for (const s of sessions) s.close();
      }),
  };
}

function connectClient(port: number) {
  const conn = new Connection(`127.0.0.1:${port}`);
  return { client: conn.client(Health), close: () => conn.close() };
}

// What proto-loader gives us at runtime for grpc.health.v1.Health (enums as strings).
interface GrpcHealthClient extends grpc.Client {
  Check(req: { service: string }, cb: (err: grpc.ServiceError | null, res?: { status: string }) => void): grpc.ClientUnaryCall;
  Watch(req: { service: string }): grpc.ClientReadableStream<{ status: string }>;
}

function grpcClient(port: number): GrpcHealthClient {
  const definition = protoLoader.loadSync(HEALTH_PROTO, { keepCase: true, enums: String, defaults: true });
  const root = grpc.loadPackageDefinition(definition);
  const Ctor = ((root.grpc as grpc.GrpcObject).health as grpc.GrpcObject).v1 as grpc.GrpcObject;
  const Client = Ctor.Health as grpc.ServiceClientConstructor;
  return new Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure()) as unknown as GrpcHealthClient;
}

function grpcCheck(client: GrpcHealthClient, service: string): Promise<string> {
  return new Promise((resolve, reject) => client.Check({ service }, (err, res) => (err ? reject(err) : resolve(res?.status ?? "<none>"))));
}

function deferred<T = void>() {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** Lets a test wait for the server side of a Watch to let go of its subscription. */
class ObservedHealthState extends HealthState {
  released = deferred();
  override subscribe(listener: HealthListener): () => void {
    const unsubscribe = super.subscribe(listener);
    return () => {
      unsubscribe();
      this.released.resolve();
    };
  }
}

describe("health Check and List", () => {
  const state = new HealthState();
  state.set("aiflow.cluster.v1.AgentService", Status.NOT_SERVING);
  let served: Served;
  let grpcJs: GrpcHealthClient;
  let connect: ReturnType<typeof connectClient>;

  beforeAll(async () => {
    served = await serve(healthRoutes(state));
    grpcJs = grpcClient(served.port);
    connect = connectClient(served.port);
  });
  afterAll(async () => {
    grpcJs?.close();
    connect?.close();
    await served?.close();
  });

  it("answers a stock grpc-js client", async () => {
    expect(await grpcCheck(grpcJs, "")).toBe("SERVING");
    expect(await grpcCheck(grpcJs, "aiflow.cluster.v1.AgentService")).toBe("NOT_SERVING");
  });

  it("answers NOT_FOUND to grpc-js for an unknown service", async () => {
    await expect(grpcCheck(grpcJs, "no.such.Service")).rejects.toMatchObject({ code: grpc.status.NOT_FOUND });
  });

  it("answers a connect gRPC client, including NOT_FOUND", async () => {
    expect((await connect.client.check({ service: "" })).status).toBe(Status.SERVING);
    expect(await codeOf(connect.client.check({ service: "no.such.Service" }))).toBe(Code.NotFound);
  });

  it("lists every status", async () => {
    const { statuses } = await connect.client.list({});
    expect(Object.fromEntries(Object.entries(statuses).map(([k, v]) => [k, v.status]))).toEqual({
      "": Status.SERVING,
      "aiflow.cluster.v1.AgentService": Status.NOT_SERVING,
    });
  });
});

describe("health Watch", () => {
  const state = new ObservedHealthState();
  let served: Served;
  let grpcJs: GrpcHealthClient;
  let connect: ReturnType<typeof connectClient>;

  beforeAll(async () => {
    served = await serve(healthRoutes(state));
    grpcJs = grpcClient(served.port);
    connect = connectClient(served.port);
  });
  afterAll(async () => {
    grpcJs?.close();
    connect?.close();
    await served?.close();
  });

  it("streams to grpc-js and lets go when the client cancels", async () => {
    state.released = deferred();
    const call = grpcJs.Watch({ service: "svc.grpcjs" });
    call.on("error", () => {}); // the CANCELLED we provoke below
    const updates = call[Symbol.asyncIterator]() as AsyncIterator<{ status: string }>;
    expect((await updates.next()).value).toEqual({ status: "SERVICE_UNKNOWN" });
    state.set("svc.grpcjs", Status.SERVING);
    expect((await updates.next()).value).toEqual({ status: "SERVING" });
    call.cancel();
    await state.released.promise;
  });

  it("streams to a connect client, skips non-changes, and ends on shutdown", async () => {
    state.set("svc.connect", Status.NOT_SERVING);
    const updates = connect.client.watch({ service: "svc.connect" })[Symbol.asyncIterator]();
    expect((await updates.next()).value?.status).toBe(Status.NOT_SERVING);

    state.set("svc.connect", Status.SERVING);
    expect((await updates.next()).value?.status).toBe(Status.SERVING);

    // Re-setting the same status sends nothing, so the next message is the following real change.
    state.set("svc.connect", Status.SERVING);
    state.set("svc.other", Status.NOT_SERVING);
    state.set("svc.connect", Status.NOT_SERVING);
    expect((await updates.next()).value?.status).toBe(Status.NOT_SERVING);

    state.set("svc.connect", Status.SERVING);
    expect((await updates.next()).value?.status).toBe(Status.SERVING);
    state.shutdown();
    expect((await updates.next()).value?.status).toBe(Status.NOT_SERVING);
    expect((await updates.next()).done).toBe(true);

    // Draining stays drained: late set() calls are ignored and Check reports NOT_SERVING.
    state.set("", Status.SERVING);
    expect((await connect.client.check({ service: "" })).status).toBe(Status.NOT_SERVING);
  });

  it("ends a Watch opened after shutdown right after its first message", async () => {
    const received: Status[] = [];
    for await (const res of connect.client.watch({ service: "svc.connect" })) received.push(res.status);
    expect(received).toEqual([Status.NOT_SERVING]);
  });
});

describe("Health.Watch lifetime", () => {
  let served: Served;
  let connect: ReturnType<typeof connectClient>;
  let grpcJs: GrpcHealthClient;
  beforeAll(async () => {
    const state = new HealthState();
    state.set("svc", Status.SERVING);
    served = await serve(limitWatchLifetime(healthRoutes(state), 100));
    connect = connectClient(served.port);
    grpcJs = grpcClient(served.port);
  });
  afterAll(async () => {
    grpcJs?.close();
    connect?.close();
    await served?.close();
  });

  it("ends a watch cleanly (status OK) after --health-watch-lifetime, so a client that walked away holds nothing", async () => {
    const received: Status[] = [];
    for await (const res of connect.client.watch({ service: "svc" })) received.push(res.status);
    expect(received).toEqual([Status.SERVING]);
  });

  it("ends it for grpc-js with status OK too", async () => {
    const call = grpcJs.Watch({ service: "svc" });
    const messages: string[] = [];
    call.on("data", (m: { status: string }) => messages.push(m.status));
    const status = await new Promise<grpc.StatusObject>((resolve) => call.on("status", resolve));
    expect(status.code).toBe(grpc.status.OK);
    expect(messages).toEqual(["SERVING"]);
  });
});
