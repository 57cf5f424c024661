/**
 * How a setting's text becomes its value: each parser takes the raw text and the flag (or env var) it
 * came from, and throws a ConfigError naming that flag when the text is not a value of its kind.
 */
import { ConfigError } from "../domain/errors.js";
import { weightProblem } from "../domain/fair-share.js";

export type Parser<T> = (raw: string, flag: string) => T;

/** A setting: its flag, environment variables (the first set one is read), default, --help line and parser. */
export interface Setting<T> {
  flag: string;
  env: readonly string[];
  default: string | undefined;
  help: string;
  parse: Parser<T>;
  /** A repeatable flag collects every occurrence (and splits the env var on whitespace or ';'). */
  repeatable?: boolean;
  /** A switch: the flag alone means "true" (`--flag=false` and the env var still take a value). */
  switch?: boolean;
}

export const text: Parser<string> = (raw) => raw;

export const bool: Parser<boolean> = (raw, flag) => {
  if (/^(true|1|yes|on)$/i.test(raw)) return true;
  if (/^(false|0|no|off)$/i.test(raw)) return false;
  throw new ConfigError(flag, `'${raw}' is not true or false`);
};

/** The trust domain of SPIFFE IDs: a DNS-like name (lower-case letters, digits, '.', '-', '_'). */
export const trustDomain: Parser<string> = (raw, flag) => {
  if (!/^[a-z0-9._-]{1,255}$/.test(raw)) throw new ConfigError(flag, `'${raw}' is not a trust domain (lower-case letters, digits, '.', '-', '_')`);
  return raw;
};

/**
 * A Postgres URL as slonik reads it (with the WHATWG URL parser). libpq also takes a Unix socket's
 * directory as a `host` parameter after an empty host, `postgresql://user@/db?host=/run/postgresql`,
 * which that parser refuses once the URL names a user; such a URL is rewritten with the directory
 * percent-encoded as its host (and a `port` parameter as its port), which slonik and pg both read
 * as the socket's directory. Anything else that does not parse is refused here, naming the setting.
 */
