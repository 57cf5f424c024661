/**
 * What aiflowctl says when a call fails: one line a person can act on, and the exit code. The
 * daemon names proto fields in its refusals; they are said here as the flag or argument typed.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { tlsFailure, type TlsFailure } from "@aiflow/wire/client/tls-failure";
import type { Command } from "./command.js";
import type { TlsChoice } from "./tls.js";

export interface CallSetting {
  address: string;
  /** Where the token came from, or undefined when none was given. */
  tokenFrom?: "--token" | "AIFLOW_TOKEN";
  /** The TLS files given, or undefined for h2c. */
  tls?: TlsChoice["given"];
}

export function explain(err: unknown, command: Command, s: CallSetting): { message: string; exit: number } {
  const handshake = tlsFailure(err);
  if (handshake) return { message: tlsMessage(handshake, s), exit: 1 };
  const e = ConnectError.from(err);
  const role = command.role ?? "ops";
  const text = e.rawMessage;
  switch (e.code) {
    case Code.Unauthenticated:
      return s.tokenFrom
        ? { message: `the daemon at ${s.address} does not accept the token from ${s.tokenFrom} (${text})`, exit: 1 }
        : { message: `no token: give --token TOKEN or set AIFLOW_TOKEN (${command.name} needs a token with role '${role}')`, exit: 1 };
    case Code.InvalidArgument:
      return { message: asTyped(text, command.fields ?? {}), exit: 2 };
    case Code.DeadlineExceeded:
      return { message: `no answer from ${s.address} in time (--timeout): is that aiflowd's gRPC port?`, exit: 1 };
    case Code.PermissionDenied:
    case Code.NotFound:
    case Code.FailedPrecondition:
    case Code.AlreadyExists:
    case Code.ResourceExhausted:
      return { message: text, exit: 1 };
    default:
      // Whatever else a failed connection surfaces as (unavailable, unknown, internal, aborted).
      return { message: unreachable(text, s) ?? text, exit: 1 };
  }
}

/** A connection-level failure in words, or undefined when the daemon itself answered. */
function unreachable(text: string, s: CallSetting): string | undefined {
  const address = s.address;
  const to = `(--address, AIFLOW_ADDRESS)`;
  // Closed before any answer: what a TLS port does to h2c, and a mutual-TLS daemon to a client
  // certificate it does not accept (it closes the connection as the handshake ends, with no alert).
  const tls = Boolean(s.tls) || address.startsWith("https://");
  // The close can also arrive as a reset, when the client's first bytes were still unread: over TLS
  // (a handshake refused), and over h2c to a TLS port, whose server resets the plaintext preface
  // about as often as it closes after it.
  if (/stream closed with error code CANCEL/.test(text) || (tls && /ECONNRESET|socket hang up/.test(text)) || (!tls && /read ECONNRESET/.test(text))) {
    if (!tls) return `${address} closed the connection without answering: if it serves TLS, give --tls-ca FILE (or AIFLOW_TLS_CA) ${to}`;
    return s.tls?.cert
      ? `${address} closed the connection as the TLS handshake ended: under mutual TLS, the certificate of ${s.tls.cert.from} is not one it accepts (not signed by the CA of its --tls-client-ca, or expired)`
      : `${address} closed the connection as the TLS handshake ended: under mutual TLS it wants a client certificate: give --tls-cert FILE and --tls-key FILE`;
  }
  if (/ECONNREFUSED/.test(text)) return `nothing is listening at ${address}: is aiflowd running there? ${to}`;
  if (/ENOTFOUND|EAI_AGAIN/.test(text)) return `cannot resolve the host of ${address} ${to}`;
  if (/EHOSTUNREACH|ENETUNREACH|ETIMEDOUT/.test(text)) return `cannot reach ${address} ${to}`;
  if (
    /ERR_HTTP2|Protocol error|protocol error|ECONNRESET|socket hang up|session|GOAWAY|HTTP\/2|missing trailer|content-type|HTTP 4|HTTP 5|unexpected HTTP status|invalid gRPC/i.test(
      text,
    )
  )
    return `${address} did not answer as aiflowd's gRPC port does (${text}): is that the right address? ${to}`;
  return undefined;
}

/** A failed TLS handshake in words, naming the flag to fix. */
function tlsMessage(f: TlsFailure, s: CallSetting): string {
  const failed = `the TLS handshake with ${s.address} failed`;
  switch (f.kind) {
    case "untrusted":
      if (/altnames/.test(f.detail))
        return `${failed}: its certificate does not name that host (${f.detail}): give --address as a name the certificate carries`;
      return s.tls?.ca
        ? `${failed}: its certificate is not trusted (${f.detail}): the CA in ${s.tls.ca.from} (${s.tls.ca.path}) did not sign it`
        : `${failed}: its certificate is not trusted (${f.detail}): give the CA that signed it with --tls-ca FILE (or AIFLOW_TLS_CA)`;
    case "client-refused":
      return s.tls?.cert
        ? `${failed}: the daemon refused the client certificate of ${s.tls.cert.from} (${f.detail}): it must be signed by the CA of the daemon's --tls-client-ca`
        : `${failed}: the daemon asks for a client certificate (${f.detail}): give --tls-cert FILE and --tls-key FILE`;
    case "not-tls":
      return `${failed}: ${s.address} does not speak TLS (${f.detail}): it serves h2c, so drop the --tls-* flags (and AIFLOW_TLS_*) and https://`;
  }
}

/** "tenant_key: is required" → "--tenant: is required"; a field without a flag stays as it is. */
function asTyped(text: string, fields: Record<string, string>): string {
  const m = /^([A-Za-z_][\w.[\]]*(?: key)?): /.exec(text);
  if (!m) return text;
  const field = m[1]!;
  const flag = fields[field] ?? fields[field.replace(/\[\d+\]/g, "[0]")] ?? fields[field.replace(/\[\d+\].*$/, "")];
  return flag ? `${flag}: ${text.slice(m[0].length)}` : text;
}
