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
import { wellFormed } from "@aiflow/wire/text";
import { interpretDbError } from "../db/errors.js";
import { OutageLog } from "../db/outage-log.js";
import { AppError, type ErrorKind } from "../domain/errors.js";
import type { Logger } from "../log.js";

/** How soon a client may retry a call the database's absence failed. */
export const RETRY_PUSHBACK_MS = 250;

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
  if (err instanceof ConnectError) {
    // A message every client can be sent: a lone surrogate (cutting caller text by UTF-16 index can
    // leave one) cannot be percent-encoded into grpc-message, and the call would end without a status.
    const message = wellFormed(err.rawMessage);
    if (message === err.rawMessage) return err;
    const fixed = new ConnectError(message, err.code, err.metadata);
    fixed.details = err.details;
    return fixed;
  }
  if (err instanceof AppError) {
    if (err.kind !== "unavailable") return new ConnectError(wellFormed(err.message), CODES[err.kind]);
    outage.note(err, { method });
    // The daemon is up and says when to try again (gRPC's retry pushback): a client can tell this
    // from a daemon it cannot reach, and come back within moments of the database.
    return new ConnectError(err.message, Code.Unavailable, { "grpc-retry-pushback-ms": String(RETRY_PUSHBACK_MS) });
  }
  const mapped = interpretDbError(err);
  if (mapped instanceof AppError) return toConnectError(mapped, log, outage, method);
  const ref = randomUUID();
  log.error({ err, method, ref }, "unexpected error in handler");
  return new ConnectError(`internal error (ref ${ref})`, Code.Internal);
}

export function errorInterceptor(log: Logger): Interceptor {
  const outage = new OutageLog(log, "database unavailable: answered UNAVAILABLE");
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
