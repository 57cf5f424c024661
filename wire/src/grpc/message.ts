/**
 * grpc-message as gRPC's spec (PROTOCOL-HTTP2.md, "Responses") has it: the message's UTF-8 bytes,
 * each byte outside 0x20-0x7E and '%' itself written %XX, every other byte as it is. connect-es
 * writes encodeURIComponent instead, which also encodes ':', '/', '?', '#', '@', '&', '=', '+', '$',
 * ',', ';' and the space; grpc-js reads the value with decodeURI, which leaves those escapes as they
 * are, so its users read `node 'a'%3A is on a cycle%3A a -> c`. Every status this package's servers
 * send goes through `setGrpcStatus` (the direct paths, the daemon's refusals) or through
 * `respecGrpcMessage` (what connect-node's handler wrote), so that every stock client shows the
 * message a person wrote.
 *
 * What must stay true:
 * - The value is printable ASCII with no space at either end: an HTTP field value may not start or
 *   end with whitespace (RFC 9110 §5.5), and proxies and HPACK peers trim or refuse it, so a space
 *   there is written %20 (a decoder reads any %XX; only the bytes above must be encoded).
 * - decodeURIComponent(encode(text)) === text for well-formed text, so connect-es clients (which
 *   decode that way) read the same message; a lone surrogate is written as U+FFFD, as UTF-8 has it.
 * - Decoding never throws and never loses the status: a '%' that starts no %XX is kept as it is, and
 *   bytes that are not UTF-8 become U+FFFD (the spec: a client must not discard a bad message).
 */
import { ConnectError } from "@connectrpc/connect";
import { headerGrpcMessage, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { wellFormed } from "./text.js";

/** Characters that are sent as they are; anything else (and a space at either end) is %XX. */
const VERBATIM = /^[\x20-\x24\x26-\x7e]*$/;
const HEX = "0123456789ABCDEF";

export function encodeGrpcMessage(text: string): string {
  if (VERBATIM.test(text) && !text.startsWith(" ") && !text.endsWith(" ")) return text;
  const bytes = Buffer.from(text, "utf8");
  let out = "";
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i]!;
    const edgeSpace = b === 0x20 && (i === 0 || i === bytes.length - 1);
    if (b >= 0x20 && b <= 0x7e && b !== 0x25 && !edgeSpace) out += String.fromCharCode(b);
    else out += `%${HEX[b >> 4]}${HEX[b & 15]}`;
  }
  return out;
}

const utf8 = new TextDecoder("utf-8", { fatal: false });
const isHex = (c: number) => (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66);

export function decodeGrpcMessage(value: string): string {
  if (!value.includes("%")) return value;
  const raw = Buffer.from(value, "utf8");
  const bytes = Buffer.alloc(raw.length);
  let n = 0;
  for (let i = 0; i < raw.length; i++) {
    if (raw[i] === 0x25 && i + 2 < raw.length && isHex(raw[i + 1]!) && isHex(raw[i + 2]!)) {
      bytes[n++] = parseInt(String.fromCharCode(raw[i + 1]!, raw[i + 2]!), 16);
      i += 2;
    } else bytes[n++] = raw[i]!;
  }
  return utf8.decode(bytes.subarray(0, n));
}

/**
 * connect's setTrailerStatus (grpc-status, the error's metadata, grpc-status-details-bin) with
 * grpc-message written as the spec says. A message with a lone surrogate, which connect's
 * encodeURIComponent throws on, goes out with U+FFFD in its place.
 */
export function setGrpcStatus(target: Headers, error?: ConnectError): Headers {
  if (!error) return setTrailerStatus(target, undefined);
  const message = wellFormed(error.rawMessage);
  let safe = error;
  if (message !== error.rawMessage) {
    safe = new ConnectError(message, error.code, error.metadata);
    safe.details = error.details;
  }
  setTrailerStatus(target, safe);
  target.set(headerGrpcMessage, encodeGrpcMessage(message));
  return target;
}

/**
 * Rewrites, in place, a grpc-message that connect-es wrote (encodeURIComponent) as the spec says.
 * decodeURIComponent undoes connect's encoding exactly, and undoes this one too, so a value passed
 * here twice comes out the same.
 */
export function respecGrpcMessage(h: Headers): Headers {
  const sent = h.get(headerGrpcMessage);
  if (sent === null) return h;
  let text: string;
  try {
    text = decodeURIComponent(sent);
  } catch {
    text = decodeGrpcMessage(sent);
  }
  h.set(headerGrpcMessage, encodeGrpcMessage(text));
  return h;
}
