/**
 * aiflowctl's TLS flags: `--tls-ca`, `--tls-cert`, `--tls-key` (or AIFLOW_TLS_CA, AIFLOW_TLS_CERT,
 * AIFLOW_TLS_KEY), each a PEM file. Any of them makes a bare address https://; an http:// address
 * with them is a contradiction. The files are read before anything is sent, so a missing one is a
 * usage error naming the flag and the path.
 */
import { readFileSync } from "node:fs";
import type { SecureClientSessionOptions } from "node:http2";
import { createSecureContext } from "node:tls";
import { UsageError, type Parsed } from "./args.js";

const FLAGS = { ca: ["tls-ca", "AIFLOW_TLS_CA"], cert: ["tls-cert", "AIFLOW_TLS_CERT"], key: ["tls-key", "AIFLOW_TLS_KEY"] } as const;

type Part = keyof typeof FLAGS;

/** Where a TLS setting came from (`--tls-ca` or AIFLOW_TLS_CA) and its path. */
export interface TlsSetting {
  from: string;
  path: string;
}

export interface TlsChoice {
  /** The daemon's base URL. */
  baseUrl: string;
  /** What was given, for the messages of a failed handshake; undefined for h2c. */
  given?: Partial<Record<Part, TlsSetting>>;
  /** http2.connect's TLS options; undefined for h2c. */
  nodeOptions?: SecureClientSessionOptions;
}

/** The base URL and TLS options for `address` from the flags and the environment. */
export function tlsChoice(address: string, args: Parsed, env: NodeJS.ProcessEnv): TlsChoice {
  const given: Partial<Record<Part, TlsSetting>> = {};
  for (const part of Object.keys(FLAGS) as Part[]) {
    const [flag, envVar] = FLAGS[part];
    const fromFlag = args.get(flag);
    const value = fromFlag ?? env[envVar];
    if (value !== undefined && value !== "") given[part] = { from: fromFlag !== undefined ? `--${flag}` : envVar, path: value };
  }
  if ((given.cert === undefined) !== (given.key === undefined))
    throw new UsageError(`--tls-cert and --tls-key go together (got only ${(given.cert ?? given.key)!.from})`);
  const scheme = /^(https?):\/\//.exec(address)?.[1];
  const tls = Object.keys(given).length > 0;
  if (!tls) return { baseUrl: scheme ? address : `http://${address}` };
  if (scheme === "http") throw new UsageError(`${address} is plaintext (http://), but TLS flags are given: write https:// or leave the scheme out`);
  const nodeOptions: SecureClientSessionOptions = {};
  for (const [part, setting] of Object.entries(given) as [Part, TlsSetting][]) nodeOptions[part] = read(setting);
  check(nodeOptions, given);
  return { baseUrl: scheme ? address : `https://${address}`, given, nodeOptions };
}

function read(s: TlsSetting): Buffer {
  try {
    return readFileSync(s.path);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why =
      code === "ENOENT" ? "no such file" : code === "EACCES" ? "permission denied" : code === "EISDIR" ? "a directory, not a file" : (err as Error).message;
    throw new UsageError(`${s.from}: cannot read ${s.path} (${why})`);
  }
}

/** Files that hold no certificate, or a certificate and key that do not go together, are refused before anything is sent. */
function check(o: SecureClientSessionOptions, given: Partial<Record<Part, TlsSetting>>): void {
  if (given.ca && !String(o.ca).includes("-----BEGIN CERTIFICATE-----")) throw new UsageError(`${given.ca.from}: ${given.ca.path} holds no PEM certificate`);
  if (!given.cert || !given.key) return;
  try {
    createSecureContext({ cert: o.cert, key: o.key });
  } catch (err) {
    throw new UsageError(`${given.cert.from} ${given.cert.path} and ${given.key.from} ${given.key.path} cannot be used together (${(err as Error).message})`);
  }
}
