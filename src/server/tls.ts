/**
 * The gRPC port's TLS: HTTP/2 over TLS 1.2 or 1.3 (1.3 is what Node negotiates first), ALPN h2 only,
 * and with a client CA, mutual TLS: a client without a certificate that CA signed is refused as the
 * handshake ends, before any of its bytes reach HTTP/2 (server.ts).
 *
 * The certificate, key and client CA are files, re-read when they change (polled every
 * RELOAD_POLL_MS) or when reload() is called (SIGHUP). A new set that reads and makes a secure
 * context replaces the old for new connections only: open connections and their long-polls keep
 * theirs. A set that does not (a key that does not match, a file half written) is refused with one
 * warning, and the old set stays.
 */
import { createHash } from "node:crypto";
import { readFileSync, unwatchFile, watchFile } from "node:fs";
import type { SecureServerOptions } from "node:http2";
import { createSecureContext, type SecureContextOptions } from "node:tls";
import { ConfigError } from "../domain/errors.js";
import type { Logger } from "../log.js";

export interface TlsFiles {
  cert: string;
  key: string;
  /** Mutual TLS: the CA bundle client certificates must chain to. */
  clientCa?: string;
}

/** How often the files are checked for a change (a rename over them included). */
const RELOAD_POLL_MS = 1000;
/** A rotation writes the files one after the other: reload once they have been still this long. */
const SETTLE_MS = 200;

export type ReloadOutcome = "reloaded" | "unchanged" | "refused";

/** The files' contents as TLS options; throws (naming the file) when one cannot be read or used. */
export function readTlsFiles(files: TlsFiles): SecureContextOptions {
  const read = (path: string, flag: string) => {
    try {
      return readFileSync(path);
    } catch (err) {
      throw new ConfigError(flag, `cannot read ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
  };
  const material: SecureContextOptions = { cert: read(files.cert, "--tls-cert"), key: read(files.key, "--tls-key") };
  if (files.clientCa) material.ca = read(files.clientCa, "--tls-client-ca");
  try {
    // What Node would do with them at the first handshake, done now, so a bad set never serves.
    createSecureContext(material);
  } catch (err) {
    throw new ConfigError("--tls-cert", `${files.cert} and ${files.key} cannot serve TLS: ${(err as Error).message}`);
  }
  return material;
}

/** The options of the secure HTTP/2 server, from the TLS material and the handshake's time limit. */
export function secureServerOptions(material: SecureContextOptions, mutual: boolean, handshakeTimeoutMs: number): SecureServerOptions {
  return {
    ...material,
    minVersion: "TLSv1.2",
    allowHTTP1: false,
    ALPNProtocols: ["h2"],
    requestCert: mutual,
    // Verified all the same: server.ts closes a connection whose certificate did not verify as its
    // handshake ends, and logs why (Node's own refusal would not say).
    rejectUnauthorized: false,
    handshakeTimeout: handshakeTimeoutMs,
  };
}

/** A TLS server whose secure context can be swapped (HTTP/2's, HTTPS'). */
export interface SecureContextTarget {
  setSecureContext(options: SecureContextOptions): void;
}

/**
 * Watches the files and swaps the secure context of every server serving them (the gRPC port's,
 * and the HTTP endpoints' when they serve TLS) when they change into a good set.
 */
export class TlsReloader {
  readonly #targets: SecureContextTarget[];
  #material: SecureContextOptions;
  #digest: string;
  #refusedDigest: string | undefined;
  #settle: NodeJS.Timeout | undefined;
  #stopped = false;

  constructor(
    server: SecureContextTarget,
    private readonly files: TlsFiles,
    material: SecureContextOptions,
    private readonly log: Logger,
  ) {
    this.#targets = [server];
    this.#material = material;
    this.#digest = digestOf(material);
    for (const path of this.#paths()) watchFile(path, { interval: RELOAD_POLL_MS, persistent: false }, this.#changed);
  }

  /** The set served now (what a server joining the reloads starts with). */
  get material(): SecureContextOptions {
    return this.#material;
  }

  /** Another server of the same files: it is given every set that replaces the current one. */
  attach(server: SecureContextTarget): void {
    this.#targets.push(server);
  }

  /** Reads the files again; swaps the context when they changed into a set that works. */
  reload(): ReloadOutcome {
    let material: SecureContextOptions;
    try {
      material = readTlsFiles(this.files);
    } catch (err) {
      // One line per bad set: a file that stays bad is not reported at every poll.
      const why = (err as Error).message;
      const digest = createHash("sha256").update(why).digest("hex");
      if (digest !== this.#refusedDigest) this.log.warn({ reason: why }, "new TLS files refused; serving with the previous certificate");
      this.#refusedDigest = digest;
      return "refused";
    }
    const digest = digestOf(material);
    if (digest === this.#digest) return "unchanged";
    for (const t of this.#targets) t.setSecureContext(secureContextOf(material));
    this.#material = material;
    this.#digest = digest;
    this.#refusedDigest = undefined;
    this.log.info({ cert: this.files.cert }, "TLS certificate reloaded: new connections use it, open ones keep theirs");
    return "reloaded";
  }

  stop(): void {
    this.#stopped = true;
    clearTimeout(this.#settle);
    for (const path of this.#paths()) unwatchFile(path, this.#changed);
  }

  readonly #changed = () => {
    if (this.#stopped) return;
    clearTimeout(this.#settle);
    this.#settle = setTimeout(() => this.reload(), SETTLE_MS);
    this.#settle.unref();
  };

  #paths(): string[] {
    return [this.files.cert, this.files.key, ...(this.files.clientCa ? [this.files.clientCa] : [])];
  }
}

/** setSecureContext makes a context from these alone (the CA and minimum version included), so all are given. */
const secureContextOf = (m: SecureContextOptions): SecureContextOptions => ({ cert: m.cert, key: m.key, ...(m.ca ? { ca: m.ca } : {}), minVersion: "TLSv1.2" });

function digestOf(m: SecureContextOptions): string {
  const h = createHash("sha256");
  for (const part of [m.cert, m.key, m.ca]) h.update(part ? Buffer.from(part as Buffer) : Buffer.alloc(0)).update("\0");
  return h.digest("hex");
}
