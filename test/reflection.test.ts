import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import { create, createFileRegistry, fromBinary, type DescFile } from "@bufbuild/protobuf";
import {
  FieldDescriptorProto_Label as Label,
  FieldDescriptorProto_Type as Type,
  FileDescriptorProtoSchema,
  file_google_protobuf_descriptor,
  file_google_protobuf_timestamp,
} from "@bufbuild/protobuf/wkt";
import type { ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HealthState, healthRoutes } from "../src/server/health.js";
import { reflectionRoutes } from "../src/server/reflection.js";

/**
 * A made-up API file with imports, a custom option and nested names, so the tests can check transitive
 * dependencies and every kind of symbol without depending on protos that are still being written.
 */
function clockFile(): DescFile {
  const proto = create(FileDescriptorProtoSchema, {
    name: "test/clock/v1/clock.proto",
    package: "test.clock.v1",
    syntax: "proto3",
    dependency: ["google/protobuf/timestamp.proto", "google/protobuf/descriptor.proto"],
    messageType: [
      {
        name: "Tick",
        field: [{ name: "at", number: 1, type: Type.MESSAGE, label: Label.OPTIONAL, typeName: ".google.protobuf.Timestamp", jsonName: "at" }],
        enumType: [
          {
            name: "Kind",
            value: [
              { name: "KIND_UNSPECIFIED", number: 0 },
              { name: "KIND_SECOND", number: 1 },
            ],
          },
        ],
      },
    ],
    service: [{ name: "ClockService", method: [{ name: "Now", inputType: ".test.clock.v1.Tick", outputType: ".test.clock.v1.Tick" }] }],
    extension: [{ name: "owner", number: 50001, type: Type.STRING, label: Label.OPTIONAL, extendee: ".google.protobuf.ServiceOptions", jsonName: "owner" }],
  });
  const deps = [file_google_protobuf_timestamp, file_google_protobuf_descriptor];
  const registry = createFileRegistry(proto, (name) => deps.find((f) => f.proto.name === name));
  const file = registry.getFile(proto.name);
  if (!file) throw new Error("clock.proto did not register");
  return file;
}

// The reflection messages as proto-loader decodes them with keepCase (wire field names, Buffers for bytes).
interface ReflectionResponse {
  valid_host: string;
  original_request: Record<string, unknown> | null;
  message_response: "file_descriptor_response" | "all_extension_numbers_response" | "list_services_response" | "error_response";
  file_descriptor_response?: { file_descriptor_proto: Buffer[] };
  all_extension_numbers_response?: { base_type_name: string; extension_number: number[] };
  list_services_response?: { service: { name: string }[] };
  error_response?: { error_code: number; error_message: string };
}

