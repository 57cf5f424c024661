/**
 * What a failed TLS connection to a daemon means, read from the Node error a failed call carries
 * (its cause chain), so that the SDK and aiflowctl each say it in the words of their own options:
 * - `untrusted`: the daemon's certificate did not verify (not signed by the CA given, expired, or
 *   not naming the host dialled);
 * - `client-refused`: the daemon refused this side's client certificate, or its absence, in the
 *   handshake (mutual TLS);
 * - `not-tls`: what answered does not speak TLS (an h2c port dialled as https://).
 */
export type TlsFailureKind = "untrusted" | "client-refused" | "not-tls";

export interface TlsFailure {
  kind: TlsFailureKind;
  /** OpenSSL's or Node's words for it. */
  detail: string;
}

const UNTRUSTED = new Set([
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "CERT_UNTRUSTED",
  "CERT_HAS_EXPIRED",
  "CERT_NOT_YET_VALID",
  "CERT_SIGNATURE_FAILURE",
  "ERR_TLS_CERT_ALTNAME_INVALID",
]);

/** The TLS failure `err` stems from, or undefined when it is not one. */
export function tlsFailure(err: unknown): TlsFailure | undefined {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code !== "string") continue;
    const detail = e.message.replace(/^\[\w+\] /, "");
    if (UNTRUSTED.has(code)) return { kind: "untrusted", detail };
    // The peer's alerts: it wanted a certificate, or did not accept the one it got.
    if (
      /^ERR_SSL_(TLSV13_ALERT_CERTIFICATE_REQUIRED|SSLV3_ALERT_BAD_CERTIFICATE|TLSV1_ALERT_UNKNOWN_CA|SSLV3_ALERT_CERTIFICATE_(EXPIRED|UNKNOWN|REVOKED|UNSUPPORTED)|TLSV1_ALERT_(ACCESS_DENIED|DECRYPT_ERROR)|SSLV3_ALERT_HANDSHAKE_FAILURE)$/.test(
        code,
      )
    )
      return { kind: "client-refused", detail: alert(detail) };
    if (code === "ERR_SSL_WRONG_VERSION_NUMBER" || code === "ERR_SSL_PACKET_LENGTH_TOO_LONG" || code === "ERR_SSL_HTTP_REQUEST")
      return { kind: "not-tls", detail: alert(detail) };
  }
  return undefined;
}

/** "…:SSL routines:ssl3_read_bytes:tlsv13 alert certificate required:…" → "tlsv13 alert certificate required". */
function alert(message: string): string {
  const m = /SSL routines:[^:]*:([^:]+)/.exec(message);
  return m ? m[1]! : message;
}
