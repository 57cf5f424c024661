/**
 * The one place database errors become domain errors. Stores let driver errors propagate to
 * `withDbErrors`, which turns what a caller can act on into an AppError and leaves the rest as they
 * are (they surface as INTERNAL, with the cause logged).
 */
import {
  CheckIntegrityConstraintViolationError,
  ConnectionError,
  ForeignKeyIntegrityConstraintViolationError,
  NotNullIntegrityConstraintViolationError,
  UniqueIntegrityConstraintViolationError,
} from "slonik";
import { AppError } from "../domain/errors.js";

export function interpretDbError(err: unknown): unknown {
  if (err instanceof UniqueIntegrityConstraintViolationError)
    return new AppError("already_exists", `already exists (${err.constraint})`, { cause: err });
  if (err instanceof ForeignKeyIntegrityConstraintViolationError || err instanceof NotNullIntegrityConstraintViolationError || err instanceof CheckIntegrityConstraintViolationError)
    return new AppError("invalid_argument", `rejected by the database (${(err as { constraint?: string }).constraint ?? "constraint"})`, { cause: err });
  if (err instanceof ConnectionError) return new AppError("unavailable", "database unavailable, retry shortly", { cause: err });
  const code = (err as { cause?: { code?: string }; code?: string })?.cause?.code ?? (err as { code?: string })?.code;
  if (code === "57P01" || code === "08006" || code === "08001" || code === "ECONNREFUSED" || code === "ECONNRESET")
    return new AppError("unavailable", "database unavailable, retry shortly", { cause: err });
  // pg's own client-side timeouts carry no code, only these messages.
  const message = (err as { message?: unknown })?.message;
  if (message === "Query read timeout" || message === "Connection terminated due to connection timeout")
    return new AppError("unavailable", "database did not answer in time, retry shortly", { cause: err });
  return err;
}

/** The SQLSTATE of a database error (slonik's or pg's), or undefined. */
export function sqlState(err: unknown): string | undefined {
  for (let e = err as { code?: unknown; cause?: unknown } | undefined, depth = 0; e && depth < 4; e = e.cause as typeof e, depth++)
    if (typeof e.code === "string" && /^[0-9A-Z]{5}$/.test(e.code)) return e.code;
  return undefined;
}

/**
 * Whether the database refused a statement for the data in it (SQLSTATE classes 22, data exception,
 * and 23, integrity constraint violation): the same statement with other rows may succeed. Anything
 * else (the database away, slow, or a bug) is not the rows' fault.
 */
export function refusedForContent(err: unknown): boolean {
  const state = sqlState(err);
  return state !== undefined && (state.startsWith("22") || state.startsWith("23"));
}

export async function withDbErrors<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw interpretDbError(err);
  }
}
