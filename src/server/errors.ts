/**
 * The one place where errors become gRPC status codes. Domain errors carry their kind; a ConnectError
 * already has a code; anything else is a bug or an outage and goes out as INTERNAL with a reference
 * id, while the cause goes to the log under the same id.
 */
import { randomUUID } from "node:crypto";
import { Code, ConnectError, type Interceptor, type StreamResponse, type UnaryResponse } from "@connectrpc/connect";
import type { DescMessage } from "@bufbuild/protobuf";
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

export function toConnectError(err: unknown, log: Logger, method: string): ConnectError {
  if (err instanceof ConnectError) return err;
  if (err instanceof AppError) return new ConnectError(err.message, CODES[err.kind]);
  const ref = randomUUID();
  log.error({ err, method, ref }, "unexpected error in handler");
  return new ConnectError(`internal error (ref ${ref})`, Code.Internal);
}

export function errorInterceptor(log: Logger): Interceptor {
  return (next) => async (req) => {
    const method = `${req.service.typeName}/${req.method.name}`;
    let res: UnaryResponse<DescMessage, DescMessage> | StreamResponse<DescMessage, DescMessage>;
    try {
      res = await next(req);
    } catch (err) {
      throw toConnectError(err, log, method);
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
          throw toConnectError(err, log, method);
        }
      })(),
    };
  };
}
