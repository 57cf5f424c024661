/**
 * The steps of each field kind for the compiled codec: scalars and enums (implicit or explicit
 * presence, oneof members), nested messages, lists (packed or not) and maps. Each is chosen once per
 * field when a message type's plan is made; nothing here looks at a field's kind per value.
 */
import { ScalarType, type DescField, type DescMessage } from "@bufbuild/protobuf";
import { Reader, varint32Size, WIRE_LEN } from "./binary.js";
import { expectWire, IMPLICIT, nestedSize, nestedWrite, readNested, tagOf, type FieldReader, type FieldWriter, type Msg, type Plan } from "./plan.js";
import { isPackable, scalarOps, type ScalarOps } from "./scalars.js";

/** The plan of a nested message type, or null when it has no codec (then neither has its parent). */
export type PlanOf = (desc: DescMessage) => Plan | null;

/** The value of field f in m: a oneof member's value only when its case is set. */
function getter(f: DescField): (m: Msg) => any {
  const key = f.localName;
  if (f.oneof) {
    const oneof = f.oneof.localName;
    return (m) => {
      const o = m[oneof];
      return o != null && o.case === key ? o.value : undefined;
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

export function fieldParts(f: DescField, planOf: PlanOf): { writer: FieldWriter; reader: FieldReader } | null {
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
      return listField(f, planOf);
    case "map":
      return mapField(f, planOf);
  }
}

function singular(f: DescField, ops: ScalarOps): { writer: FieldWriter; reader: FieldReader } {
  const { tag, tagSize } = tagOf(f.number, ops.wire);
  const get = getter(f);
  const set = setter(f);
  // Implicit presence (plain proto3 fields) skips zero values; explicit presence (optional, oneof)
  // writes any set value. null counts as unset everywhere, as for protobuf-es's create().
  const isSet = f.presence === IMPLICIT && !f.oneof ? (v: unknown) => v != null && !ops.isZero(v) : (v: unknown) => v != null;
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
        return v == null ? 0 : tagSize + nestedSize(plan, v, lens);
      },
      write(m, w) {
        const v = get(m);
        if (v == null) return;
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

function listField(f: DescField & { fieldKind: "list" }, planOf: PlanOf): { writer: FieldWriter; reader: FieldReader } | null {
  const key = f.localName;
  if (f.listKind === "message") {
    const plan = planOf(f.message);
    if (!plan) return null;
    const { tag, tagSize } = tagOf(f.number, WIRE_LEN);
    return {
      writer: {
        size(m, lens) {
          const list: Msg[] | undefined = m[key];
          if (list == null) return 0;
          let n = 0;
          for (let i = 0; i < list.length; i++) n += tagSize + nestedSize(plan, list[i]!, lens);
          return n;
        },
        write(m, w) {
          const list: Msg[] | undefined = m[key];
          if (list == null) return;
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
          if (list == null || list.length === 0) return 0;
          const at = lens.push(0) - 1;
          let n = 0;
          for (let i = 0; i < list.length; i++) n += ops.size(list[i], lens);
          lens[at] = n;
          return tagSize + varint32Size(n) + n;
        },
        write(m, w) {
          const list: unknown[] | undefined = m[key];
          if (list == null || list.length === 0) return;
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
        if (list == null) return 0;
        let n = 0;
        for (let i = 0; i < list.length; i++) n += tagSize + ops.size(list[i], lens);
        return n;
      },
      write(m, w) {
        const list: unknown[] | undefined = m[key];
        if (list == null) return;
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

function mapField(f: DescField & { fieldKind: "map" }, planOf: PlanOf): { writer: FieldWriter; reader: FieldReader } | null {
  const key = f.localName;
  const keyOps = scalarOps(f.mapKey, false);
  const keys = mapKeyCodec(f.mapKey);
  const keyTag = tagOf(1, keyOps.wire);
  const valuePlan = f.mapKind === "message" ? planOf(f.message) : undefined;
  if (valuePlan === null) return null;
  const valueOps = f.mapKind === "message" ? undefined : scalarOps(f.mapKind === "enum" ? ScalarType.INT32 : f.scalar, false);
  const valueTag = tagOf(2, valueOps ? valueOps.wire : WIRE_LEN);
  const valueZero = () =>
    valuePlan ? valuePlan.zero() : f.mapKind === "enum" ? (f.enum.values[0]?.number ?? 0) : valueOps!.read(new Reader(ZERO_BYTES[valueOps!.wire]!));
  const { tag, tagSize } = tagOf(f.number, WIRE_LEN);
  // protobuf-es writes every entry's key and value, zero or not; so does this.
  const entrySize = (k: string, v: any, lens: number[]) =>
    keyTag.tagSize + keyOps.size(keys.toWire(k), lens) + valueTag.tagSize + (valuePlan ? nestedSize(valuePlan, v, lens) : valueOps!.size(v, lens));
  return {
    writer: {
      size(m, lens) {
        const map: Msg | undefined = m[key];
        if (map == null) return 0;
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
        if (map == null) return;
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
        const t = r.tag();
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
