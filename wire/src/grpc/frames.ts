/**
 * gRPC's length-prefixed messages on an HTTP/2 stream, for the direct paths (../server, ../client):
 * a 1-byte compressed flag, a 4-byte big-endian length, the message. Read off a byte stream as its
 * chunks arrive (both ends of a bidi call); written with the writer's back-pressure heeded. Only
 * uncompressed messages are taken (neither end asks for compression), and none longer than the
 * reader's limit.
 */
import type { EventEmitter } from "node:events";
import { Code, ConnectError } from "@connectrpc/connect";

/** protobuf-es's bytes behind gRPC's 5-byte envelope (the compiled codec writes its own in place). */
export function envelope(bytes: Uint8Array): Buffer {
  const body = Buffer.allocUnsafe(5 + bytes.byteLength);
  body[0] = 0;
  body.writeUInt32BE(bytes.byteLength, 1);
  body.set(bytes, 5);
  return body;
}

/** Resolves when an HTTP/2 stream whose write said "wait" has drained, or has closed. */
export function drained(stream: EventEmitter): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      stream.off("drain", done);
      stream.off("close", done);
      resolve();
    };
    stream.once("drain", done);
    stream.once("close", done);
  });
}

export class FrameReader {
  #pending: Buffer = Buffer.alloc(0);

  /** `compressed`: what to say of a compressed message, from the point of view of the end reading. */
  constructor(
    private readonly max: number,
    private readonly compressed: string,
  ) {}

  /** The messages this chunk completes (views into the chunks); throws on a compressed or oversized one. */
  push(chunk: Buffer): Uint8Array[] {
    this.#pending = this.#pending.length === 0 ? chunk : Buffer.concat([this.#pending, chunk]);
    const out: Uint8Array[] = [];
    while (this.#pending.length >= 5) {
      if ((this.#pending[0]! & 1) === 1) throw new ConnectError(this.compressed, Code.Internal);
      const length = this.#pending.readUInt32BE(1);
      if (length > this.max) throw new ConnectError(`message larger than ${this.max} bytes`, Code.ResourceExhausted);
      if (this.#pending.length < 5 + length) break;
      out.push(this.#pending.subarray(5, 5 + length));
      this.#pending = this.#pending.subarray(5 + length);
    }
    return out;
  }

  /** Bytes of a message begun and not finished (the stream ending now cut it short). */
  get partial(): boolean {
    return this.#pending.length > 0;
  }
}
