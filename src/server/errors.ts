/**
 * The one place where errors become gRPC status codes. Domain errors carry their kind; a ConnectError
 * already has a code; a database error that escaped its store's mapping is mapped here by the one
 * database error map (the database away is UNAVAILABLE, logged as one warning line, at most one a
 * second); anything else is a bug and goes out as INTERNAL with a reference id, while the cause
 * goes to the log under the same id.
 */
import { randomUUID } from "node:crypto";
import { Code, ConnectError, type Interceptor, type StreamResponse, type UnaryResponse } from "@connectrpc/connect";
import type { DescMessage } from "@bufbuild/protobuf";
import { interpretDbError } from "../db/errors.js";
import { AppError, type ErrorKind } from "../domain/errors.js";
import type { Logger } from "../log.js";

const CODES: Record<ErrorKind, Code> = {
  invalid_argument: Code.InvalidArgument,
  not_found: Code.NotFound,
  already_exists: Code.AlreadyExists,
  failed_precondition: Code.FailedPrecondition,
  permission_denied: Code.PermissionDenied,
  unauthenticated: Code.Unauthenticated,
  resource_exhausted: Code.ResourceExhausted,
  unavailable: Code.Unavailable,
};

function toConnectError(err: unknown, log: Logger, outage: OutageLog, method: string): ConnectError {
  if (err instanceof ConnectError) return err;
  if (err instanceof AppError) {
    if (err.kind === "unavailable") outage.note(log, method, err);
    return new ConnectError(err.message, CODES[err.kind]);
  }
  const mapped = interpretDbError(err);
  if (mapped instanceof AppError) return toConnectError(mapped, log, outage, method);
  const ref = randomUUID();
  log.error({ err, method, ref }, "unexpected error in handler");
  return new ConnectError(`internal error (ref ${ref})`, Code.Internal);
}

/**
 * Calls answered UNAVAILABLE because the database is away: a warning line when the first comes, and
 * then at most one a second with how many came since, so an outage under load logs a few lines.
 */
class OutageLog {
  #lastAt = -Infinity;
  #since = 0;

  note(log: Logger, method: string, err: AppError): void {
    this.#since++;
    const now = performance.now();
    if (now - this.#lastAt < 1_000) return;
    this.#lastAt = now;
    const cause = err.cause instanceof Error ? err.cause.message : undefined;
    log.warn({ method, reason: err.message, cause, calls: this.#since }, "database unavailable: answered UNAVAILABLE");
    this.#since = 0;
  }
}

export function errorInterceptor(log: Logger): Interceptor {
  const outage = new OutageLog();
  return (next) => async (req) => {
    const method = `${req.service.typeName}/${req.method.name}`;
    let res: UnaryResponse<DescMessage, DescMessage> | StreamResponse<DescMessage, DescMessage>;
    try {
      res = await next(req);
    } catch (err) {
      throw toConnectError(err, log, outage, method);
    }
    if (!res.stream) return res;
    // A server stream fails while it is iterated, after next() returned: map those errors too.
    const inner = res.message;
    return {
      ...res,
      message: (async function* () {
        try {
          yield* inner;
        } catch (err) {
          throw toConnectError(err, log, outage, method);
        }
      })(),
    };
  };
}
