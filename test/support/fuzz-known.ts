/**
 * Defects the fuzzers found that are written up and not yet fixed. A case they explain is still run
 * and reported (apart, as known), but does not fail the run; each has an it.fails spec in the fuzz
 * tests that starts passing, and so must be removed from here, when the defect is fixed.
 */
import http2 from "node:http2";
import { Code } from "@connectrpc/connect";
import type { ReplyCase } from "./fuzz-client.js";
import type { Answer, RequestCase } from "./fuzz-daemon.js";

/** The longest delay Node's timers hold; a longer one fires after 1 ms (TimeoutOverflowWarning). */
export const TIMER_MAX_MS = 2 ** 31 - 1;

export const KNOWN = {
  /**
   * A grpc-timeout that parses to more than TIMER_MAX_MS (597H, 35792M, 2147484S: past about 24.8 days)
   * is armed with setTimeout as is in connect-node, so the call is cut DEADLINE_EXCEEDED after 1 ms
   * instead of running. (The direct path, wire/src/server/call.ts, runs such a call without a timer.)
   */
  deadlineOverflow: "a grpc-timeout past 2^31-1 ms fires after 1 ms",
  /**
   * An error message with a lone surrogate in it cannot be sent: connect's setTrailerStatus puts it
   * through encodeURIComponent, which throws URIError. The handlers' refusals are made sendable at the
   * error seam (src/server/errors.ts: the half pair becomes U+FFFD); what is left is connect-node's
   * own decoding error, made before any interceptor: JSON.parse's "Unexpected token" names half of a
   * pair when a gRPC+JSON body starts with one, and connect-node never answers at all (the stream
   * stays open, whatever its deadline). Over gRPC+JSON the public Health/Check does it with no token.
   */
  loneSurrogate: "an error message holding half a surrogate pair is never sent",
  /**
   * The codec reads a tag as a varint of up to 10 bytes and keeps its low 32 bits (Reader.uint32 in
   * wire/src/codec/binary.ts), so a tag longer than 5 bytes or past 32 bits is read as another field;
   * protobuf-es refuses it. (A length past 32 bits is cut the same way, as protobuf-es also does.)
   */
  tagOverflow: "the codec reads a tag past 32 bits as its low 32 bits",
  /**
   * Inside a map entry the codec reads tags without readInto's check (mapField in
   * wire/src/codec/fields.ts), so field number 0 there is skipped as an unknown field; protobuf-es,
   * and the codec everywhere else, refuse it.
   */
  mapEntryFieldZero: "the codec skips field number 0 inside a map entry",
  /**
   * A grpc-message that is not percent-encoding ("%zz") makes connect's findTrailerError throw a
   * URIError, so the call fails INTERNAL (the SDK) or UNKNOWN (connect-node) instead of with the
   * status the server sent; gRPC says a client must take such a message as it is.
   */
  badPercent: "a grpc-message that is not percent-encoding loses the call's status",
} as const;

const OVERLONG = /a tag past 32 bits|a tag longer than 5 bytes|a length past 32 bits/;

/** ./wire-format.ts's words for a field number 0. */
const FIELD_ZERO = /field number 0/;

/** A character outside the BMP, as UTF-8: what a cut by UTF-16 index can split. */
const FOUR_BYTE_UTF8 = /[\xf0-\xf4][\x80-\xbf]{3}/;

export function knownRequest(c: RequestCase, a: Answer, why: string): string | undefined {
  if (c.expect.timeoutMs !== undefined && c.expect.timeoutMs > TIMER_MAX_MS && a.grpcStatus === String(Code.DeadlineExceeded)) return KNOWN.deadlineOverflow;
  const unanswered = a.kind === "hang" || (a.kind === "reset" && a.rstCode === http2.constants.NGHTTP2_INTERNAL_ERROR);
  if (unanswered && FOUR_BYTE_UTF8.test(Buffer.concat(c.chunks).toString("latin1"))) return KNOWN.loneSurrogate;
  return knownDecode(why);
}

/**
 * A field number 0 the codec read can only be one inside a map entry (anywhere else it refuses
 * it); the fuzz tests' spec of KNOWN.mapEntryFieldZero shows that case by hand.
 */
export function knownDecode(why: string): string | undefined {
  if (!/codec read|answered OK/.test(why)) return undefined;
  if (OVERLONG.test(why)) return KNOWN.tagOverflow;
  if (FIELD_ZERO.test(why)) return KNOWN.mapEntryFieldZero;
  return undefined;
}

export function knownReply(c: ReplyCase, why: string): string | undefined {
  return c.badPercent && /URI malformed/.test(why) ? KNOWN.badPercent : undefined;
}
