/**
 * A third opinion on protobuf bytes: whether they are a well-formed message of a type, by the wire
 * format's rules alone, without building anything. The fuzzers need it because neither decoder is a
 * neutral reference: protobuf-es reads some malformed input (it does not check that a nested message
 * or a map entry ends at its length, nor skip an unknown field inside a map entry, and reads a known
 * field of the wrong wire type as its own type), and the compiled codec is what is under test.
 *
 * Well-formed here means what the compiled codec promises to read (wire/src/codec/compile.ts):
 * - every tag a varint of at most 5 bytes that fits 32 bits, field number 1 or more, wire type 0–5;
 * - every other varint at most 10 bytes, a length one that fits 32 bits; every length-delimited
 *   part inside its parent;
 * - a known field in its own wire type (a repeated number also packed); strings valid UTF-8;
 * - nested messages and map entries (key 1, value 2, others skipped) well-formed in turn, ending
 *   exactly at their length; messages nested at most 100 deep, and groups (of unknown fields only,
 *   skipped whole) at most 100 deep inside each, start and end tags of the same number;
 * - no end-group tag outside a group.
 */
import { ScalarType, type DescField, type DescMessage } from "@bufbuild/protobuf";

const MAX_DEPTH = 100;
const utf8 = new TextDecoder("utf-8", { fatal: true });

class Malformed extends Error {}

/** Why `bytes` is not a well-formed `desc`, or undefined when it is. */
export function malformation(desc: DescMessage, bytes: Uint8Array): string | undefined {
  try {
    new Scan(bytes).message(desc, bytes.length, 0);
    return undefined;
  } catch (e) {
    if (e instanceof Malformed) return e.message;
    throw e;
  }
}

function wireOf(type: ScalarType): number {
  switch (type) {
    case ScalarType.DOUBLE:
    case ScalarType.FIXED64:
    case ScalarType.SFIXED64:
      return 1;
    case ScalarType.FLOAT:
    case ScalarType.FIXED32:
    case ScalarType.SFIXED32:
      return 5;
    case ScalarType.STRING:
    case ScalarType.BYTES:
      return 2;
    default:
      return 0;
  }
}

class Scan {
  pos = 0;
  constructor(readonly b: Uint8Array) {}

  fail(why: string): never {
    throw new Malformed(`${why} at byte ${this.pos}`);
  }

  varint(max = 10, what = "a varint"): number {
    let v = 0;
    for (let i = 0; i < max; i++) {
      if (this.pos >= this.b.length) this.fail(`${what} cut short`);
      const byte = this.b[this.pos++]!;
      v += (byte & 0x7f) * 2 ** (7 * i);
      if (byte < 0x80) return v;
    }
    return this.fail(`${what} longer than ${max} bytes`);
  }

  /** A length: at most 32 bits, as every decoder reads it. */
  length(): number {
    const n = this.varint(10, "a length");
    if (n >= 2 ** 32) this.fail("a length past 32 bits");
    return n;
  }

  tag(end: number): [no: number, wire: number] {
    const t = this.varint(5, "a tag");
    if (t >= 2 ** 32) this.fail("a tag past 32 bits");
    const no = Math.floor(t / 8);
    const wire = t % 8;
    if (no === 0) this.fail("field number 0");
    if (wire > 5) this.fail(`wire type ${wire}`);
    if (this.pos > end) this.fail("a tag past its message's end");
    return [no, wire];
  }

  /** Skips one value of `wire` (a group to its end tag). */
  value(wire: number, no: number, end: number, groups = 0): void {
    switch (wire) {
      case 0:
        this.varint();
        break;
      case 1:
        this.pos += 8;
        break;
      case 5:
        this.pos += 4;
        break;
      case 2: {
        const n = this.length();
        this.pos += n;
        break;
      }
      case 3:
        if (groups > MAX_DEPTH) this.fail("groups nested too deep");
        for (;;) {
          if (this.pos >= end) this.fail("a group without its end tag");
          const [n, w] = this.tag(end);
          if (w === 4) {
            if (n !== no) this.fail(`group ${no} ended by ${n}`);
            break;
          }
          this.value(w, n, end, groups + 1);
        }
        break;
      case 4:
        this.fail(`an end-group tag (field ${no}) outside a group`);
    }
    if (this.pos > end) this.fail("a value past its message's end");
  }

  /** A length-delimited part: its end, checked against the parent's. */
  delimited(end: number): number {
    const n = this.length();
    if (this.pos + n > end) this.fail("a length past its message's end");
    return this.pos + n;
  }

  message(desc: DescMessage, end: number, depth: number): void {
    if (depth > MAX_DEPTH) this.fail("messages nested too deep");
    while (this.pos < end) {
      const [no, wire] = this.tag(end);
      const f = desc.fields.find((x) => x.number === no);
      if (f) this.field(f, wire, end, depth);
      else this.value(wire, no, end);
    }
  }

  field(f: DescField, wire: number, end: number, depth: number): void {
    const want = (w: number) => {
      if (wire !== w) this.fail(`${f.name} in wire type ${wire}, not ${w}`);
    };
    switch (f.fieldKind) {
      case "scalar":
        want(wireOf(f.scalar));
        return this.scalar(f.scalar, end);
      case "enum":
        want(0);
        return this.value(0, f.number, end);
      case "message":
        want(2);
        return this.message(f.message, this.delimited(end), depth + 1);
      case "list": {
        if (f.listKind === "message") {
          want(2);
          return this.message(f.message, this.delimited(end), depth + 1);
        }
        const type = f.listKind === "enum" ? ScalarType.INT32 : f.scalar;
        const own = wireOf(type);
        if (own !== 2 && wire === 2) {
          const stop = this.delimited(end);
          while (this.pos < stop) this.scalar(type, stop);
          return;
        }
        want(own);
        return this.scalar(type, end);
      }
      case "map": {
        want(2);
        const stop = this.delimited(end);
        while (this.pos < stop) {
          const [no, w] = this.tag(stop);
          if (no === 1) {
            if (w !== wireOf(f.mapKey)) this.fail(`${f.name} key in wire type ${w}`);
            this.scalar(f.mapKey, stop);
          } else if (no === 2) {
            if (f.mapKind === "message") {
              if (w !== 2) this.fail(`${f.name} value in wire type ${w}`);
              this.message(f.message, this.delimited(stop), depth + 1);
            } else {
              const type = f.mapKind === "enum" ? ScalarType.INT32 : f.scalar;
              if (w !== wireOf(type)) this.fail(`${f.name} value in wire type ${w}`);
              this.scalar(type, stop);
            }
          } else this.value(w, no, stop);
        }
        return;
      }
    }
  }

  scalar(type: ScalarType, end: number): void {
    if (type !== ScalarType.STRING) return this.value(wireOf(type), 0, end);
    const stop = this.delimited(end);
    try {
      utf8.decode(this.b.subarray(this.pos, stop));
    } catch {
      this.fail("a string that is not UTF-8");
    }
    this.pos = stop;
  }
}
