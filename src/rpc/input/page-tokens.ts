/** Opaque page tokens for keyset paging: base64url JSON of the last row's sort key. */
import { z } from "zod";
import { invalidArgument } from "../../domain/errors.js";

export function encodeCursor(key: Record<string, string | number>): string {
  return Buffer.from(JSON.stringify(key)).toString("base64url");
}

/**
 * The key a token names. Beyond its schema, every number must be a safe integer within what a
 * timestamp column holds and every string short and free of control characters: a forged token
 * is refused here, not by the database as an error in its statement.
 */
export function decodeCursor<S extends z.ZodTypeAny>(token: string, schema: S, field = "page_token"): z.infer<S> {
  let raw: unknown;
  try {
    raw = token.length <= MAX_TOKEN_CHARS ? JSON.parse(Buffer.from(token, "base64url").toString("utf8")) : undefined;
  } catch {
    raw = undefined;
  }
  const parsed = plausible(raw) ? schema.safeParse(raw) : undefined;
  if (!parsed?.success) throw invalidArgument(field, "is not a token this daemon issued; start again without it");
  return parsed.data;
}

const MAX_TOKEN_CHARS = 2048;
/** The largest epoch milliseconds a Date (and so timestamptz as we bind it) holds. */
const MAX_MS = 8.64e15;

function plausible(raw: unknown): boolean {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) return false;
  return Object.values(raw).every((v) =>
    typeof v === "number" ? Number.isSafeInteger(v) && Math.abs(v) <= MAX_MS : typeof v === "string" ? v.length <= 256 && !/[\u0000-\u001f]/.test(v) : false,
  );
}

/**
 * A page token naming the last (tenant, key) of a listing by key. decodeCursor takes strings of at
 * most 256 characters, and a key may have 512: it rides in two parts.
 */
const PART = 256;
const keyCursor = z.object({ t: z.string(), k0: z.string(), k1: z.string() });

export function encodeKeyCursor(last: { tenant_key: string; key: string }): string {
  return encodeCursor({ t: last.tenant_key, k0: last.key.slice(0, PART), k1: last.key.slice(PART) });
}

export function decodeKeyCursor(token: string): { tenant: string; key: string } {
  const c = decodeCursor(token, keyCursor);
  return { tenant: c.t, key: c.k0 + c.k1 };
}
