// @ts-check
/**
 * TLS for the agent's connections to the daemons: the CA bundle that vouches for them, the client
 * certificate and key of mutual TLS, the name the daemons' certificate is checked against, and the
 * rotation of certificates given as files. What must stay true:
 * - a file is looked at only when a new connection is made (never per call), and read again only
 *   when its stamp (inode, size, modification and change times) moved;
 * - what a connection presents is always good material: a file that cannot be read or does not
 *   parse, or a certificate and key that do not belong together (one swapped, the other not yet),
 *   leaves the last good material in use, with one warning until the files read well again; the
 *   stamps are not taken then, so the next connection tries again;
 * - contents given as bytes never change.
 * Plain JavaScript (type-checked from JSDoc, declared in tls.d.ts) because the heartbeat thread,
 * which makes connections of its own, loads it too.
 */
import { X509Certificate, createPrivateKey } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { isIP } from "node:net";
import tls from "node:tls";

/**
 * TLS material as the agent's options give it: a string is a file path, bytes are PEM contents.
 * @typedef {{ ca?: string | Uint8Array, cert?: string | Uint8Array, key?: string | Uint8Array, serverName?: string }} TlsSource
 */
/**
 * PEM contents, as a connection presents them.
 * @typedef {{ ca?: Buffer, cert?: Buffer, key?: Buffer }} TlsPem
 */
/** @typedef {"ca" | "cert" | "key"} Part */

/** @type {readonly Part[]} */
const PARTS = ["ca", "cert", "key"];

export class TlsMaterial {
  /** @type {Map<Part, string>} The parts given as file paths. */
  #paths = new Map();
  /** @type {Map<Part, string>} The stamp of each file when its good material was read. */
  #stamps = new Map();
  /** @type {TlsPem} */
  #good = {};
  #failing = false;
  /** @type {string | undefined} */
  #serverName;
  /** @type {(message: string) => void} */
  #warn;
  /** @type {(parts: string[]) => void} */
  #reloaded;

  /**
   * @param {TlsSource} source paths (strings) or PEM contents (bytes)
   * @param {{ warn?: (message: string) => void, reloaded?: (parts: string[]) => void, initial?: { ca?: Uint8Array, cert?: Uint8Array, key?: Uint8Array } }} [hooks]
   *   `warn`: once per spell of unreadable files; `reloaded`: files were read again; `initial`: the
   *   material to fall back on until the files are first read (a thread handed what its agent read)
   */
  constructor(source, hooks = {}) {
    this.#serverName = source.serverName;
    this.#warn = hooks.warn ?? (() => {});
    this.#reloaded = hooks.reloaded ?? (() => {});
    for (const part of PARTS) {
      const v = source[part];
      if (typeof v === "string") this.#paths.set(part, v);
      else if (v !== undefined) this.#good[part] = Buffer.from(v.buffer, v.byteOffset, v.byteLength);
    }
    for (const part of PARTS) {
      const v = hooks.initial?.[part];
      if (v !== undefined && this.#paths.has(part)) this.#good[part] = Buffer.from(v.buffer, v.byteOffset, v.byteLength);
    }
  }

  /**
   * Reads every file now; throws, naming the option and the path, when the material is not good.
   * @returns {TlsPem}
   */
  load() {
    const { pem, stamps } = this.#read([...this.#paths.keys()]);
    check(pem, this.#paths);
    this.#good = pem;
    this.#stamps = stamps;
    return pem;
  }

  /**
   * The material for a new connection: files read again when they changed, else what was good.
   * @returns {TlsPem}
   */
  current() {
    if (this.#paths.size === 0) return this.#good;
    try {
      const changed = [...this.#paths].filter(([part, path]) => this.#stamps.get(part) !== stamp(part, path)).map(([part]) => part);
      if (changed.length === 0) return this.#good;
      const { pem, stamps } = this.#read(changed);
      check(pem, this.#paths);
      const first = this.#stamps.size === 0;
      this.#good = pem;
      for (const [part, s] of stamps) this.#stamps.set(part, s);
      this.#failing = false;
      if (!first) this.#reloaded(changed);
    } catch (err) {
      if (!this.#failing) this.#warn(`${message(err)}: new connections keep the certificates last read`);
      this.#failing = true;
    }
    return this.#good;
  }

  /**
   * http2.connect's createConnection: a TLS socket to `authority` presenting the current material.
   * @param {URL} authority
   * @returns {tls.TLSSocket}
   */
  connect(authority) {
    const host = authority.hostname.replace(/^\[(.*)\]$/, "$1");
    const port = Number(authority.port || 443);
    // SNI takes no IP address; the daemon's certificate is then checked against the IP itself.
    const servername = this.#serverName ?? (isIP(host) ? undefined : host);
    return tls.connect({ host, port, servername, ALPNProtocols: ["h2"], ...this.current() });
  }

  /**
   * The files' contents with `parts` read again (the others as they were), and their stamps.
   * @param {Part[]} parts
   */
  #read(parts) {
    /** @type {TlsPem} */
    const pem = { ...this.#good };
    /** @type {Map<Part, string>} */
    const stamps = new Map();
    for (const part of parts) {
      const path = /** @type {string} */ (this.#paths.get(part));
      // The stamp before the read: a write that lands between them is read again next time.
      stamps.set(part, stamp(part, path));
      try {
        pem[part] = readFileSync(path);
      } catch (err) {
        throw new Error(`tls.${part}: cannot read ${path} (${message(err)})`);
      }
    }
    return { pem, stamps };
  }
}

/**
 * @param {Part} part
 * @param {string} path
 */
function stamp(part, path) {
  try {
    const s = statSync(path, { bigint: true });
    return `${s.ino}:${s.size}:${s.mtimeNs}:${s.ctimeNs}`;
  } catch (err) {
    throw new Error(`tls.${part}: cannot read ${path} (${message(err)})`);
  }
}

/**
 * Throws, naming the option, when `pem` is not material a connection could present.
 * @param {TlsPem} pem
 * @param {ReadonlyMap<Part, string>} paths
 */
function check(pem, paths) {
  /** @param {Part} part */
  const where = (part) => `tls.${part}${paths.has(part) ? ` (${paths.get(part)})` : ""}`;
  if (pem.ca) {
    const blocks = pem.ca.toString("latin1").match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g) ?? [];
    if (blocks.length === 0) throw new Error(`${where("ca")} holds no PEM certificate`);
    for (const b of blocks) parse(() => new X509Certificate(b), `${where("ca")} holds a certificate that does not parse`);
  }
  if (pem.cert && pem.key) {
    parse(() => new X509Certificate(/** @type {Buffer} */ (pem.cert)), `${where("cert")} is not a PEM certificate`);
    parse(() => createPrivateKey(/** @type {Buffer} */ (pem.key)), `${where("key")} is not a PEM private key`);
    parse(() => tls.createSecureContext({ cert: pem.cert, key: pem.key }), `${where("cert")} and ${where("key")} do not belong together`);
  }
}

/**
 * @param {() => unknown} fn
 * @param {string} what
 */
function parse(fn, what) {
  try {
    fn();
  } catch (err) {
    throw new Error(`${what} (${message(err)})`);
  }
}

/** @param {unknown} err */
function message(err) {
  return err instanceof Error ? err.message : String(err);
}
