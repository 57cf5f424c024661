/**
 * A codec for every message: the compiled one where there is one, else protobuf-es's reflective
 * reader and writer behind the same interface. The SDK's transport carries every unary call the
 * same way (the same status reading, the same deadlines), whichever codec its messages get.
 */
import { create, fromBinary, isMessage, toBinary, type DescMessage } from "@bufbuild/protobuf";
import { compileCodec, type Codec } from "./compile.js";

const reflective = new WeakMap<DescMessage, Codec<DescMessage>>();

export function codecFor<Desc extends DescMessage>(desc: Desc): Codec<Desc> {
  const compiled = compileCodec(desc);
  if (compiled) return compiled;
  let codec = reflective.get(desc);
  if (codec === undefined) reflective.set(desc, (codec = reflectiveCodec(desc)));
  return codec as Codec<Desc>;
}

function reflectiveCodec(desc: DescMessage): Codec<DescMessage> {
  const message = (m: object) => (isMessage(m, desc) ? m : create(desc, m as never));
  const encode = (m: object) => {
    const bytes = toBinary(desc, message(m));
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  };
  return {
    encode,
    frame(m) {
      const body = encode(m);
      const framed = Buffer.allocUnsafe(5 + body.length);
      framed[0] = 0;
      framed.writeUInt32BE(body.length, 1);
      body.copy(framed, 5);
      return framed;
    },
    decode: (bytes) => fromBinary(desc, bytes),
    shallow: message,
  };
}
