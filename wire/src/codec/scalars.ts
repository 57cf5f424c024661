/**
 * One entry per protobuf scalar type: its wire type, its zero test (implicit presence), and how the
 * compiled codec sizes, writes and reads it. Values are what protobuf-es uses: numbers, bigints
 * for 64-bit types (or decimal strings when a field asks for them), booleans, strings, Uint8Array.
 */
import { ScalarType } from "@bufbuild/protobuf";
import {
  int32Size,
  split64,
  utf8Length,
  varint32Size,
  varint64Size,
  WIRE_BIT32,
  WIRE_BIT64,
  WIRE_LEN,
  WIRE_VARINT,
  type Reader,
  type Writer,
} from "./binary.js";

export interface ScalarOps {
  wire: number;
  isZero(v: unknown): boolean;
  /** Bytes of the value without its tag; pushes recorded lengths onto lens. */
  size(v: any, lens: number[]): number;
  write(w: Writer, v: any): void;
  read(r: Reader): unknown;
  /** The JavaScript literal of its zero value, for the generated zero-message factory. */
  zero: string;
}

const zeroNumber = (v: unknown) => v === 0;
// biome-ignore lint/suspicious/noDoubleEquals: 0n, 0 and "0" alike, as protobuf-es tests them
const zeroLong = (v: unknown) => v == 0;

function long(read: (r: Reader) => bigint, toUnsigned: (v: bigint | number | string) => [number, number]): Omit<ScalarOps, "zero"> {
  return {
    wire: WIRE_VARINT,
    isZero: zeroLong,
    size: (v) => {
      const [lo, hi] = toUnsigned(v);
      return varint64Size(lo, hi);
    },
    write: (w, v) => {
      const [lo, hi] = toUnsigned(v);
      w.varint64(lo, hi);
    },
    read,
  };
}

function zigzag64(v: bigint | number | string): [number, number] {
  const b = BigInt.asIntN(64, BigInt(v));
  return split64(BigInt.asUintN(64, (b << 1n) ^ (b >> 63n)));
}

const OPS: Record<number, Omit<ScalarOps, "zero">> = {
  [ScalarType.STRING]: {
    wire: WIRE_LEN,
    isZero: (v) => v === "",
    size: (v: string, lens) => {
      const n = utf8Length(v);
      lens.push(n);
      return varint32Size(n) + n;
    },
    write: (w, v: string) => w.text(v),
    read: (r) => r.text(),
  },
  [ScalarType.BYTES]: {
    wire: WIRE_LEN,
    isZero: (v) => (v as Uint8Array).length === 0,
    size: (v: Uint8Array) => varint32Size(v.length) + v.length,
    write: (w, v: Uint8Array) => w.bytes(v),
    read: (r) => r.bytes(),
  },
  [ScalarType.BOOL]: { wire: WIRE_VARINT, isZero: (v) => v === false, size: () => 1, write: (w, v) => w.byte(v ? 1 : 0), read: (r) => r.bool() },
  [ScalarType.INT32]: {
    wire: WIRE_VARINT,
    isZero: zeroNumber,
    size: (v: number) => int32Size(v),
    write: (w, v: number) => w.int32(v),
    read: (r) => r.uint32() | 0,
  },
  [ScalarType.UINT32]: {
    wire: WIRE_VARINT,
    isZero: zeroNumber,
    size: (v: number) => varint32Size(v >>> 0),
    write: (w, v: number) => w.varint32(v >>> 0),
    read: (r) => r.uint32(),
  },
  [ScalarType.SINT32]: {
    wire: WIRE_VARINT,
    isZero: zeroNumber,
    size: (v: number) => varint32Size(((v << 1) ^ (v >> 31)) >>> 0),
    write: (w, v: number) => w.varint32(((v << 1) ^ (v >> 31)) >>> 0),
    read: (r) => {
      const z = r.uint32();
      return (z >>> 1) ^ -(z & 1);
    },
  },
  [ScalarType.INT64]: long((r) => r.int64(), split64),
  [ScalarType.UINT64]: long((r) => r.uint64(), split64),
  [ScalarType.SINT64]: long((r) => r.sint64(), zigzag64),
  [ScalarType.FIXED32]: { wire: WIRE_BIT32, isZero: zeroNumber, size: () => 4, write: (w, v: number) => w.fixed32(v), read: (r) => r.fixed32() },
  [ScalarType.SFIXED32]: { wire: WIRE_BIT32, isZero: zeroNumber, size: () => 4, write: (w, v: number) => w.sfixed32(v), read: (r) => r.sfixed32() },
  [ScalarType.FLOAT]: { wire: WIRE_BIT32, isZero: zeroNumber, size: () => 4, write: (w, v: number) => w.float(v), read: (r) => r.float() },
  [ScalarType.DOUBLE]: { wire: WIRE_BIT64, isZero: zeroNumber, size: () => 8, write: (w, v: number) => w.double(v), read: (r) => r.double() },
  [ScalarType.FIXED64]: { wire: WIRE_BIT64, isZero: zeroLong, size: () => 8, write: (w, v) => w.fixed64(BigInt(v)), read: (r) => r.fixed64() },
  [ScalarType.SFIXED64]: { wire: WIRE_BIT64, isZero: zeroLong, size: () => 8, write: (w, v) => w.fixed64(BigInt(v)), read: (r) => r.sfixed64() },
};

const LONGS = new Set([ScalarType.INT64, ScalarType.UINT64, ScalarType.SINT64, ScalarType.FIXED64, ScalarType.SFIXED64]);

/** The operations for a scalar type; longAsString fields read 64-bit values as decimal strings. */
export function scalarOps(type: ScalarType, longAsString: boolean): ScalarOps {
  const ops = OPS[type];
  if (!ops) throw new Error(`unknown scalar type ${type}`);
  const isLong = LONGS.has(type);
  const zero =
    type === ScalarType.STRING
      ? '""'
      : type === ScalarType.BOOL
        ? "false"
        : type === ScalarType.BYTES
          ? "new Uint8Array(0)"
          : isLong
            ? longAsString
              ? '"0"'
              : "0n"
            : "0";
  if (isLong && longAsString) return { ...ops, zero, read: (r) => String(ops.read(r)) };
  return { ...ops, zero };
}

/** Packable: numeric scalars (and enums), written packed in proto3 by default. */
export function isPackable(type: ScalarType): boolean {
  return type !== ScalarType.STRING && type !== ScalarType.BYTES;
}
