/**
 * What aiflowctl says when a call fails: one line a person can act on, and the exit code. The
 * daemon names proto fields in its refusals; they are said here as the flag or argument typed.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { Command } from "./command.js";

export interface CallSetting {
  address: string;
  /** Where the token came from, or undefined when none was given. */
  tokenFrom?: "--token" | "AIFLOW_TOKEN";
}

export function explain(err: unknown, command: Command, s: CallSetting): { message: string; exit: number } {
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
      return { message: unreachable(text, s.address) ?? text, exit: 1 };
  }
}

/** A connection-level failure in words, or undefined when the daemon itself answered. */
function unreachable(text: string, address: string): string | undefined {
  const to = `(--address, AIFLOW_ADDRESS)`;
  if (/ECONNREFUSED/.test(text)) return `nothing is listening at ${address}: is aiflowd running there? ${to}`;
  if (/ENOTFOUND|EAI_AGAIN/.test(text)) return `cannot resolve the host of ${address} ${to}`;
  if (/EHOSTUNREACH|ENETUNREACH|ETIMEDOUT/.test(text)) return `cannot reach ${address} ${to}`;
  if (/ERR_HTTP2|Protocol error|protocol error|ECONNRESET|socket hang up|session|GOAWAY|HTTP\/2|missing trailer|content-type|HTTP 4|HTTP 5|unexpected HTTP status|invalid gRPC/i.test(text))
    return `${address} did not answer as aiflowd's gRPC port does (${text}): is that the right address? ${to}`;
  return undefined;
}

/** "tenant_key: is required" → "--tenant: is required"; a field without a flag stays as it is. */
function asTyped(text: string, fields: Record<string, string>): string {
  const m = /^([A-Za-z_][\w.[\]]*(?: key)?): /.exec(text);
  if (!m) return text;
  const field = m[1]!;
  const flag = fields[field] ?? fields[field.replace(/\[\d+\]/g, "[0]")] ?? fields[field.replace(/\[\d+\].*$/, "")];
  return flag ? `${flag}: ${text.slice(m[0].length)}` : text;
}
