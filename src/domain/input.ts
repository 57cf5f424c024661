/**
 * Input validation, at the edge and wherever domain code takes input (the engines' plans, the queue):
 * every failure is INVALID_ARGUMENT naming the field, raised before anything is written, so a refused
 * call changes nothing. Nothing here knows the caller: a name the caller may act as is
 * ../rpc/input/validate.ts's agentName.
 */
import { durationMs, type Duration } from "@bufbuild/protobuf/wkt";
import { invalidArgument, resourceExhausted } from "./errors.js";
import { isIdentifierText } from "./names.js";

/** Agent names, tenant keys, engine kinds and similar identifiers: trimmed, 1-128 of [A-Za-z0-9._:-]. */
export function identifier(raw: string, field: string): string {
  const v = raw.trim();
  if (v.length === 0) throw invalidArgument(field, "is required");
  if (v.length > 128) throw invalidArgument(field, `is ${v.length} characters; the limit is 128`);
  if (!isIdentifierText(v)) throw invalidArgument(field, `'${v.slice(0, 40)}' may only contain letters, digits and . _ : -`);
  return v;
}

/**
 * Control characters other than tab, newline and carriage return. Postgres cannot store NUL in text or
 * jsonb at all, so one such character in a buffered write (a heartbeat's disk mount) would fail the
 * whole statement; the rest have no business in names, addresses or messages either.
 */
const CONTROL = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/;

/** An optional free-text field: empty becomes null; too long, or holding control characters, is refused. */
export function optionalText(raw: string, field: string, max = 1024): string | null {
  const v = raw.trim();
  if (v.length > max) throw invalidArgument(field, `is ${v.length} characters; the limit is ${max}`);
  const bad = CONTROL.exec(v);
  if (bad)
    throw invalidArgument(field, `holds control character U+${bad[0].charCodeAt(0).toString(16).toUpperCase().padStart(4, "0")} at position ${bad.index}`);
  return v.length === 0 ? null : v;
}

export function identifiers(raw: readonly string[], field: string): string[] {
  return [...new Set(raw.map((r, i) => identifier(r, `${field}[${i}]`)))];
}

/** A finite number within [min, max]. */
export function inRange(v: number, field: string, min: number, max: number): number {
  if (!Number.isFinite(v) || v < min || v > max) throw invalidArgument(field, `${v} is outside ${min}..${max}`);
  return v;
}

/** Refuses a value (text, or anything as JSON) larger than the cap with RESOURCE_EXHAUSTED. */
export function withinBytes(value: unknown, field: string, maxBytes: number): void {
  const size = Buffer.byteLength(typeof value === "string" ? value : (JSON.stringify(value) ?? ""));
  if (size > maxBytes) throw resourceExhausted(`${field} is ${size} bytes; the limit is ${maxBytes} bytes`);
}

/** The latest instant an epoch-nanosecond int8 column holds (2262-04-11), in seconds. */
const MAX_EPOCH_SECONDS = 9_223_372_035n;

/**
 * A Timestamp the engine can store as epoch nanoseconds: from 1970 to 2262, nanos within a second.
 * Returns epoch milliseconds.
 */
export function storableTimestamp(t: { seconds: bigint; nanos: number }, field: string): number {
  if (t.seconds < 0n || t.seconds > MAX_EPOCH_SECONDS) throw invalidArgument(field, `${t.seconds} s is outside 1970..2262 (what epoch nanoseconds can hold)`);
  if (!Number.isInteger(t.nanos) || t.nanos < 0 || t.nanos > 999_999_999) throw invalidArgument(field, `nanos ${t.nanos} is outside 0..999999999`);
  return Number(t.seconds) * 1000 + Math.floor(t.nanos / 1_000_000);
}

/** The longest delay a caller may ask for (a retry's, a drain's deadline): beyond it is a mistake, and past epoch-ns bigint an overflow. */
export const MAX_DELAY_MS = 365 * 24 * 3600_000;

/** A delay in milliseconds: a negative one is none (0); one over MAX_DELAY_MS is INVALID_ARGUMENT naming the field. */
export function delayMs(d: Duration, field: string): number {
  const ms = durationMs(d);
  if (!Number.isFinite(ms) || ms > MAX_DELAY_MS) throw invalidArgument(field, `${d.seconds}s is more than the limit of 365 days`);
  return Math.max(0, ms);
}

/** A map of tag → value (selectors): at most `maxEntries`, keys identifiers, values short text. */
export function tagMap(raw: Record<string, string>, field: string, maxEntries = 64): Record<string, string> {
  const entries = Object.entries(raw);
  if (entries.length > maxEntries) throw invalidArgument(field, `has ${entries.length} entries; the limit is ${maxEntries}`);
  const out: Record<string, string> = {};
  for (const [k, v] of entries) out[identifier(k, `${field} key`)] = optionalText(v, `${field}[${k}]`, 256) ?? "";
  return out;
}

/**
 * Optional JSON text: empty is null; otherwise checked as ./json-text.ts describes (INVALID_ARGUMENT)
 * and at most `maxBytes` as stored (RESOURCE_EXHAUSTED). Returns the text as given.
 */
import { jsonText } from "./json-text.js";
export { jsonText as jsonOrNull } from "./json-text.js";

/** A JSON object given as text (a run's starting context or state), within `maxBytes`; empty: {}. */
export function jsonObject(raw: string, field: string, maxBytes: number): Record<string, unknown> {
  const text = jsonText(raw, field, maxBytes);
  if (text === null) return {};
  const v = JSON.parse(text) as unknown;
  if (v === null || typeof v !== "object" || Array.isArray(v)) throw invalidArgument(field, "must be a JSON object");
  return v as Record<string, unknown>;
}