export const postgresUrl: Parser<string> = (raw, flag) => {
  const bad = (why: string) => new ConfigError(flag, `'${redactDatabaseUrl(raw)}' ${why}`);
  if (!/^postgres(ql)?:\/\//i.test(raw)) throw bad("is not a postgres:// or postgresql:// URL");
  if (URL.canParse(raw)) return raw;
  const m = /^(postgres(?:ql)?:\/\/)([^@/?#]*)@\/([^?#]*)(?:\?([^#]*))?$/i.exec(raw);
  const params = new URLSearchParams(m?.[4] ?? "");
  const host = params.get("host");
  if (!m || !host?.startsWith("/")) throw bad("is not a valid URL");
  const port = params.get("port");
  params.delete("host");
  params.delete("port");
  const query = params.toString();
  const rewritten = `${m[1]}${m[2]}@${encodeURIComponent(host)}${port ? `:${port}` : ""}/${m[3]}${query ? `?${query}` : ""}`;
  if (!URL.canParse(rewritten)) throw bad("is not a valid URL");
  return rewritten;
};

/**
 * The URL with its secrets masked, for logs and errors: the userinfo's password, and the value of
 * every query parameter whose name, percent-decoded as pg decodes it, ends in "password" (libpq's
 * password and sslpassword, in any case), which pg takes as well as the userinfo's. Works on text
 * that does not parse as a URL too.
 */
export const redactDatabaseUrl = (url: string) =>
  url
    .replace(/(:\/\/[^:/?#@]*:)[^@/?#]*@/, "$1****@")
    .replace(/([?&])([^=&#]*)=[^&#]*/g, (param, sep: string, name: string) => (/password$/i.test(decodedName(name)) ? `${sep}${name}=****` : param));

const decodedName = (name: string) => {
  try {
    return decodeURIComponent(name.replace(/\+/g, " "));
  } catch {
    return name;
  }
};

export const int =
  (min: number, max = Number.MAX_SAFE_INTEGER): Parser<number> =>
  (raw, flag) => {
    if (!/^-?\d+$/.test(raw.trim())) throw new ConfigError(flag, `'${raw}' is not a whole number`);
    const n = Number(raw);
    if (n < min || n > max) throw new ConfigError(flag, `${n} is outside ${min}..${max}`);
    return n;
  };

const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/** Durations are written 500ms, 30s, 5m, 2h, 7d (or a bare number of milliseconds). */
export function parseDuration(raw: string, flag = "duration"): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$/.exec(raw.trim());
  if (!m) throw new ConfigError(flag, `'${raw}' is not a duration (examples: 500ms, 30s, 5m, 2h)`);
  return Math.round(Number(m[1]) * UNITS[m[2] ?? "ms"]!);
}

export const duration =
  (minMs: number, maxMs = Number.MAX_SAFE_INTEGER): Parser<number> =>
  (raw, flag) => {
    const ms = parseDuration(raw, flag);
    if (ms < minMs) throw new ConfigError(flag, `${raw} is shorter than the minimum ${minMs}ms`);
    if (ms > maxMs) throw new ConfigError(flag, `${raw} is longer than the maximum ${maxMs}ms`);
    return ms;
  };

const IDENT = /^[a-z_][a-z0-9_]{0,40}$/;
export const identifier: Parser<string> = (raw, flag) => {
  if (!IDENT.test(raw)) throw new ConfigError(flag, `'${raw}' must match ${IDENT.source} (lower-case SQL identifier)`);
  return raw;
};

export interface ListenAddress {
  host: string;
  port: number;
}

/** host:port as a URL's authority writes it (an IPv6 host in brackets). */
export const formatAddress = ({ host, port }: ListenAddress): string => (host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`);
export const listen: Parser<ListenAddress> = (raw, flag) => {
  const m = /^(?:\[([^\]]+)\]|([^:]+)):(\d{1,5})$/.exec(raw.trim());
  if (!m) throw new ConfigError(flag, `'${raw}' is not HOST:PORT`);
  const port = Number(m[3]);
  if (port > 65535) throw new ConfigError(flag, `port ${port} is above 65535`);
  return { host: m[1] ?? m[2]!, port };
};

/** A secret given as text: long enough to be one. Never echoed in an error. */
export const secret =
  (minLength: number): Parser<string> =>
  (raw, flag) => {
    if (raw.length < minLength)
      throw new ConfigError(flag, `is ${raw.length} characters; a secret needs at least ${minLength} (openssl rand -hex 32 makes one)`);
    return raw;
  };

export const level: Parser<string> = (raw, flag) => {
  const levels = ["trace", "debug", "info", "warn", "error", "fatal", "silent"];
  if (!levels.includes(raw)) throw new ConfigError(flag, `'${raw}' is not one of ${levels.join(", ")}`);
  return raw;
};

export const oneOf =
  <T extends string>(values: readonly T[]): Parser<T> =>
  (raw, flag) => {
    if (!(values as readonly string[]).includes(raw)) throw new ConfigError(flag, `'${raw}' is not one of ${values.join(", ")}`);
    return raw as T;
  };

export const list: Parser<string[]> = (raw) =>
  raw
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);

/** tenant=weight pairs (commas between), each weight within fair-share's bounds. */
export const tenantWeights: Parser<Map<string, number>> = (raw, flag) => {
  const out = new Map<string, number>();
  for (const pair of list(raw, flag)) {
    const eq = pair.lastIndexOf("=");
    const tenant = eq > 0 ? pair.slice(0, eq).trim() : "";
    const weight = eq > 0 ? Number(pair.slice(eq + 1).trim()) : NaN;
    if (!tenant) throw new ConfigError(flag, `'${pair}' is not tenant=weight`);
    const problem = weightProblem(weight);
    if (problem) throw new ConfigError(flag, `the weight of '${tenant}' ${problem}`);
    out.set(tenant, weight);
  }
  return out;
};
