/**
 * Protobuf wire primitives for the compiled codec (./compile.ts). The writer works in two passes:
 * the sizing pass records the length of every length-delimited part (strings, nested messages,
 * packed lists, map entries) in order, and the writing pass fills one buffer of the exact size
 * using those lengths in the same order. That is what makes it fast: no chunk lists, no forks and
 * joins, no copy at the end.
 */
import { TextDecoder } from "node:util";

export const WIRE_VARINT = 0;
export const WIRE_BIT64 = 1;
export const WIRE_LEN = 2;
export const WIRE_START_GROUP = 3;
export const WIRE_END_GROUP = 4;
export const WIRE_BIT32 = 5;

const TWO_32 = 4294967296;
/**
 * Below this many bytes, text is checked for ASCII in a JavaScript loop and then sliced as latin1
 * (one native call, no copy but the string's own); longer text goes to the strict UTF-8 decoder.
 */
const SHORT_TEXT = 64;
const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

export class Writer {
  buf: Buffer;
  pos = 0;
  /** Lengths recorded by the sizing pass, consumed in the same order by the writing pass. */
  lens: number[];
  li = 0;

  constructor(size: number, lens: number[]) {
    this.buf = Buffer.allocUnsafe(size);
    this.lens = lens;
  }

  nextLen(): number {
    return this.lens[this.li++]!;
  }

  byte(b: number): void {
    this.buf[this.pos++] = b;
  }

  varint32(v: number): void {
    // Unsigned 32-bit value (callers pass v >>> 0 or a length).
    const buf = this.buf;
    while (v > 0x7f) {
      buf[this.pos++] = (v & 0x7f) | 0x80;
      v >>>= 7;
    }
    buf[this.pos++] = v;
  }

  /** A 64-bit varint from its two unsigned 32-bit halves. */
  varint64(lo: number, hi: number): void {
    const buf = this.buf;
    while (hi > 0 || lo > 0x7f) {
      buf[this.pos++] = (lo & 0x7f) | 0x80;
      lo = ((lo >>> 7) | (hi << 25)) >>> 0;
      hi >>>= 7;
    }
    buf[this.pos++] = lo;
  }

  int32(v: number): void {
    if (v >= 0) this.varint32(v);
    else this.varint64(v >>> 0, 0xffffffff);
  }

  /** Text whose UTF-8 length the sizing pass recorded. */
  text(s: string): void {
    const n = this.nextLen();
    this.varint32(n);
    if (n === s.length && n < SHORT_TEXT) {
      const buf = this.buf;
      let p = this.pos;
      for (let i = 0; i < n; i++) buf[p++] = s.charCodeAt(i);
      this.pos = p;
    } else {
      this.pos += this.buf.write(s, this.pos, n, "utf8");
    }
  }

  bytes(b: Uint8Array): void {
    this.varint32(b.length);
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }

  fixed32(v: number): void {
    this.pos = this.buf.writeUInt32LE(v >>> 0, this.pos);
  }

  sfixed32(v: number): void {
    this.pos = this.buf.writeInt32LE(v | 0, this.pos);
  }

  float(v: number): void {
    this.pos = this.buf.writeFloatLE(v, this.pos);
  }

  double(v: number): void {
    this.pos = this.buf.writeDoubleLE(v, this.pos);
  }

  fixed64(v: bigint): void {
    this.pos = this.buf.writeBigUInt64LE(BigInt.asUintN(64, v), this.pos);
  }
}

export function varint32Size(v: number): number {
  return v < 0x80 ? 1 : v < 0x4000 ? 2 : v < 0x200000 ? 3 : v < 0x10000000 ? 4 : 5;
}

export function int32Size(v: number): number {
  return v >= 0 ? varint32Size(v) : 10;
}

export function varint64Size(lo: number, hi: number): number {
  if (hi === 0) return varint32Size(lo);
  // Bits above the low 32: each 7 more bits is one more byte.
  let n = 5;
  hi >>>= 3;
  while (hi > 0) {
    n++;
    hi >>>= 7;
  }
  return n;
}

