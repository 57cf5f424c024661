/**
 * A stock @grpc/grpc-js client built from our .proto files with proto-loader: what an agent written
 * against the published protos, in any language, would do. Nothing of ours is on its path.
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { fileURLToPath } from "node:url";

const PROTO_ROOT = fileURLToPath(new URL("../../proto/", import.meta.url));

export function loadService(file: string, servicePath: string): grpc.ServiceClientConstructor {
  const def = protoLoader.loadSync(file, { includeDirs: [PROTO_ROOT], keepCase: false, longs: String, enums: String, defaults: true, oneofs: true });
  let node: unknown = grpc.loadPackageDefinition(def);
  for (const part of servicePath.split(".")) node = (node as Record<string, unknown>)[part];
  return node as grpc.ServiceClientConstructor;
}

export function metadata(token?: string): grpc.Metadata {
  const md = new grpc.Metadata();
  if (token) md.set("authorization", `Bearer ${token}`);
  return md;
}

/** Calls a unary method and resolves with [error, response]. */
export function unary<Res = Record<string, unknown>>(
  client: grpc.Client,
  method: string,
  req: object,
  token?: string,
): Promise<[grpc.ServiceError | null, Res | undefined]> {
  return new Promise((resolve) => {
    (client as unknown as Record<string, Function>)[method]!.call(client, req, metadata(token), (err: grpc.ServiceError | null, res: Res) =>
      resolve([err, res]),
    );
  });
}

export { grpc };
