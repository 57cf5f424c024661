/**
 * A protobuf codec compiled from a protobuf-es message descriptor. protobuf-es reads and writes
 * reflectively: every field of every message goes through a reflection wrapper, a type switch and
 * a writer that forks a chunk list per nested message. On the hot calls (a claim carries 32 work
 * items of 26 fields each) that was about a quarter of the daemon's busy time and a third of an
 * agent's. Here each field's steps are chosen once per message type, the writer sizes the whole
 * message first and fills one buffer (./binary.ts), and a decoded message is made by a generated
 * object literal with the same shape protobuf-es gives.
 *
 * The descriptor stays the one definition of the wire format: nothing here is written per message,
 * and the tests check every message of our protos against protobuf-es in both directions. Unknown
 * fields are skipped when decoding (not kept in $unknown). Messages this does not cover — proto2 or
 * editions defaults, groups, closed enums, fields of a well-known type protobuf-es reshapes (Struct
 * as JSON, unboxed wrappers) — get no codec (compileCodec returns undefined) and
 * callers use protobuf-es for them.
 */
import type { DescField, DescMessage, MessageInitShape, MessageShape } from "@bufbuild/protobuf";
import { Reader, Writer } from "./binary.js";
import { fieldParts } from "./fields.js";
import { IMPLICIT, readInto, sizeOf, writeOf, type Msg, type Plan } from "./plan.js";
import { scalarOps } from "./scalars.js";

export interface Codec<Desc extends DescMessage> {
  /** Encodes a message, or an init object of one (absent fields count as unset). */
  encode(message: MessageShape<Desc> | MessageInitShape<Desc>): Buffer;
  /**
   * Encodes it as one gRPC message: the 5-byte envelope (not compressed, big-endian length) and the
   * message in one buffer, written in place rather than copied behind the header.
   */
  frame(message: MessageShape<Desc> | MessageInitShape<Desc>): Buffer;
  /** Decodes a message as protobuf-es's fromBinary would (less unknown fields); throws on malformed input. */
  decode(bytes: Uint8Array): MessageShape<Desc>;
  /**
   * A message from an init object, made only one level deep: every field of its own is present
   * (zero where absent), nested messages are left as given (the codec encodes them by schema).
   * What interceptors see of a message without protobuf-es's create() walking every nested one.
   */
  shallow(init: MessageShape<Desc> | MessageInitShape<Desc>): MessageShape<Desc>;
}

const plans = new WeakMap<DescMessage, Plan | null>();
const codecs = new WeakMap<DescMessage, Codec<any> | null>();

/** The compiled codec of a message type, or undefined when the type uses what this does not cover. */
export function compileCodec<Desc extends DescMessage>(desc: Desc): Codec<Desc> | undefined {
  let codec = codecs.get(desc);
  if (codec === undefined) {
    const plan = planOf(desc);
    codec = plan ? makeCodec(plan) : null;
    codecs.set(desc, codec);
  }
  return codec ?? undefined;
}

/** gRPC's message envelope: a flags byte and a 4-byte length. */
const GRPC_HEADER = 5;

/** The message's bytes in a buffer that leaves `headroom` bytes free in front of them. */
function encodeAfter(plan: Plan, m: Msg, headroom: number): Buffer {
  const lens: number[] = [];
  const size = sizeOf(plan, m, lens);
  const w = new Writer(headroom + size, lens);
  w.pos = headroom;
  writeOf(plan, m, w);
  return w.buf;
}

function makeCodec(plan: Plan): Codec<any> {
  return {
    encode(message) {
      return encodeAfter(plan, message as Msg, 0);
    },
    frame(message) {
      const buf = encodeAfter(plan, message as Msg, GRPC_HEADER);
      buf[0] = 0;
      buf.writeUInt32BE(buf.length - GRPC_HEADER, 1);
      return buf;
    },
    decode(bytes) {
      const r = new Reader(bytes);
      const m = plan.zero();
      readInto(plan, r, r.end, m, 0);
      return m as any;
    },
    shallow(init) {
      const m = plan.zero();
      const given = init as Msg;
      for (const k in given) if (k !== "$typeName" && given[k] !== undefined) m[k] = given[k];
      return m as any;
    },
  };
}

function planOf(desc: DescMessage): Plan | null {
  const known = plans.get(desc);
  if (known !== undefined) return known;
  if (!supported(desc)) {
    plans.set(desc, null);
    return null;
  }
  // Registered before its fields are planned, so recursive types find it.
  const plan: Plan = { zero: zeroFactory(desc), writers: [], readers: [] };
  plans.set(desc, plan);
  for (const field of [...desc.fields].sort((a, b) => a.number - b.number)) {
    const parts = fieldParts(field, planOf);
    if (!parts) {
      plans.set(desc, null);
      return null;
    }
    plan.writers.push(parts.writer);
    plan.readers[field.number] = parts.reader;
  }
  return plan;
}

/** Well-known types protobuf-es gives another shape in fields (JSON values, unboxed scalars). */
export const RESHAPED_TYPES = new Set(
  [
    "Struct",
    "Value",
    "ListValue",
    "DoubleValue",
    "FloatValue",
    "Int64Value",
    "UInt64Value",
    "Int32Value",
    "UInt32Value",
    "BoolValue",
    "StringValue",
    "BytesValue",
  ].map((n) => `google.protobuf.${n}`),
);

function supported(desc: DescMessage): boolean {
  if (desc.file.edition !== 999 /* proto3 */) return false;
  for (const f of desc.fields) {
    if (f.message && RESHAPED_TYPES.has(f.message.typeName)) return false;
    if (f.fieldKind === "enum" && !f.enum.open) return false;
    if ((f.fieldKind === "message" || (f.fieldKind === "list" && f.listKind === "message")) && f.delimitedEncoding) return false;
  }
  return true;
}

/** A generated object literal, so every decoded message of a type has one hidden class from the start. */
function zeroFactory(desc: DescMessage): () => Msg {
  const props = [`$typeName: ${JSON.stringify(desc.typeName)}`];
  for (const member of desc.members) {
    if (member.kind === "oneof") props.push(`${JSON.stringify(member.localName)}: { case: undefined }`);
    else if (member.presence === IMPLICIT) props.push(`${JSON.stringify(member.localName)}: ${zeroLiteral(member)}`);
  }
  return new Function(`return () => ({ ${props.join(", ")} });`)() as () => Msg;
}

function zeroLiteral(f: DescField): string {
  switch (f.fieldKind) {
    case "list":
      return "[]";
    case "map":
      return "{}";
    case "enum":
      return String(f.enum.values[0]?.number ?? 0);
    case "scalar":
      return scalarOps(f.scalar, f.longAsString).zero;
    case "message":
      return "undefined";
  }
}
