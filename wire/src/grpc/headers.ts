/**
 * Header blocks between node:http2 and fetch's Headers, which connect's interceptors and contexts
 * use: both ends of a gRPC call served or made straight over an HTTP/2 stream (the daemon's direct
 * path, the SDK's transport) convert them the same way. Pseudo-headers (":status", ":path") stay on
 * the node side.
 */
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from "node:http2";

/** A received header block as Headers (repeated fields appended in order). */
export function webHeaders(h: IncomingHttpHeaders): Headers {
  const out = new Headers();
  for (const k in h) {
    if (k.startsWith(":")) continue;
    const v = h[k];
    if (v === undefined) continue;
    if (Array.isArray(v)) for (const one of v) out.append(k, one);
    else out.append(k, String(v));
  }
  return out;
}

/** Headers as a header block to send. */
export function nodeHeaders(h: Headers): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  h.forEach((value, key) => {
    out[key] = value;
  });
  return out;
}

/** A request header as one string (repeated values joined as HTTP does), or null. */
export function headerText(h: IncomingHttpHeaders, name: string): string | null {
  const v = h[name];
  return v === undefined ? null : Array.isArray(v) ? v.join(", ") : v;
}
