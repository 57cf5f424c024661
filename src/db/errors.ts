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

export async function withDbErrors<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw interpretDbError(err);
  }
}
