/**
 * gRPC server reflection (grpc.reflection.v1 and the older v1alpha that many tools still speak first),
 * so grpcurl, Postman, Kreya etc. can discover aiflowd's API without a copy of the .proto files.
 * Protocol: https://github.com/grpc/grpc/blob/master/doc/server-reflection.md.
 */
import type { DescFile } from "@bufbuild/protobuf";
import { toBinary } from "@bufbuild/protobuf";
import { nestedTypes } from "@bufbuild/protobuf/reflect";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import type { ConnectRouter } from "@connectrpc/connect";
import { Code } from "@connectrpc/connect";
import { file_grpc_health_v1_health } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import * as v1 from "@aiflow/wire/gen/grpc/reflection/v1/reflection_pb.js";
import * as v1alpha from "@aiflow/wire/gen/grpc/reflection/v1alpha/reflection_pb.js";

/**
 * The request as both protocol versions shape it. v1 and v1alpha messages differ only in $typeName,
 * so each version's generated type is assignable to this, and the answer below (a plain init object)
 * is accepted as either version's response — that is the whole adapter.
 */
interface Question {
  host: string;
  messageRequest:
    | { case: "fileByFilename" | "fileContainingSymbol" | "allExtensionNumbersOfType" | "listServices"; value: string }
    | { case: "fileContainingExtension"; value: { containingType: string; extensionNumber: number } }
    | { case: undefined; value?: undefined };
}

type Answer =
  | { case: "fileDescriptorResponse"; value: { fileDescriptorProto: Uint8Array[] } }
  | { case: "allExtensionNumbersResponse"; value: { baseTypeName: string; extensionNumber: number[] } }
  | { case: "listServicesResponse"; value: { service: { name: string }[] } }
  | { case: "errorResponse"; value: { errorCode: number; errorMessage: string } };

/** Everything reflection can be asked about, resolved once at startup. */
interface Index {
  services: string[];
  files: Map<string, DescFile>; // by proto file name, e.g. "grpc/health/v1/health.proto"
  symbols: Map<string, DescFile>; // fully-qualified element name -> declaring file
  extensions: Map<string, Map<number, DescFile>>; // extendee type name -> field number -> declaring file
  bytes: Map<DescFile, Uint8Array>;
}

export function reflectionRoutes(files: readonly DescFile[]): (router: ConnectRouter) => void {
  // Reflection and health describe themselves too, so a client can inspect everything it can call.
  const served = [...files, file_grpc_health_v1_health, v1.file_grpc_reflection_v1_reflection, v1alpha.file_grpc_reflection_v1alpha_reflection];
  const index = buildIndex(served);
  return (router) => {
    router.service(v1.ServerReflection, { serverReflectionInfo: (requests) => converse(index, requests) });
    router.service(v1alpha.ServerReflection, { serverReflectionInfo: (requests) => converse(index, requests) });
  };
}

/** One answer per question, in order; a question we cannot answer gets an error_response, never a stream error. */
async function* converse<Q extends Question>(index: Index, requests: AsyncIterable<Q>) {
  for await (const request of requests) {
    yield { validHost: request.host, originalRequest: request, messageResponse: answer(index, request) };
  }
}

function answer(index: Index, { messageRequest: q }: Question): Answer {
  switch (q.case) {
    case "listServices":
      return { case: "listServicesResponse", value: { service: index.services.map((name) => ({ name })) } };
    case "fileByFilename":
      return withDependencies(index, index.files.get(q.value), `file "${q.value}"`);
    case "fileContainingSymbol":
      return withDependencies(index, index.symbols.get(q.value), `symbol "${q.value}"`);
    case "fileContainingExtension": {
      const { containingType, extensionNumber } = q.value;
      const file = index.extensions.get(containingType)?.get(extensionNumber);
      return withDependencies(index, file, `extension ${extensionNumber} of "${containingType}"`);
    }
    case "allExtensionNumbersOfType": {
      // A known message with no extensions is an empty list; only an unknown type is an error.
      if (!index.symbols.has(q.value)) return notFound(`type "${q.value}"`);
      const numbers = [...(index.extensions.get(q.value)?.keys() ?? [])].sort((a, b) => a - b);
      return { case: "allExtensionNumbersResponse", value: { baseTypeName: q.value, extensionNumber: numbers } };
    }
    case undefined:
      return { case: "errorResponse", value: { errorCode: Code.InvalidArgument, errorMessage: "empty message_request" } };
  }
}

/** The file first, then everything it imports, transitively — clients need the whole closure to decode. */
function withDependencies(index: Index, file: DescFile | undefined, what: string): Answer {
  if (!file) return notFound(what);
  const closure = new Set<DescFile>();
  const visit = (f: DescFile) => {
    if (closure.has(f)) return;
    closure.add(f);
    f.dependencies.forEach(visit);
  };
  visit(file);
  const fileDescriptorProto = [...closure].map((f) => index.bytes.get(f) ?? toBinary(FileDescriptorProtoSchema, f.proto));
  return { case: "fileDescriptorResponse", value: { fileDescriptorProto } };
}

function notFound(what: string): Answer {
  return { case: "errorResponse", value: { errorCode: Code.NotFound, errorMessage: `${what} not found` } };
}

function buildIndex(served: readonly DescFile[]): Index {
  const index: Index = { services: [], files: new Map(), symbols: new Map(), extensions: new Map(), bytes: new Map() };
  const services = new Set<string>();
  for (const file of served) for (const service of file.services) services.add(service.typeName);
  index.services = [...services].sort();

  const add = (file: DescFile) => {
    const name = file.proto.name;
    if (index.files.has(name)) return;
    index.files.set(name, file);
    index.bytes.set(file, toBinary(FileDescriptorProtoSchema, file.proto));
    const pkg = file.proto.package;
    for (const type of nestedTypes(file)) {
      const symbol = (fullName: string) => index.symbols.set(fullName, file);
      symbol(type.typeName);
      switch (type.kind) {
        case "message":
          for (const field of type.fields) symbol(`${type.typeName}.${field.name}`);
          for (const oneof of type.oneofs) symbol(`${type.typeName}.${oneof.name}`);
          break;
        case "enum": {
          // Enum values are scoped like C++ enums: siblings of the enum, not children of it.
          const scope = type.parent?.typeName ?? pkg;
          for (const value of type.values) symbol(scope ? `${scope}.${value.name}` : value.name);
          break;
        }
        case "service":
          for (const method of type.methods) symbol(`${type.typeName}.${method.name}`);
          break;
        case "extension": {
          const byNumber = index.extensions.get(type.extendee.typeName) ?? new Map<number, DescFile>();
          byNumber.set(type.number, file);
          index.extensions.set(type.extendee.typeName, byNumber);
          break;
        }
      }
    }
    file.dependencies.forEach(add);
  };
  served.forEach(add);
  return index;
}
