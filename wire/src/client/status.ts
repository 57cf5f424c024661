/**
 * How a gRPC reply's status is read from its headers (a trailers-only reply) or its trailers, as the
 * gRPC spec has it rather than as connect's findTrailerError does:
 * - grpc-status decides: 0 is success whatever else is there, so grpc-status-details-bin (which an
 *   empty value would decode to code 0) can add details to an error but never turn it into success;
 * - grpc-message is percent-decoded as the spec says (../grpc/message.ts): a '%' that starts no %XX
 *   is kept and bytes that are not UTF-8 become U+FFFD (the spec says a client must not throw the
 *   status away for a bad message), where decodeURIComponent would throw and lose the code.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { decodeGrpcMessage } from "../grpc/message.js";
import {
  codeFromHttpStatus,
  findTrailerError,
  headerGrpcMessage,
  headerGrpcStatus,
  headerStatusDetailsBin,
  parseContentType,
} from "@connectrpc/connect/protocol-grpc";

/** The error a reply's HTTP status and content type say, before its status is looked at. */
export function responseError(httpStatus: number, header: Headers): ConnectError | undefined {
  if (httpStatus !== 200) return new ConnectError(`HTTP ${httpStatus}`, codeFromHttpStatus(httpStatus), header);
  const type = header.get("content-type");
  if (parseContentType(type) === undefined) return new ConnectError(`unsupported content type ${type}`, Code.Unknown);
  return undefined;
}

/** The error in a status-bearing header set (undefined for OK or no status at all). */
export function statusError(h: Headers): ConnectError | undefined {
  const status = h.get(headerGrpcStatus);
  if (status === null || status === "0") return undefined;
  const code = /^\d{1,2}$/.test(status) ? Number(status) : -1;
  if (!(code in Code)) return new ConnectError(`invalid grpc-status: ${status}`, Code.Internal, h);
  const err = new ConnectError(decodeGrpcMessage(h.get(headerGrpcMessage) ?? ""), code, h);
  err.details = detailsOf(h);
  return err;
}

/** The details grpc-status-details-bin carries, when it decodes to a google.rpc.Status with any. */
function detailsOf(h: Headers): ConnectError["details"] {
  const bin = h.get(headerStatusDetailsBin);
  if (!bin) return [];
  try {
    return findTrailerError(new Headers({ [headerStatusDetailsBin]: bin }))?.details ?? [];
  } catch {
    return [];
  }
}
