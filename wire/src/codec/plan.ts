/**
 * The compiled codec's per-message plan (./compile.ts makes it, ./fields.ts fills it): how each
 * field is sized, written and read, and the walks over a message's fields that use them.
 */
import type { DescField } from "@bufbuild/protobuf";
import { type Reader, varint32Size, type Writer } from "./binary.js";

/** proto3's implicit presence (FeatureSet.FieldPresence.IMPLICIT): a zero value is not written. */
export const IMPLICIT = 2;

export type Msg = Record<string, any>;

/** How one field (or one member of a oneof) is sized and written. */
export interface FieldWriter {
  size(m: Msg, lens: number[]): number;
  write(m: Msg, w: Writer): void;
}

/** How one field number is read into a message. */
export type FieldReader = (r: Reader, wire: number, m: Msg, depth: number) => void;

export interface Plan {
  zero: () => Msg;
  writers: FieldWriter[];
  readers: (FieldReader | undefined)[];
}

export function sizeOf(plan: Plan, m: Msg, lens: number[]): number {
  let n = 0;
  for (const f of plan.writers) n += f.size(m, lens);
  return n;
}

export function writeOf(plan: Plan, m: Msg, w: Writer): void {
  for (const f of plan.writers) f.write(m, w);
}

const MAX_DEPTH = 100;

export function readInto(plan: Plan, r: Reader, end: number, m: Msg, depth: number): void {
  if (depth > MAX_DEPTH) throw new Error("maximum recursion depth reached");
  while (r.pos < end) {
    const tag = r.tag();
    const no = tag >>> 3;
    const wire = tag & 7;
    const read = plan.readers[no];
    if (read) read(r, wire, m, depth);
    else r.skip(wire, no);
  }
  if (r.pos !== end) throw new Error("premature end of message");
}

/** Reads one nested message (length-delimited) into target, or into a new zero message. */
export function readNested(plan: Plan, r: Reader, target: Msg | undefined, depth: number): Msg {
  const end = r.delimited();
  const m = target ?? plan.zero();
  readInto(plan, r, end, m, depth + 1);
  return m;
}

export function nestedSize(plan: Plan, v: Msg, lens: number[]): number {
  const at = lens.push(0) - 1;
  const n = sizeOf(plan, v, lens);
  lens[at] = n;
  return varint32Size(n) + n;
}

export function nestedWrite(plan: Plan, v: Msg, w: Writer): void {
  w.varint32(w.nextLen());
  writeOf(plan, v, w);
}

export function tagOf(no: number, wire: number): { tag: number; tagSize: number } {
  const tag = ((no << 3) | wire) >>> 0;
  return { tag, tagSize: varint32Size(tag) };
}

export function expectWire(f: DescField, got: number, want: number): void {
  if (got !== want) throw new Error(`field ${f.parent.typeName}.${f.name} (${f.number}) has wire type ${got}, expected ${want}`);
}
