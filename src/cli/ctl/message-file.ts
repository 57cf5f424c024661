/**
 * A protobuf message read from a file the user names (`-`: stdin), as `run start` and `triggers put`
 * take them: anything unreadable or malformed is a usage error naming the file and what is wrong.
 */
import { readFile } from "node:fs/promises";
import { text } from "node:stream/consumers";
import { fromJson, type DescMessage, type JsonValue, type MessageShape } from "@bufbuild/protobuf";
import { UsageError } from "./args.js";

/**
 * FILE as `schema` in protobuf JSON. `explain` may rewrite fromJson's reason (which can quote a
 * field's value) before it is shown.
 */
export async function messageFromFile<D extends DescMessage>(
  path: string,
  schema: D,
  explain: (reason: string) => string = (r) => r,
): Promise<MessageShape<D>> {
  const name = path === "-" ? "stdin" : path;
  let body: string;
  try {
    body = path === "-" ? await text(process.stdin) : await readFile(path, "utf8");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why =
      code === "ENOENT" ? "no such file" : code === "EACCES" ? "permission denied" : code === "EISDIR" ? "a directory, not a file" : (err as Error).message;
    throw new UsageError(`FILE: cannot read ${path} (${why})`);
  }
  let json: JsonValue;
  try {
    json = JSON.parse(body) as JsonValue;
  } catch (err) {
    throw new UsageError(`${name}: is not JSON (${(err as Error).message})`);
  }
  try {
    return fromJson(schema, json);
  } catch (err) {
    throw new UsageError(`${name}: is not an ${schema.typeName} in protobuf JSON (${explain((err as Error).message)})`);
  }
}
