/**
 * The one place database errors become domain errors. Stores let driver errors propagate to
 * `withDbErrors`, which turns what a caller can act on into an AppError and leaves the rest as they
 * are (they surface as INTERNAL, with the cause logged).
 */
import {
  BackendTerminatedError,
  BackendTerminatedUnexpectedlyError,
  CheckIntegrityConstraintViolationError,
  ConnectionError,
  ForeignKeyIntegrityConstraintViolationError,
  NotNullIntegrityConstraintViolationError,
  UniqueIntegrityConstraintViolationError,
} from "slonik";
import { AppError } from "../domain/errors.js";

/**
 * SQLSTATEs after which the same statement can succeed shortly: the server shutting down or
 * restarting (57P01-57P03), out of connections (53300), a serialization failure or deadlock
 * (40001, 40P01); with class 08 (connection exceptions) they are UNAVAILABLE.
 */
const UNAVAILABLE_STATES: ReadonlySet<string> = new Set(["57P01", "57P02", "57P03", "53300", "40001", "40P01"]);

export function interpretDbError(err: unknown): unknown {
  if (err instanceof UniqueIntegrityConstraintViolationError) return new AppError("already_exists", `already exists (${err.constraint})`, { cause: err });
  if (
    err instanceof ForeignKeyIntegrityConstraintViolationError ||
    err instanceof NotNullIntegrityConstraintViolationError ||
    err instanceof CheckIntegrityConstraintViolationError
  )
    return new AppError("invalid_argument", `rejected by the database (${(err as { constraint?: string }).constraint ?? "constraint"})`, { cause: err });
  if (err instanceof ConnectionError || err instanceof BackendTerminatedError || err instanceof BackendTerminatedUnexpectedlyError)
    return new AppError("unavailable", "database unavailable, retry shortly", { cause: err });
  // The hot pool's statements (./prepared.ts) fail with pg's own errors, which carry only a SQLSTATE.
  const state = sqlState(err);
  if (state !== undefined) {
    const constraint = (err as { constraint?: string }).constraint ?? (err as { cause?: { constraint?: string } }).cause?.constraint;
    if (state === "23505") return new AppError("already_exists", `already exists (${constraint ?? "unique"})`, { cause: err });
    if (state.startsWith("23")) return new AppError("invalid_argument", `rejected by the database (${constraint ?? "constraint"})`, { cause: err });
    if (UNAVAILABLE_STATES.has(state) || state.startsWith("08")) return new AppError("unavailable", "database unavailable, retry shortly", { cause: err });
    if (state === "57014") return new AppError("unavailable", "database did not answer in time, retry shortly", { cause: err });
  }
  for (let e = err as { code?: unknown; message?: unknown; cause?: unknown } | undefined, depth = 0; e && depth < 4; e = e.cause as typeof e, depth++) {
    if (typeof e.code === "string" && SOCKET_CODES.has(e.code)) return new AppError("unavailable", "database unavailable, retry shortly", { cause: err });
    // pg's own client-side failures carry no code, only these messages.
    if (
      e.message === "Query read timeout" ||
      e.message === "Connection terminated due to connection timeout" ||
      (e as { name?: unknown }).name === "DatabaseSilentError"
    )
      return new AppError("unavailable", "database did not answer in time, retry shortly", { cause: err });
    if (typeof e.message === "string" && CLOSED_MESSAGES.some((m) => e.message === m))
      return new AppError("unavailable", "database unavailable, retry shortly", { cause: err });
  }
  return err;
}

/** Socket errors on the way to Postgres: it is down, restarting, or the path to it is. */
const SOCKET_CODES: ReadonlySet<string> = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EAI_AGAIN",
]);

/** What pg says when a connection closes under it (a server restart, a cut network path). */
const CLOSED_MESSAGES = ["Connection terminated unexpectedly", "Connection terminated", "Client has encountered a connection error and is not queryable"];

/**
 * The SQLSTATE of a database error, or undefined: the code of the server's error (it has a
 * severity, which a socket error's errno code such as EPIPE has not), found through the causes
 * that slonik's and our own errors wrap it in.
 */
export function sqlState(err: unknown): string | undefined {
  for (let e = err as { code?: unknown; severity?: unknown; cause?: unknown } | undefined, depth = 0; e && depth < 4; e = e.cause as typeof e, depth++)
    if (typeof e.code === "string" && typeof e.severity === "string" && /^[0-9A-Z]{5}$/.test(e.code)) return e.code;
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

/** The UNAVAILABLE error `err` means when it says the database is away (down, restarting, unreachable, silent); else undefined. */
export function databaseAway(err: unknown): AppError | undefined {
  const mapped = err instanceof AppError ? err : interpretDbError(err);
  return mapped instanceof AppError && mapped.kind === "unavailable" ? mapped : undefined;
}

export async function withDbErrors<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw interpretDbError(err);
  }
}
