/**
 * A webhook body: whether it is a payload (the JSON check StartRun's text gets, one place:
 * ../domain/json-text.ts), and what of it a firing row keeps.
 *
 * What must stay true:
 * - A body whose signature proved the trigger's secret is kept whole: as it came when Postgres can
 *   store that text (UTF-8 without NUL), else as `{"body":{"bytes","sha256","base64"}}`, so the
 *   insert of the evidence can never fail on the evidence.
 * - A body that proved nothing (no or a bad signature, an unknown trigger, a replay or stale
 *   signed time) is kept as `{"unverified_body":{"bytes","sha256","first_1024_bytes"}}`: its size
 *   and digest whole, its text only up to UNVERIFIED_PREFIX_BYTES (cut on a character, written out
 *   by JSON.stringify, so a NUL or a stray byte is an escape, never the raw character). Whoever sent
 *   it, the row stays about a KiB.
 */
import { isUtf8 } from "node:buffer";
import { AppError } from "../domain/errors.js";
import { jsonText } from "../domain/json-text.js";
import { FiringRefused } from "./firer.js";
import { digestHex } from "./signature.js";

/** Bytes of a body that proved nothing kept in its firing row. */
export const UNVERIFIED_PREFIX_BYTES = 1024;

/**
 * The body as a payload: its text and value (null for an empty body). Throws a `bad_body`
 * FiringRefused naming why and where (never quoting the text) when it is not UTF-8 or not JSON
 * that the check above accepts.
 */
export function parseBody(body: Buffer, maxBytes: number): { text: string; payload: unknown } {
  if (!isUtf8(body)) throw new FiringRefused("bad_body", "the body is not UTF-8");
  const text = body.toString("utf8");
  let checked: string | null;
  try {
    checked = jsonText(text, "the body", maxBytes);
  } catch (err) {
    if (!(err instanceof AppError)) throw err;
    // "the body: is not valid JSON: … at position N", or over the size once exponents are written out.
    throw new FiringRefused(err.kind === "resource_exhausted" ? "too_large" : "bad_body", err.message.replace(/^the body: /, "the body "));
  }
  return { text, payload: checked === null ? null : JSON.parse(checked) };
}

/** What a firing keeps of a body whose signature proved the secret: all of it. */
export function verifiedPayload(body: Buffer): string | null {
  if (body.length === 0) return null;
  if (isUtf8(body) && !body.includes(0)) return body.toString("utf8");
  return JSON.stringify({ body: { bytes: body.length, sha256: digestHex(body), base64: body.toString("base64") } });
}

/** What a firing keeps of a body that proved nothing: its size, digest and first KiB. */
export function unverifiedPayload(body: Buffer | null): string | null {
  if (body === null || body.length === 0) return null;
  let end = Math.min(body.length, UNVERIFIED_PREFIX_BYTES);
  // Back off a UTF-8 continuation byte, so the cut does not split a character.
  while (end < body.length && end > 0 && (body[end]! & 0xc0) === 0x80) end--;
  return JSON.stringify({ unverified_body: { bytes: body.length, sha256: digestHex(body), first_1024_bytes: body.subarray(0, end).toString("utf8") } });
}
