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
import { ScalarType, type DescField, type DescMessage, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { Reader, varint32Size, WIRE_LEN, Writer } from "./binary.js";
import { isPackable, scalarOps, type ScalarOps } from "./scalars.js";

export interface Codec<Desc extends DescMessage> {
  /** Encodes a message, or an init object of one (absent fields count as unset). */
  encode(message: MessageShape<Desc> | MessageInitShape<Desc>): Buffer;
  /** Decodes a message as protobuf-es's fromBinary would (less unknown fields); throws on malformed input. */
  decode(bytes: Uint8Array): MessageShape<Desc>;
  /**
   * A message from an init object, made only one level deep: every field of its own is present
   * (zero where absent), nested messages are left as given (the codec encodes them by schema).
   * What interceptors see of a message without protobuf-es's create() walking every nested one.
   */
  shallow(init: MessageShape<Desc> | MessageInitShape<Desc>): MessageShape<Desc>;
}

type Msg = Record<string, any>;

/** How one field (or one member of a oneof) is sized and written. */
interface FieldWriter {
  size(m: Msg, lens: number[]): number;
  write(m: Msg, w: Writer): void;
}

/** How one field number is read into a message. */
type FieldReader = (r: Reader, wire: number, m: Msg, depth: number) => void;

interface Plan {
  zero: () => Msg;
  writers: FieldWriter[];
  readers: (FieldReader | undefined)[];
}

const IMPLICIT = 2;
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

function makeCodec(plan: Plan): Codec<any> {
  return {
    encode(message) {
      const lens: number[] = [];
      const size = sizeOf(plan, message as Msg, lens);
      const w = new Writer(size, lens);
      writeOf(plan, message as Msg, w);
      return w.buf;
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

function sizeOf(plan: Plan, m: Msg, lens: number[]): number {
  let n = 0;
  for (const f of plan.writers) n += f.size(m, lens);
  return n;
}

function writeOf(plan: Plan, m: Msg, w: Writer): void {
  for (const f of plan.writers) f.write(m, w);
}

const MAX_DEPTH = 100;

function readInto(plan: Plan, r: Reader, end: number, m: Msg, depth: number): void {
  if (depth > MAX_DEPTH) throw new Error("maximum recursion depth reached");
  while (r.pos < end) {
    const tag = r.uint32();
    const no = tag >>> 3;
    const wire = tag & 7;
    if (no === 0) throw new Error(`illegal tag: field no 0 wire type ${wire}`);
    const read = plan.readers[no];
    if (read) read(r, wire, m, depth);
    else r.skip(wire, no);
  }
  if (r.pos !== end) throw new Error("premature end of message");
}

/** Reads one nested message (length-delimited) into target, or into a new zero message. */
function readNested(plan: Plan, r: Reader, target: Msg | undefined, depth: number): Msg {
  const end = r.delimited();
  const m = target ?? plan.zero();
  readInto(plan, r, end, m, depth + 1);
  return m;
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
    const parts = fieldParts(field);
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
  ["Struct", "Value", "ListValue", "DoubleValue", "FloatValue", "Int64Value", "UInt64Value", "Int32Value", "UInt32Value", "BoolValue", "StringValue", "BytesValue"].map((n) => `google.protobuf.${n}`),
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

function tagOf(no: number, wire: number): { tag: number; tagSize: number } {
  const tag = ((no << 3) | wire) >>> 0;
  return { tag, tagSize: varint32Size(tag) };
}

/** The value of field f in m: a oneof member's value only when its case is set. */
function getter(f: DescField): (m: Msg) => any {
  const key = f.localName;
  if (f.oneof) {
    const oneof = f.oneof.localName;
    return (m) => {
      const o = m[oneof];
      return o !== undefined && o.case === key ? o.value : undefined;
    };
  }
  return (m) => m[key];
}

/** Stores a read value: a oneof member sets its case. */
function setter(f: DescField): (m: Msg, v: unknown) => void {
  const key = f.localName;
  if (f.oneof) {
    const oneof = f.oneof.localName;
    return (m, v) => {
      m[oneof] = { case: key, value: v };
    };
  }
  return (m, v) => {
    m[key] = v;
  };
}

function fieldParts(f: DescField): { writer: FieldWriter; reader: FieldReader } | null {
  switch (f.fieldKind) {
    case "scalar":
      return singular(f, scalarOps(f.scalar, f.longAsString));
    case "enum":
      return singular(f, scalarOps(ScalarType.INT32, false));
    case "message": {
      const plan = planOf(f.message);
      return plan ? messageField(f, plan) : null;
    }
    case "list":
      return listField(f);
    case "map":
      return mapField(f);
  }
}

function singular(f: DescField, ops: ScalarOps): { writer: FieldWriter; reader: FieldReader } {
  const { tag, tagSize } = tagOf(f.number, ops.wire);
  const get = getter(f);
  const set = setter(f);
  // Implicit presence (plain proto3 fields) skips zero values; explicit presence (optional, oneof) writes any set value.
  const isSet = f.presence === IMPLICIT && !f.oneof ? (v: unknown) => v !== undefined && !ops.isZero(v) : (v: unknown) => v !== undefined;
  return {
    writer: {
      size(m, lens) {
        const v = get(m);
        return isSet(v) ? tagSize + ops.size(v, lens) : 0;
      },
      write(m, w) {
        const v = get(m);
        if (!isSet(v)) return;
        w.varint32(tag);
        ops.write(w, v);
      },
    },
    reader: (r, wire, m) => {
      expectWire(f, wire, ops.wire);
      set(m, ops.read(r));
    },
  };
}

function messageField(f: DescField, plan: Plan): { writer: FieldWriter; reader: FieldReader } {
  const { tag, tagSize } = tagOf(f.number, WIRE_LEN);
  const get = getter(f);
  const set = setter(f);
  return {
    writer: {
      size(m, lens) {
        const v = get(m);
        return v === undefined ? 0 : tagSize + nestedSize(plan, v, lens);
      },
      write(m, w) {
        const v = get(m);
        if (v === undefined) return;
        w.varint32(tag);
        nestedWrite(plan, v, w);
      },
    },
    // A repeated occurrence of a singular message merges into the first, as the protobuf spec says.
    reader: (r, wire, m, depth) => {
      expectWire(f, wire, WIRE_LEN);
      set(m, readNested(plan, r, get(m), depth));
    },
  };
}

function nestedSize(plan: Plan, v: Msg, lens: number[]): number {
  const at = lens.push(0) - 1;
  const n = sizeOf(plan, v, lens);
  lens[at] = n;
  return varint32Size(n) + n;
}

function nestedWrite(plan: Plan, v: Msg, w: Writer): void {
  w.varint32(w.nextLen());
  writeOf(plan, v, w);
}

function listField(f: DescField & { fieldKind: "list" }): { writer: FieldWriter; reader: FieldReader } | null {
  const key = f.localName;
  if (f.listKind === "message") {
    const plan = planOf(f.message);
    if (!plan) return null;
    const { tag, tagSize } = tagOf(f.number, WIRE_LEN);
    return {
      writer: {
        size(m, lens) {
          const list: Msg[] | undefined = m[key];
          if (list === undefined) return 0;
          let n = 0;
          for (let i = 0; i < list.length; i++) n += tagSize + nestedSize(plan, list[i]!, lens);
          return n;
        },
        write(m, w) {
          const list: Msg[] | undefined = m[key];
          if (list === undefined) return;
          for (let i = 0; i < list.length; i++) {
            w.varint32(tag);
            nestedWrite(plan, list[i]!, w);
          }
        },
      },
      reader: (r, wire, m, depth) => {
        expectWire(f, wire, WIRE_LEN);
        (m[key] as Msg[]).push(readNested(plan, r, undefined, depth));
      },
    };
  }
  const type = f.listKind === "enum" ? ScalarType.INT32 : f.scalar;
  const ops = scalarOps(type, f.listKind === "scalar" && f.longAsString);
  const packable = isPackable(type);
  const reader: FieldReader = (r, wire, m) => {
    const list = m[key] as unknown[];
    if (packable && wire === WIRE_LEN) {
      const end = r.delimited();
      while (r.pos < end) list.push(ops.read(r));
      if (r.pos !== end) throw new Error(`packed field ${f.parent.typeName}.${f.name} overruns its length`);
      return;
    }
    expectWire(f, wire, ops.wire);
    list.push(ops.read(r));
  };
  if (f.packed) {
    const { tag, tagSize } = tagOf(f.number, WIRE_LEN);
    return {
      writer: {
        size(m, lens) {
          const list: unknown[] | undefined = m[key];
          if (list === undefined || list.length === 0) return 0;
          const at = lens.push(0) - 1;
          let n = 0;
          for (let i = 0; i < list.length; i++) n += ops.size(list[i], lens);
          lens[at] = n;
          return tagSize + varint32Size(n) + n;
        },
        write(m, w) {
          const list: unknown[] | undefined = m[key];
          if (list === undefined || list.length === 0) return;
          w.varint32(tag);
          w.varint32(w.nextLen());
          for (let i = 0; i < list.length; i++) ops.write(w, list[i]);
        },
      },
      reader,
    };
  }
  const { tag, tagSize } = tagOf(f.number, ops.wire);
  return {
    writer: {
      size(m, lens) {
        const list: unknown[] | undefined = m[key];
        if (list === undefined) return 0;
        let n = 0;
        for (let i = 0; i < list.length; i++) n += tagSize + ops.size(list[i], lens);
        return n;
      },
      write(m, w) {
        const list: unknown[] | undefined = m[key];
        if (list === undefined) return;
        for (let i = 0; i < list.length; i++) {
          w.varint32(tag);
          ops.write(w, list[i]);
        }
      },
    },
    reader,
  };
}

/** Map keys live as object keys (strings); these turn them back into the key type and out again. */
function mapKeyCodec(type: ScalarType): { toWire: (k: string) => unknown; toLocal: (v: unknown) => string } {
  switch (type) {
    case ScalarType.STRING:
      return { toWire: (k) => k, toLocal: (v) => v as string };
    case ScalarType.BOOL:
      return { toWire: (k) => k === "true", toLocal: (v) => String(v) };
    case ScalarType.INT64:
    case ScalarType.UINT64:
    case ScalarType.SINT64:
    case ScalarType.FIXED64:
    case ScalarType.SFIXED64:
      return { toWire: (k) => BigInt(k), toLocal: (v) => String(v) };
    default:
      return { toWire: (k) => Number(k), toLocal: (v) => String(v) };
  }
}

function mapField(f: DescField & { fieldKind: "map" }): { writer: FieldWriter; reader: FieldReader } | null {
  const key = f.localName;
  const keyOps = scalarOps(f.mapKey, false);
  const keys = mapKeyCodec(f.mapKey);
  const keyTag = tagOf(1, keyOps.wire);
  const valuePlan = f.mapKind === "message" ? planOf(f.message) : undefined;
  if (valuePlan === null) return null;
  const valueOps = f.mapKind === "message" ? undefined : scalarOps(f.mapKind === "enum" ? ScalarType.INT32 : f.scalar, false);
  const valueTag = tagOf(2, valueOps ? valueOps.wire : WIRE_LEN);
  const valueZero = () => (valuePlan ? valuePlan.zero() : f.mapKind === "enum" ? (f.enum.values[0]?.number ?? 0) : valueOps!.read(new Reader(ZERO_BYTES[valueOps!.wire]!)));
  const { tag, tagSize } = tagOf(f.number, WIRE_LEN);
  // protobuf-es writes every entry's key and value, zero or not; so does this.
  const entrySize = (k: string, v: any, lens: number[]) =>
    keyTag.tagSize + keyOps.size(keys.toWire(k), lens) + valueTag.tagSize + (valuePlan ? nestedSize(valuePlan, v, lens) : valueOps!.size(v, lens));
  return {
    writer: {
      size(m, lens) {
        const map: Msg | undefined = m[key];
        if (map === undefined) return 0;
        let n = 0;
        for (const k in map) {
          const at = lens.push(0) - 1;
          const e = entrySize(k, map[k], lens);
          lens[at] = e;
          n += tagSize + varint32Size(e) + e;
        }
        return n;
      },
      write(m, w) {
        const map: Msg | undefined = m[key];
        if (map === undefined) return;
        for (const k in map) {
          w.varint32(tag);
          w.varint32(w.nextLen());
          w.varint32(keyTag.tag);
          keyOps.write(w, keys.toWire(k));
          w.varint32(valueTag.tag);
          if (valuePlan) nestedWrite(valuePlan, map[k], w);
          else valueOps!.write(w, map[k]);
        }
      },
    },
    reader: (r, wire, m, depth) => {
      expectWire(f, wire, WIRE_LEN);
      const end = r.delimited();
      let k: unknown;
      let v: unknown;
      while (r.pos < end) {
        const t = r.uint32();
        const no = t >>> 3;
        const wt = t & 7;
        if (no === 1) {
          expectWire(f, wt, keyOps.wire);
          k = keyOps.read(r);
        } else if (no === 2) {
          expectWire(f, wt, valueTag.tag & 7);
          v = valuePlan ? readNested(valuePlan, r, undefined, depth) : valueOps!.read(r);
        } else r.skip(wt, no);
      }
      if (r.pos !== end) throw new Error(`map entry of ${f.parent.typeName}.${f.name} overruns its length`);
      const map = m[key] as Msg;
      map[k === undefined ? keys.toLocal(keyOps.read(new Reader(ZERO_BYTES[keyOps.wire]!))) : keys.toLocal(k)] = v === undefined ? valueZero() : v;
    },
  };
}

/** The encoding of a zero value per wire type, to read a map entry's missing key or value as its type's zero. */
const ZERO_BYTES: Record<number, Uint8Array> = { 0: new Uint8Array([0]), 1: new Uint8Array(8), 2: new Uint8Array([0]), 5: new Uint8Array(4) };

function expectWire(f: DescField, got: number, want: number): void {
  if (got !== want) throw new Error(`field ${f.parent.typeName}.${f.name} (${f.number}) has wire type ${got}, expected ${want}`);
}
