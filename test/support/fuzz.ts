/**
 * A small deterministic fuzz engine for what parses untrusted bytes: protobuf messages and gRPC's
 * 5-byte message envelope. Nothing here knows the daemon; test/support/fuzz-daemon.ts builds whole
 * requests from it, test/fuzz-codec.test.ts hostile replies.
 *
 * What must stay true:
 * - a case is a pure function of (seed, index): `caseRng(seed, i)` gives case i its own generator, so
 *   one failing case replays alone (`bench/fuzz.ts --seed S --case I`), on any machine;
 * - mutations start from valid seeds: a message of the method's own type with every field kind
 *   filled (`randomMessage`), encoded by protobuf-es's toBinary, so most cases get past the first
 *   byte and reach the decoder's deeper states;
 * - every mutator bounds what it makes (`Limits.maxBytes`): a case is a probe, never a load test.
 */
import { create, toBinary, type DescField, type DescMessage } from "@bufbuild/protobuf";
import { mulberry32 } from "./prng.js";

/** Choices for mutations, from the one seeded PRNG (./prng.ts): a seed replays its cases. */
export class Rng {
  readonly #next: () => number;

  constructor(seed: number) {
    this.#next = mulberry32(seed);
  }

  u32(): number {
    return Math.floor(this.#next() * 4294967296) >>> 0;
  }

  /** In [0, 1). */
  float(): number {
    return this.#next();
  }

  /** In [0, n). */
  int(n: number): number {
    return Math.floor(this.float() * n);
  }

  /** In [lo, hi], both included. */
  range(lo: number, hi: number): number {
    return lo + this.int(hi - lo + 1);
  }

  chance(p: number): boolean {
    return this.float() < p;
  }

  pick<T>(xs: readonly T[]): T {
    return xs[this.int(xs.length)]!;
  }

  bytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = this.u32() & 0xff;
    return out;
  }
}