async function serve(routes: (router: ConnectRouter) => void) {
  const server = http2.createServer(connectNodeAdapter({ routes, grpc: true, connect: true }));
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

/** One bidi ServerReflectionInfo call, driven request-by-request the way grpcurl does it. */
class ReflectionConversation {
  readonly #call: grpc.ClientDuplexStream<object, ReflectionResponse>;
  readonly #responses: AsyncIterator<ReflectionResponse>;

  constructor(client: grpc.Client) {
    const open = (client as unknown as { ServerReflectionInfo(): grpc.ClientDuplexStream<object, ReflectionResponse> }).ServerReflectionInfo;
    this.#call = open.call(client);
    this.#responses = this.#call[Symbol.asyncIterator]() as AsyncIterator<ReflectionResponse>;
  }

  async ask(request: object): Promise<ReflectionResponse> {
    this.#call.write({ host: "localhost", ...request });
    const next = await this.#responses.next();
    if (next.done) throw new Error("reflection stream ended early");
    return next.value;
  }

  /** Half-closes and checks the server finishes the call cleanly (status OK, no further messages). */
  async end(): Promise<void> {
    const status = new Promise<grpc.StatusObject>((resolve) => this.#call.once("status", resolve));
    this.#call.end();
    expect((await this.#responses.next()).done).toBe(true);
    expect((await status).code).toBe(grpc.status.OK);
  }
}

function fileNames(res: ReflectionResponse): string[] {
  expect(res.message_response).toBe("file_descriptor_response");
  return res.file_descriptor_response!.file_descriptor_proto.map((b) => fromBinary(FileDescriptorProtoSchema, b).name);
}

let server: Awaited<ReturnType<typeof serve>>;
const clients: grpc.Client[] = [];

beforeAll(async () => {
  const clock = clockFile();
  server = await serve((router) => {
    healthRoutes(new HealthState())(router);
    reflectionRoutes([clock])(router);
  });
});
afterAll(async () => {
  for (const c of clients) c.close();
  await server?.close();
});

describe.each(["v1", "v1alpha"])("grpc.reflection.%s from grpc-js", (version) => {
  let client: grpc.Client;
  beforeAll(() => {
    const path = fileURLToPath(new URL(`../proto/grpc/reflection/${version}/reflection.proto`, import.meta.url));
    const root = grpc.loadPackageDefinition(protoLoader.loadSync(path, { keepCase: true, oneofs: true, defaults: true }));
    const reflection = (root.grpc as grpc.GrpcObject).reflection as grpc.GrpcObject;
    const Client = (reflection[version] as grpc.GrpcObject).ServerReflection as grpc.ServiceClientConstructor;
    client = new Client(`127.0.0.1:${server.port}`, grpc.credentials.createInsecure());
    clients.push(client);
  });

  it("answers a sequence of questions on one stream", async () => {
    const talk = new ReflectionConversation(client);

    const list = await talk.ask({ list_services: "" });
    expect(list.valid_host).toBe("localhost");
    expect(list.original_request).toMatchObject({ list_services: "" });
    expect(list.list_services_response!.service.map((s) => s.name)).toEqual([
      "grpc.health.v1.Health",
      "grpc.reflection.v1.ServerReflection",
      "grpc.reflection.v1alpha.ServerReflection",
      "test.clock.v1.ClockService",
    ]);

    expect(fileNames(await talk.ask({ file_containing_symbol: "grpc.health.v1.Health" }))).toEqual(["grpc/health/v1/health.proto"]);

    const unknown = await talk.ask({ file_containing_symbol: "no.such.Thing" });
    expect(unknown.message_response).toBe("error_response");
    expect(unknown.error_response!.error_code).toBe(grpc.status.NOT_FOUND);

    // The stream survives an error_response: the next question is still answered.
    expect(fileNames(await talk.ask({ file_by_filename: `grpc/reflection/${version}/reflection.proto` }))).toEqual([
      `grpc/reflection/${version}/reflection.proto`,
    ]);
    await talk.end();
  });

  it("resolves every kind of symbol and ships transitive dependencies", async () => {
    const talk = new ReflectionConversation(client);
    const clockWithDeps = ["test/clock/v1/clock.proto", "google/protobuf/timestamp.proto", "google/protobuf/descriptor.proto"];
    for (const symbol of [
      "test.clock.v1.ClockService",
      "test.clock.v1.ClockService.Now",
      "test.clock.v1.Tick",
      "test.clock.v1.Tick.at",
      "test.clock.v1.Tick.Kind",
      "test.clock.v1.Tick.KIND_SECOND",
      "test.clock.v1.owner",
    ]) {
      expect(fileNames(await talk.ask({ file_containing_symbol: symbol })), symbol).toEqual(clockWithDeps);
    }
    expect(fileNames(await talk.ask({ file_containing_symbol: "google.protobuf.Timestamp" }))).toEqual(["google/protobuf/timestamp.proto"]);
    expect(fileNames(await talk.ask({ file_by_filename: "test/clock/v1/clock.proto" }))).toEqual(clockWithDeps);

    const missingFile = await talk.ask({ file_by_filename: "nope.proto" });
    expect(missingFile.error_response!.error_code).toBe(grpc.status.NOT_FOUND);
    await talk.end();
  });

  it("answers extension questions", async () => {
    const talk = new ReflectionConversation(client);
    const ext = await talk.ask({
      file_containing_extension: { containing_type: "google.protobuf.ServiceOptions", extension_number: 50001 },
    });
    expect(fileNames(ext)[0]).toBe("test/clock/v1/clock.proto");

    const noExt = await talk.ask({
      file_containing_extension: { containing_type: "grpc.health.v1.HealthCheckRequest", extension_number: 100 },
    });
    expect(noExt.error_response!.error_code).toBe(grpc.status.NOT_FOUND);

    const numbers = await talk.ask({ all_extension_numbers_of_type: "google.protobuf.ServiceOptions" });
    expect(numbers.all_extension_numbers_response).toEqual({ base_type_name: "google.protobuf.ServiceOptions", extension_number: [50001] });

    const none = await talk.ask({ all_extension_numbers_of_type: "grpc.health.v1.HealthCheckRequest" });
    expect(none.all_extension_numbers_response!.extension_number).toEqual([]);

    const unknownType = await talk.ask({ all_extension_numbers_of_type: "no.such.Message" });
    expect(unknownType.error_response!.error_code).toBe(grpc.status.NOT_FOUND);
    await talk.end();
  });
});
