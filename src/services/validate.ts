/**
 * Input validation at the edge. Every failure is INVALID_ARGUMENT naming the field, raised before
 * anything is written, so a refused call changes nothing.
 */
import type { HandlerContext } from "@connectrpc/connect";
import { invalidArgument, resourceExhausted } from "../domain/errors.js";
import { assertAgent, callerOf, type Identity } from "../server/auth.js";

const NAME = /^[A-Za-z0-9._:-]+$/;

/** Whether `v` is made only of identifier characters (the tokens file's agent patterns use it too). */
export const isIdentifierText = (v: string): boolean => NAME.test(v);

/** Agent names, tenant keys, engine kinds and similar identifiers: trimmed, 1-128 of [A-Za-z0-9._:-]. */
export function identifier(raw: string, field: string): string {
  const v = raw.trim();
  if (v.length === 0) throw invalidArgument(field, "is required");
  if (v.length > 128) throw invalidArgument(field, `is ${v.length} characters; the limit is 128`);
  if (!NAME.test(v)) throw invalidArgument(field, `'${v.slice(0, 40)}' may only contain letters, digits and . _ : -`);
  return v;
}

/** An agent RPC's `name`: a valid identifier, and a name the caller's token may act as (PERMISSION_DENIED). */
export function agentName(raw: string, caller: HandlerContext | Identity): string {
  const name = identifier(raw, "name");
  assertAgent("roles" in caller ? caller : callerOf(caller), name);
  return name;
}

/** An optional free-text field: empty becomes null; too long is refused. */
export function optionalText(raw: string, field: string, max = 1024): string | null {
  const v = raw.trim();
  if (v.length > max) throw invalidArgument(field, `is ${v.length} characters; the limit is ${max}`);
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

/** Parses optional JSON text: empty is null; invalid JSON is INVALID_ARGUMENT. Returns the text. */
export function jsonOrNull(raw: string, field: string): string | null {
  if (raw.trim() === "") return null;
  try {
    JSON.parse(raw);
  } catch (err) {
    throw invalidArgument(field, `is not valid JSON (${(err as Error).message})`);
  }
  return raw;
}
