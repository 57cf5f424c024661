/**
 * Domain errors: what the stores and services throw when a request cannot be served. Each kind maps
 * to one gRPC code, in one place (server/errors.ts); the message is written for the person reading it.
 */
export type ErrorKind =
  | "invalid_argument"
  | "not_found"
  | "already_exists"
  | "failed_precondition"
  | "permission_denied"
  | "unauthenticated"
  | "resource_exhausted"
  | "unavailable";

export class AppError extends Error {
  constructor(
    readonly kind: ErrorKind,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "AppError";
  }
}

export const invalidArgument = (field: string, why: string) => new AppError("invalid_argument", `${field}: ${why}`);
export const notFound = (message: string) => new AppError("not_found", message);
export const failedPrecondition = (message: string) => new AppError("failed_precondition", message);
export const permissionDenied = (message: string) => new AppError("permission_denied", message);
export const resourceExhausted = (message: string) => new AppError("resource_exhausted", message);

/** A setting (flag or environment variable) with a bad value; the CLI prints it on one line and exits 2. */
export class ConfigError extends Error {
  constructor(
    readonly setting: string,
    message: string,
  ) {
    super(`invalid ${setting}: ${message}`);
    this.name = "ConfigError";
  }
}