/** UTF-8 length of a JavaScript string, counting a lone surrogate as U+FFFD (3 bytes), as encoders do. */
export function utf8Length(s: string): number {
  const n = s.length;
  if (n >= SHORT_TEXT) return Buffer.byteLength(s, "utf8");
  let len = n;
  for (let i = 0; i < n; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) continue;
    if (c < 0x800) len += 1;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < n && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      len += 2; // a pair: 4 bytes for 2 code units
      i++;
    } else len += 2;
  }
  return len;
}

/**
 * Scratch for 64-bit values: joining or splitting 32-bit halves through it makes one BigInt (or
 * none), where shifts and masks make four or five. An agent decodes three int64 timestamps per
 * item; with BigInt arithmetic that read was 6 % of an agent's profiled time in the drain.
 */
const SCRATCH = new DataView(new ArrayBuffer(8));

/** Splits an int64/uint64 field value (bigint, number or decimal string) into unsigned 32-bit halves. */
export function split64(v: bigint | number | string): [number, number] {
  if (typeof v === "number" && v >= 0 && v <= Number.MAX_SAFE_INTEGER && Number.isInteger(v)) return [v >>> 0, Math.floor(v / TWO_32)];
  // Stored modulo 2^64, as BigInt.asUintN(64, …) would take it.
  SCRATCH.setBigUint64(0, typeof v === "bigint" ? v : BigInt(v), true);
  return [SCRATCH.getUint32(0, true), SCRATCH.getUint32(4, true)];
}

export class Reader {
  readonly buf: Buffer;
  pos: number;
  readonly end: number;

  constructor(bytes: Uint8Array) {
    this.buf = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    this.pos = 0;
    this.end = bytes.byteLength;
  }

  private eof(): never {
    throw new Error("premature end of message");
  }

  uint32(): number {
    const buf = this.buf;
    let v = 0;
    for (let shift = 0; shift < 35; shift += 7) {
      if (this.pos >= this.end) this.eof();
      const b = buf[this.pos++]!;
      v |= (b & 0x7f) << shift;
      if (b < 0x80) return v >>> 0;
    }
    // A 64-bit varint read as 32 bits keeps the low bits (as protobuf-es does): skip the rest.
    for (let i = 0; i < 5; i++) {
      if (this.pos >= this.end) this.eof();
      if (buf[this.pos++]! < 0x80) return v >>> 0;
    }
    throw new Error("invalid varint");
  }

  /**
   * A field's tag: at most 5 bytes and 32 bits (a longer one would be read as another field's), and
   * never field number 0. protobuf-es refuses the same tags with the same words.
   */
  tag(): number {
    const start = this.pos;
    const tag = this.uint32();
    const read = this.pos - start;
    if (read > 5 || (read === 5 && this.buf[this.pos - 1]! > 0x0f)) throw new Error("illegal tag: varint overflows uint32");
    if (tag >>> 3 === 0) throw new Error(`illegal tag: field no 0 wire type ${tag & 7}`);
    return tag;
  }

  /** A 64-bit varint as unsigned 32-bit halves. */
  varint64(): [number, number] {
    const buf = this.buf;
    let lo = 0;
    let hi = 0;
    let shift = 0;
    for (; shift < 28; shift += 7) {
      if (this.pos >= this.end) this.eof();
      const b = buf[this.pos++]!;
      lo |= (b & 0x7f) << shift;
      if (b < 0x80) return [lo >>> 0, 0];
    }
    if (this.pos >= this.end) this.eof();
    let b = buf[this.pos++]!;
    lo |= (b & 0x0f) << 28;
    hi = (b & 0x7f) >> 4;
    if (b < 0x80) return [lo >>> 0, hi];
    for (shift = 3; shift <= 31; shift += 7) {
      if (this.pos >= this.end) this.eof();
      b = buf[this.pos++]!;
      hi |= (b & 0x7f) << shift;
      if (b < 0x80) return [lo >>> 0, hi >>> 0];
    }
    throw new Error("invalid varint");
  }

