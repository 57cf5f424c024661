/**
 * Certificates for the TLS tests, made with `openssl` in a fresh temporary directory when a test
 * file starts: nothing here is committed, and every key lives only as long as its directory.
 *
 *   const pki = Pki.create();                       // a CA, and a server certificate for 127.0.0.1 / localhost
 *   const agent = pki.client("gpu", { uris: ["spiffe://aiflow/agent/gpu-*"] });
 *   const stranger = Pki.create().client("x", {});   // signed by another CA
 *   const old = pki.client("old", { uris: [...], expired: true });
 *   pki.close();
 *
 * Each certificate is a pair of PEM files (`cert`, `key`) and their contents (`certPem`, `keyPem`).
 * Keys are P-256 (fast to make: a file's whole PKI takes a few tens of milliseconds).
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export interface CertPair {
  cert: string;
  key: string;
  certPem: Buffer;
  keyPem: Buffer;
}

export interface LeafOptions {
  /** URI SANs, e.g. spiffe://aiflow/agent/gpu-7. */
  uris?: string[];
  /** DNS SANs. */
  dns?: string[];
  /** IP SANs. */
  ips?: string[];
  /** Not valid after yesterday. */
  expired?: boolean;
}

export class Pki {
  private constructor(
    readonly dir: string,
    readonly ca: CertPair,
  ) {}

  /** A CA of its own, in a directory of its own. */
  static create(name = "aiflow-test-ca"): Pki {
    const dir = mkdtempSync(join(tmpdir(), "aiflow-pki-"));
    const cert = join(dir, "ca.crt");
    const key = join(dir, "ca.key");
    openssl([
      "req",
      "-x509",
      ...P256,
      "-nodes",
      "-keyout",
      key,
      "-out",
      cert,
      "-days",
      "2",
      "-subj",
      `/CN=${name}`,
      "-addext",
      "basicConstraints=critical,CA:TRUE",
      "-addext",
      "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    return new Pki(dir, pair(cert, key));
  }

  /** The daemon's certificate: 127.0.0.1, ::1 and localhost, unless told otherwise. */
  server(name = "server", opts: LeafOptions = { dns: ["localhost"], ips: ["127.0.0.1", "::1"] }): CertPair {
    return this.leaf(name, opts, "serverAuth");
  }

  /** A client's certificate (for mutual TLS). */
  client(name: string, opts: LeafOptions): CertPair {
    return this.leaf(name, opts, "clientAuth");
  }

  close(): void {
    rmSync(this.dir, { recursive: true, force: true });
  }

  private leaf(name: string, opts: LeafOptions, usage: string): CertPair {
    const base = join(this.dir, name);
    const sans = [...(opts.uris ?? []).map((u) => `URI:${u}`), ...(opts.dns ?? []).map((d) => `DNS:${d}`), ...(opts.ips ?? []).map((i) => `IP:${i}`)];
    const ext = [`basicConstraints=CA:FALSE`, `extendedKeyUsage=${usage}`, ...(sans.length > 0 ? [`subjectAltName=${sans.join(",")}`] : [])];
    writeFileSync(`${base}.ext`, `${ext.join("\n")}\n`);
    openssl(["req", "-new", ...P256, "-nodes", "-keyout", `${base}.key`, "-out", `${base}.csr`, "-subj", `/CN=${name}`]);
    // -days -1: valid until a day before it was made, so expired from the start.
    openssl([
      "x509",
      "-req",
      "-in",
      `${base}.csr`,
      "-CA",
      this.ca.cert,
      "-CAkey",
      this.ca.key,
      "-set_serial",
      String(Date.now() * 1000 + serial++),
      "-out",
      `${base}.crt`,
      "-days",
      opts.expired ? "-1" : "1",
      "-extfile",
      `${base}.ext`,
    ]);
    return pair(`${base}.crt`, `${base}.key`);
  }
}

let serial = 0;

const P256 = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

function openssl(args: string[]): void {
  execFileSync("openssl", args, { stdio: ["ignore", "ignore", "pipe"] });
}

function pair(cert: string, key: string): CertPair {
  return { cert, key, certPem: readFileSync(cert), keyPem: readFileSync(key) };
}
