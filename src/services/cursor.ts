/** Opaque page tokens for keyset paging: base64url JSON of the last row's sort key. */
import type { z } from "zod";
import { invalidArgument } from "../domain/errors.js";

export function encodeCursor(key: Record<string, string | number>): string {
  return Buffer.from(JSON.stringify(key)).toString("base64url");
}

export function decodeCursor<S extends z.ZodTypeAny>(token: string, schema: S, field = "page_token"): z.infer<S> {
  let raw: unknown;
  try {
    raw = JSON.parse(Buffer.from(token, "base64url").toString("utf8"));
  } catch {
    raw = undefined;
  }
  const parsed = schema.safeParse(raw);
  if (!parsed.success) throw invalidArgument(field, "is not a token this daemon issued; start again without it");
  return parsed.data;
}
