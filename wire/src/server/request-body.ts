/**
 * A unary request's body: read under the server's byte budget and the call's size limit, within
 * its time, and unwrapped from gRPC's envelope as exactly one message.
 */
import type { ServerHttp2Stream } from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Cancel } from "./call.js";

/**
 * The daemon-wide hold on request bodies (gate.ts): this path reserves each chunk as it arrives and
 * releases the call's bytes when the call ends, and a body must be complete within bodyTimeoutMs.
 */
export interface BodyBudget {
  reserve(bytes: number): boolean;
  release(bytes: number): void;
  readonly bodyTimeoutMs: number;
  /** Told of each call refused over the budget or for a late body (for the counters). */
  refused(why: "bytes" | "timeout"): void;
  /** The refusal over the budget (one message for both paths). */
  overBudget(): ConnectError;
}

/** What a call holds of the budget, released when it ends; `late`: its body missed its time. */
export interface Held {
  bytes: number;
  late: boolean;
}

export function readBody(stream: ServerHttp2Stream, max: number, cancel: Cancel, budget: BodyBudget | undefined, held: Held): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const timer = budget
      ? setTimeout(() => {
          held.late = true;
          budget.refused("timeout");
          fail(new ConnectError(`the request body did not arrive within ${budget.bodyTimeoutMs}ms`, Code.DeadlineExceeded));
        }, budget.bodyTimeoutMs)
      : undefined;
    const fail = (e: unknown) => {
      clearTimeout(timer);
      cancel.watch(undefined);
      stream.off("data", onData);
      stream.off("error", onError);
      // Reads on, discarding, so that the client's flow-control window is not left full.
      stream.resume();
      reject(e);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > max + 5) return fail(new ConnectError(`message larger than ${max} bytes`, Code.ResourceExhausted));
      if (budget) {
        if (!budget.reserve(chunk.length)) {
          budget.refused("bytes");
          return fail(budget.overBudget());
        }
        held.bytes += chunk.length;
      }
      chunks.push(chunk);
    };
    const onError = (e: Error) => fail(new ConnectError(e.message, Code.Canceled));
    stream.on("data", onData);
    stream.once("error", onError);
    stream.once("end", () => {
      clearTimeout(timer);
      cancel.watch(undefined);
      stream.off("error", onError);
      resolve(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks));
    });
    // A client that goes away mid-request never sends the end of it.
    cancel.watch(fail);
  });
}

/**
 * The one enveloped message of a unary request. None, or more than one, is a cardinality violation,
 * which the gRPC status-code table answers UNIMPLEMENTED; a message cut short is a protocol error.
 */
export function unwrap(body: Buffer, max: number): Uint8Array {
  if (body.length === 0) throw new ConnectError("a unary request needs exactly one message; it had none", Code.Unimplemented);
  if (body.length < 5) throw new ConnectError("protocol error: the request message was cut short", Code.Internal);
  if ((body[0]! & 1) === 1) throw new ConnectError("protocol error: a compressed message without grpc-encoding", Code.Internal);
  const length = body.readUInt32BE(1);
  if (length > max) throw new ConnectError(`message larger than ${max} bytes`, Code.ResourceExhausted);
  if (body.length < 5 + length) throw new ConnectError("protocol error: the request message was cut short", Code.Internal);
  if (body.length > 5 + length) throw new ConnectError("a unary request needs exactly one message; it had more", Code.Unimplemented);
  return body.subarray(5);
}