/** Case `index` of run `seed`: its own generator, independent of every other case. */
export function caseRng(seed: number, index: number): Rng {
  let h = Math.imul((seed >>> 0) ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(index >>> 0, 0xc2b2ae35);
  h = Math.imul(h ^ (h >>> 16), 0x27d4eb2f);
  return new Rng((h ^ (h >>> 15)) >>> 0);
}

export interface Limits {
  /** The largest message a mutator makes (bombs included). */
  maxBytes: number;
}

export const CI_LIMITS: Limits = { maxBytes: 64 * 1024 };

// ---- valid seeds -----------------------------------------------------------------------------

/** A character outside the BMP (a surrogate pair in JavaScript) at UTF-16 index `at`: a cut there splits it. */
const pairAt = (at: number, fill = "x") => `${fill.repeat(at)}🙂`;

/**
 * Texts a caller might send: plausible values (so handlers get past their first check) and edges,
 * among them surrogate pairs where an error message might cut a quoted value (40, 64, 128 code units).
 */
const TEXTS = [
  "",
  "default",
  "fuzz",
  "dag",
  "agent-1",
  "gpu",
  "r1",
  "t1",
  '{"a":1}',
  "[]",
  "null",
  '{"a":"\\u0000"}',
  "[".repeat(200),
  '{"n":1e999}',
  "01J00000000000000000000000",
  "\u0000",
  "\u0007bell",
  "é",
  "名前",
  "🙂",
  "\u{10ffff}",
  "lone \ud800",
  "x".repeat(300),
  "%00%zz",
  "Bearer x",
  pairAt(39),
  pairAt(63),
  pairAt(127),
  `{"${pairAt(39, "k")}":1,"${pairAt(39, "k")}":2}`,
];

function scalarValue(rng: Rng, type: number): unknown {
  switch (type) {
    case 9: // string
      return rng.pick(TEXTS);
    case 12: // bytes
      return rng.bytes(rng.pick([0, 1, 8, 100]));
    case 8: // bool
      return rng.chance(0.5);
    case 5: // int32
    case 15: // sfixed32
    case 17: // sint32
      return rng.pick([0, 1, -1, 2, 5, 127, 128, 1000, 2147483647, -2147483648, rng.int(1 << 20)]);
    case 13: // uint32
    case 7: // fixed32
      return rng.pick([0, 1, 2, 16, 256, 4294967295, rng.int(1 << 30)]);
    case 3: // int64
    case 16: // sfixed64
    case 18: // sint64
      return rng.pick([0n, 1n, -1n, 1000n, 1_764_000_000_000_000_000n, -(2n ** 63n), 2n ** 63n - 1n, BigInt(rng.int(1e9))]);
    case 4: // uint64
    case 6: // fixed64
      return rng.pick([0n, 1n, 2n ** 64n - 1n, 2n ** 53n + 1n, BigInt(rng.int(1e9))]);
    case 1: // double
    case 2: // float
      return rng.pick([0, 1, -1.5, 0.5, 1e300, Number.NaN, Number.POSITIVE_INFINITY, rng.float()]);
    default:
      throw new Error(`no value for scalar type ${type}`);
  }
}

function enumValue(rng: Rng, f: DescField): number {
  const values = f.enum!.values;
  // Open enums take any int32: a number the schema does not name is a value a newer peer may send.
  return rng.chance(0.1) ? rng.pick([-1, 99, 2147483647]) : values[rng.int(values.length)]!.number;
}

/**
 * A plausible value for a scalar or enum field (by its name, say), or undefined for a random one:
 * what lets a request get past its handler's first checks often enough to reach the later ones.
 */
export type Hint = (field: DescField, rng: Rng) => unknown;

export interface Shape {
  /** Consulted first for every scalar and enum value. */
  hint?: Hint;
  /** How likely a field is left unset (default 0.3). */
  unset?: number;
}

/** A valid init object of `desc`: each field set or not, lists and maps of a few entries, one oneof case. */
export function randomMessage(desc: DescMessage, rng: Rng, shape: Shape = {}, depth = 0): Record<string, unknown> {
  const init: Record<string, unknown> = {};
  const one = (f: DescField, kind: "scalar" | "enum" | "message", scalar: number | undefined, message: DescMessage | undefined): unknown => {
    if (kind === "message") return randomMessage(message!, rng, shape, depth + 1);
    return shape.hint?.(f, rng) ?? (kind === "enum" ? enumValue(rng, f) : scalarValue(rng, scalar!));
  };
  for (const member of desc.members) {
    if (member.kind === "oneof") {
      const f = member.fields[rng.int(member.fields.length + 1)];
      if (f && (f.fieldKind !== "message" || depth < 3))
        init[member.localName] = { case: f.localName, value: one(f, f.fieldKind as "scalar" | "enum" | "message", f.scalar, f.message) };
      continue;
    }
    const f = member;
    if (rng.chance(shape.unset ?? 0.3)) continue;
    switch (f.fieldKind) {
      case "scalar":
        init[f.localName] = one(f, "scalar", f.scalar, undefined);
        break;
      case "enum":
        init[f.localName] = one(f, "enum", undefined, undefined);
        break;
      case "message":
        if (depth < 3) init[f.localName] = one(f, "message", undefined, f.message);
        break;
      case "list": {
        const n = depth < 3 ? rng.int(4) : 0;
        init[f.localName] = Array.from({ length: n }, () => one(f, f.listKind, f.scalar, f.message));
        break;
      }
      case "map": {
        const n = depth < 3 ? rng.int(3) : 0;
        const map: Record<string, unknown> = {};
        for (let i = 0; i < n; i++) map[String(scalarValue(rng, f.mapKey))] = one(f, f.mapKind, f.scalar, f.message);
        init[f.localName] = map;
        break;
      }
    }
  }
  return init;
}

/** A valid message of `desc`, encoded by protobuf-es (the reference encoder). */
export function validMessage(desc: DescMessage, rng: Rng, shape?: Shape): Uint8Array {
  return toBinary(desc, create(desc, randomMessage(desc, rng, shape) as never));
}

// ---- the wire format, read leniently ---------------------------------------------------------

/** One top-level field of a message as the bytes have it (positions into those bytes). */
interface RawField {
  start: number;
  /** Where the value starts (after the tag). */
  value: number;
  end: number;
  no: number;
  wire: number;
}

function readVarint(b: Uint8Array, at: number): [value: number, next: number] | undefined {
  let v = 0;
  for (let i = 0; i < 10; i++) {
    if (at + i >= b.length) return undefined;
    const byte = b[at + i]!;
    if (i < 5) v += (byte & 0x7f) * 2 ** (7 * i);
    if (byte < 0x80) return [v, at + i + 1];
  }
  return undefined;
}

/** The top-level fields, as far as they parse (a mutated message's tail may not). */
function fieldsOf(b: Uint8Array): RawField[] {
  const out: RawField[] = [];
  let at = 0;
  while (at < b.length) {
    const tag = readVarint(b, at);
    if (!tag) break;
    const [t, value] = tag;
    const wire = t % 8;
    let end: number;
    if (wire === 0) end = readVarint(b, value)?.[1] ?? -1;
    else if (wire === 1) end = value + 8;
    else if (wire === 5) end = value + 4;
    else if (wire === 2) {
      const len = readVarint(b, value);
      end = len ? len[1] + len[0] : -1;
    } else end = value;
    if (end < 0 || end > b.length) break;
    out.push({ start: at, value, end, no: Math.floor(t / 8), wire });
    at = end;
  }
  return out;
}

export function varint(v: number | bigint): Uint8Array {
  if (typeof v === "number" && v >= 0 && v < 2 ** 31) {
    const out: number[] = [];
    for (; v > 0x7f; v >>>= 7) out.push((v & 0x7f) | 0x80);
    out.push(v);
    return Uint8Array.from(out);
  }
  let n = BigInt.asUintN(64, BigInt(v));
  const out: number[] = [];
  while (n > 0x7fn) {
    out.push(Number(n & 0x7fn) | 0x80);
    n >>= 7n;
  }
  out.push(Number(n));
  return Uint8Array.from(out);
}

const tag = (no: number, wire: number) => varint(no * 8 + wire);

function concat(parts: Uint8Array[]): Uint8Array {
  return new Uint8Array(Buffer.concat(parts.map((p) => Buffer.from(p.buffer, p.byteOffset, p.byteLength))));
}

const splice = (b: Uint8Array, at: number, remove: number, insert: Uint8Array) => concat([b.subarray(0, at), insert, b.subarray(at + remove)]);

/** `piece` `times` times over, in one allocation. */
const repeat = (piece: Uint8Array, times: number) =>
  piece.length === 0 || times <= 0 ? new Uint8Array() : new Uint8Array(Buffer.alloc(piece.length * times, Buffer.from(piece)));

// ---- mutators --------------------------------------------------------------------------------

export interface MutateContext {
  /** The message type the bytes are meant to be (nested bombs and splices use its field numbers). */
  desc?: DescMessage;
  /** Another valid message, for splices. */
  donor?: () => Uint8Array;
  limits: Limits;
}

export type Mutator = (rng: Rng, b: Uint8Array, ctx: MutateContext) => Uint8Array;

const INTERESTING = [0x00, 0x01, 0x02, 0x07, 0x08, 0x0a, 0x7f, 0x80, 0x81, 0xc0, 0xc3, 0xe0, 0xed, 0xf0, 0xf4, 0xff];

/** Field numbers no message of ours uses: what a newer peer would send, skipped when decoding. */
const UNKNOWN_FIELD = [1000, 536870911, 19000, 99];

/** A message field of `desc`, or a number past its fields. */
const messageFieldNo = (rng: Rng, desc: DescMessage | undefined) => {
  const nested = desc?.fields.filter((f) => f.message !== undefined) ?? [];
  return nested.length > 0 && rng.chance(0.8) ? rng.pick(nested).number : rng.pick(UNKNOWN_FIELD);
};

export const MUTATORS: Record<string, Mutator> = {
  flipBits(rng, b) {
    if (b.length === 0) return b;
    const out = Uint8Array.from(b);
    for (let n = rng.range(1, 8); n > 0; n--) out[rng.int(out.length)]! ^= 1 << rng.int(8);
    return out;
  },
  setByte(rng, b) {
    if (b.length === 0) return b;
    const out = Uint8Array.from(b);
    for (let n = rng.range(1, 4); n > 0; n--) out[rng.int(out.length)] = rng.pick(INTERESTING);
    return out;
  },
  insertBytes(rng, b) {
    return splice(b, rng.int(b.length + 1), 0, rng.chance(0.5) ? rng.bytes(rng.range(1, 16)) : Uint8Array.of(rng.pick(INTERESTING)));
  },
  deleteBytes(rng, b) {
    if (b.length === 0) return b;
    const at = rng.int(b.length);
    return splice(b, at, rng.range(1, Math.min(16, b.length - at)), new Uint8Array());
  },
  truncate(rng, b) {
    return b.subarray(0, rng.int(b.length + 1));
  },
  duplicate(rng, b, ctx) {
    if (b.length === 0) return b;
    const from = rng.int(b.length);
    const piece = b.subarray(from, from + rng.range(1, 64));
    const times = Math.min(rng.pick([1, 2, 16, 1000]), Math.floor(Math.max(0, ctx.limits.maxBytes - b.length) / piece.length));
    return concat([b, repeat(piece, times)]);
  },
  /** A varint longer than 10 bytes, or one past 64 bits, as a field value or as a tag. */
  varintOverflow(rng, b) {
    const fields = fieldsOf(b);
    const bad = rng.pick([
      new Uint8Array(11).fill(0xff),
      Uint8Array.from([...new Array(9).fill(0xff), 0x7f]), // 10 bytes, bits past the 64th set
      Uint8Array.from([...new Array(9).fill(0x80), 0x02]),
      new Uint8Array(rng.range(1, 20)).fill(0x80), // never ends
    ]);
    const f = fields.length > 0 && rng.chance(0.7) ? rng.pick(fields) : undefined;
    if (f && f.wire === 0) return splice(b, f.value, f.end - f.value, bad);
    const at = f ? f.start : rng.int(b.length + 1);
    return splice(b, at, 0, rng.chance(0.5) ? bad : concat([tag(f?.no ?? rng.range(1, 30), 0), bad]));
  },
  /** A field's tag rewritten with another wire type (groups and the unused 6 and 7 included). */
  wrongWireType(rng, b) {
    const fields = fieldsOf(b);
    if (fields.length === 0) return concat([b, tag(rng.range(1, 20), rng.pick([1, 2, 3, 4, 5, 6, 7])), rng.bytes(4)]);
    const f = rng.pick(fields);
    const others = [0, 1, 2, 3, 4, 5, 6, 7].filter((w) => w !== f.wire);
    return splice(b, f.start, f.value - f.start, tag(f.no, rng.pick(others)));
  },
  /** A length-delimited field that claims more than there is, up to 4 GiB. */
  hugeLength(rng, b) {
    const len = rng.pick([0xffffffff, 0x7fffffff, 0x80000000, 0x10000000, b.length + 1, b.length + rng.range(2, 100)]);
    const delimited = fieldsOf(b).filter((f) => f.wire === 2);
    if (delimited.length === 0) return concat([b, tag(rng.range(1, 20), 2), varint(len), rng.bytes(rng.int(8))]);
    const f = rng.pick(delimited);
    const old = readVarint(b, f.value)!;
    return splice(b, f.value, old[1] - f.value, varint(len));
  },
  /** Message fields nested in themselves far past any decoder's recursion limit, or groups that are. */
  nestedBomb(rng, b, ctx) {
    const depth = rng.pick([99, 100, 101, 102, 1000, 100_000]);
    if (rng.chance(0.5)) {
      // Start-group tags, closed or not: skipped as unknown fields, they recurse in every decoder.
      const no = rng.chance(0.5) ? rng.pick(UNKNOWN_FIELD) : rng.range(1, 20);
      const open = tag(no, 3);
      const n = Math.min(depth, Math.floor(ctx.limits.maxBytes / (2 * open.length)));
      return concat([b, repeat(open, n), rng.chance(0.7) ? repeat(tag(no, 4), n) : new Uint8Array()]);
    }
    // A length-delimited field around the message, around that, and so on: the sizes from the inside
    // out, then every level's tag and length written from the outside in, into one buffer.
    const t = tag(messageFieldNo(rng, ctx.desc), 2);
    const inner = b.length > 64 ? b.subarray(0, 64) : b;
    const sizes = [inner.length];
    while (sizes.length <= depth) {
      const next = t.length + varint(sizes.at(-1)!).length + sizes.at(-1)!;
      if (next > ctx.limits.maxBytes) break;
      sizes.push(next);
    }
    const out = new Uint8Array(sizes.at(-1)!);
    let at = 0;
    for (let level = sizes.length - 1; level >= 1; level--) {
      out.set(t, at);
      at += t.length;
      const len = varint(sizes[level - 1]!);
      out.set(len, at);
      at += len.length;
    }
    out.set(inner, at);
    return out;
  },
  /** Many small unknown fields: cheap to skip, but a decoder that keeps them allocates per field. */
  wideBomb(rng, b, ctx) {
    const one = concat([tag(rng.pick(UNKNOWN_FIELD), rng.pick([0, 2, 5])), Uint8Array.of(0, 0, 0, 0)]);
    const n = Math.floor((ctx.limits.maxBytes - b.length) / one.length);
    return concat([b, repeat(one, Math.min(n, rng.pick([100, 10_000, 1_000_000])))]);
  },
  /** The head of this message and the tail of another of the same type. */
  splice(rng, b, ctx) {
    const donor = ctx.donor?.() ?? rng.bytes(rng.int(32));
    return concat([b.subarray(0, rng.int(b.length + 1)), donor.subarray(rng.int(donor.length + 1))]);
  },
  randomBytes(rng, _b, ctx) {
    return rng.bytes(rng.chance(0.8) ? rng.int(64) : rng.int(Math.min(ctx.limits.maxBytes, 4096)));
  },
};

const MUTATOR_NAMES = Object.keys(MUTATORS);

/** One to three mutations of `bytes`, and their names (for the report). */
export function mutate(rng: Rng, bytes: Uint8Array, ctx: MutateContext): { bytes: Uint8Array; applied: string[] } {
  const applied: string[] = [];
  let b = bytes;
  for (let n = rng.pick([1, 1, 1, 2, 3]); n > 0; n--) {
    const name = rng.pick(MUTATOR_NAMES);
    b = MUTATORS[name]!(rng, b, ctx);
    applied.push(name);
  }
  return { bytes: b, applied };
}

/**
 * A message for `desc` as a fuzz case sends it: valid as generated (a fifth of cases, so the happy
 * paths are exercised too), else mutated from a valid one.
 */
export function fuzzMessage(desc: DescMessage, rng: Rng, limits: Limits, shape?: Shape): { bytes: Uint8Array; applied: string[] } {
  const seed = validMessage(desc, rng, shape);
  if (rng.chance(0.2)) return { bytes: seed, applied: [] };
  return mutate(rng, seed, { desc, donor: () => validMessage(desc, rng, shape), limits });
}

// ---- gRPC's envelope -------------------------------------------------------------------------

export interface Envelope {
  body: Buffer;
  /** What was done to it ("valid" when nothing). */
  kind: string;
  /** Whether it is exactly one uncompressed message whose declared length is its own. */
  valid: boolean;
}

const frame = (flags: number, length: number, message: Uint8Array): Buffer => {
  const b = Buffer.alloc(5 + message.byteLength);
  b[0] = flags;
  b.writeUInt32BE(length >>> 0, 1);
  b.set(message, 5);
  return b;
};

/** `message` behind the 5-byte envelope, mostly as it should be, else with the envelope corrupted. */
export function envelope(rng: Rng, message: Uint8Array): Envelope {
  const n = message.byteLength;
  const variants: [string, () => Buffer][] = [
    ["compressed flag", () => frame(1, n, message)],
    ["other flag bits", () => frame(rng.pick([0x02, 0x80, 0xfe, 0xff]), n, message)],
    ["length too long", () => frame(0, n + rng.range(1, 5), message)],
    ["length too short", () => frame(0, Math.max(0, n - rng.range(1, 5)), message)],
    ["length huge", () => frame(0, rng.pick([0xffffffff, 0x7fffffff, 64 * 1024 * 1024, 16 * 1024 * 1024 + 1]), message)],
    ["length zero", () => frame(0, 0, message)],
    ["envelope cut short", () => frame(0, n, message).subarray(0, rng.int(5))],
    ["no envelope", () => Buffer.from(message)],
    ["no body", () => Buffer.alloc(0)],
    ["two messages", () => Buffer.concat([frame(0, n, message), frame(0, n, message)])],
    ["trailing bytes", () => Buffer.concat([frame(0, n, message), Buffer.from(rng.bytes(rng.range(1, 6)))])],
  ];
  if (rng.chance(0.75)) return { body: frame(0, n, message), kind: "valid", valid: true };
  const [kind, make] = rng.pick(variants);
  const body = make();
  // Some corruptions of an empty message are none ("length too short" of zero bytes).
  return { body, kind, valid: body.length >= 5 && body[0] === 0 && body.readUInt32BE(1) === body.length - 5 };
}

/** The body as the DATA frames carry it: one write, or a few pieces (a byte at a time, at worst). */
export function chunked(rng: Rng, body: Buffer): Buffer[] {
  if (body.length < 2 || rng.chance(0.7)) return [body];
  const out: Buffer[] = [];
  const cut = rng.chance(0.2) ? 1 : rng.range(1, Math.max(1, Math.floor(body.length / 2)));
  for (let at = 0; at < body.length && out.length < 64; at += cut) out.push(body.subarray(at, out.length === 63 ? body.length : at + cut));
  return out;
}

/** Bytes as hex for a report, cut at `max` bytes. */
export function hex(b: Uint8Array, max = 512): string {
  const s = Buffer.from(b.buffer, b.byteOffset, Math.min(b.byteLength, max)).toString("hex");
  return b.byteLength > max ? `${s}… (${b.byteLength} bytes)` : s;
}