  int64(): bigint {
    const [lo, hi] = this.varint64();
    if (hi === 0) return BigInt(lo);
    SCRATCH.setUint32(0, lo, true);
    SCRATCH.setUint32(4, hi, true);
    return SCRATCH.getBigInt64(0, true);
  }

  uint64(): bigint {
    const [lo, hi] = this.varint64();
    if (hi === 0) return BigInt(lo);
    SCRATCH.setUint32(0, lo, true);
    SCRATCH.setUint32(4, hi, true);
    return SCRATCH.getBigUint64(0, true);
  }

  sint64(): bigint {
    const u = this.uint64();
    return (u >> 1n) ^ -(u & 1n);
  }

  bool(): boolean {
    const [lo, hi] = this.varint64();
    return lo !== 0 || hi !== 0;
  }

  /** The end of a length-delimited part that starts here. */
  delimited(): number {
    const start = this.pos;
    const n = this.uint32();
    // A length past 32 bits is malformed, never read as its low bits (which would be another
    // length): past the 5th byte's low 4 bits, every bit the varint carries must be 0.
    if (this.pos - start > 4) {
      let high = this.buf[start + 4]! & 0x70;
      for (let i = start + 5; i < this.pos; i++) high |= this.buf[i]! & 0x7f;
      if (high !== 0) throw new Error("invalid length: varint overflows uint32");
    }
    const end = this.pos + n;
    if (end > this.end) this.eof();
    return end;
  }

  /** UTF-8 text, refused when invalid (as protobuf-es refuses it for proto3 strings). */
  text(): string {
    const end = this.delimited();
    const start = this.pos;
    this.pos = end;
    const n = end - start;
    if (n < SHORT_TEXT) {
      const buf = this.buf;
      let ascii = true;
      for (let i = start; i < end; i++)
        if (buf[i]! >= 0x80) {
          ascii = false;
          break;
        }
      // Not String.fromCharCode.apply over a subarray: that makes a view and an argument list of
      // 8 bytes per character for every string (the largest single share of an agent's garbage per
      // item), and is slower.
      if (ascii) return n === 0 ? "" : buf.toString("latin1", start, end);
    }
    return strictUtf8.decode(this.buf.subarray(start, end));
  }

  bytes(): Uint8Array {
    const end = this.delimited();
    const out = new Uint8Array(this.buf.subarray(this.pos, end));
    this.pos = end;
    return out;
  }

  private fixed(n: number): number {
    const at = this.pos;
    if (at + n > this.end) this.eof();
    this.pos = at + n;
    return at;
  }

  fixed32(): number {
    return this.buf.readUInt32LE(this.fixed(4));
  }

  sfixed32(): number {
    return this.buf.readInt32LE(this.fixed(4));
  }

  float(): number {
    return this.buf.readFloatLE(this.fixed(4));
  }

  double(): number {
    return this.buf.readDoubleLE(this.fixed(8));
  }

  fixed64(): bigint {
    return this.buf.readBigUInt64LE(this.fixed(8));
  }

  sfixed64(): bigint {
    return this.buf.readBigInt64LE(this.fixed(8));
  }

  /** Skips a field this codec does not know (a newer peer's field). */
  skip(wireType: number, fieldNo: number, depth = 0): void {
    switch (wireType) {
      case WIRE_VARINT:
        this.varint64();
        return;
      case WIRE_BIT64:
        this.fixed(8);
        return;
      case WIRE_LEN:
        this.pos = this.delimited();
        return;
      case WIRE_BIT32:
        this.fixed(4);
        return;
      case WIRE_START_GROUP: {
        if (depth > 100) throw new Error("maximum recursion depth reached");
        for (;;) {
          const tag = this.tag();
          if ((tag & 7) === WIRE_END_GROUP) {
            if (tag >>> 3 !== fieldNo) throw new Error("invalid end group tag");
            return;
          }
          this.skip(tag & 7, tag >>> 3, depth + 1);
        }
      }
      default:
        throw new Error(`illegal wire type ${wireType} for field ${fieldNo}`);
    }
  }
}
