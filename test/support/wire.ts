/** Bytes as they go on the wire, for tests that speak HTTP/2 and gRPC framing by hand. */

/** One gRPC message: its 5-byte envelope (flags, big-endian length) and the bytes. */
export const grpcMessage = (bytes: Uint8Array, flags = 0): Buffer => {
  const b = Buffer.alloc(5 + bytes.byteLength);
  b[0] = flags;
  b.writeUInt32BE(bytes.byteLength, 1);
  b.set(bytes, 5);
  return b;
};

/** The client connection preface every HTTP/2 connection opens with. */
export const PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");

/** One HTTP/2 frame: its 9-byte header (length, type, flags, stream id) and the payload. */
export const h2Frame = (type: number, flags: number, stream: number, payload: Buffer = Buffer.alloc(0)): Buffer => {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(stream, 5);
  return Buffer.concat([h, payload]);
};
