/**
 * The transport-security settings and token rules at start: what is refused, with which words, and
 * what `aiflowd token new` makes. (test/tls.test.ts runs TLS itself; tls-config-cli.test.ts runs the
 * aiflowd command for them, in the slow tier.)
 */
import { describe, expect, it } from "vitest";
import { ConfigError, parseArgs } from "../src/config.js";
import { tokenCommand } from "../src/cli/token.js";
import { Authenticator } from "../src/server/auth.js";
import { parseTokensFile, tokenDigest } from "../src/domain/tokens.js";
import { captureLog } from "./support/agents.js";
import { useTestDb } from "./support/kit.js";

const refusedWith = (f: () => unknown) => {
  try {
    f();
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return (err as Error).message;
  }
  throw new Error("expected a ConfigError");
};

describe("TLS settings", () => {
  it("take a certificate with its key, a client CA only with both, and --insecure-plaintext as a switch", () => {
    expect(refusedWith(() => parseArgs(["--tls-cert", "c.pem"], {}))).toMatch(/--tls-key.*go together/);
    expect(refusedWith(() => parseArgs(["--tls-client-ca", "ca.pem"], {}))).toMatch(/--tls-client-ca.*needs TLS/);
    expect(refusedWith(() => parseArgs(["--tls-cert", "c", "--tls-key", "k", "--insecure-plaintext"], {}))).toMatch(/contradicts --tls-cert/);
    expect(parseArgs(["--insecure-plaintext", "serve"], {}).config.insecurePlaintext).toBe(true);
    expect(parseArgs(["serve"], { AIFLOW_INSECURE_PLAINTEXT: "false" }).config.insecurePlaintext).toBe(false);
    expect(parseArgs(["--tls-cert", "c", "--tls-key", "k"], { AIFLOW_TLS_CLIENT_CA: "ca" }).config).toMatchObject({
      tlsCert: "c",
      tlsKey: "k",
      tlsClientCa: "ca",
      tlsTrustDomain: "aiflow",
    });
    expect(refusedWith(() => parseArgs(["--tls-trust-domain", "Not A Domain"], {}))).toMatch(/not a trust domain/);
  });
});

describe("tokens at start", () => {
  const file = (entries: unknown[]) => parseTokensFile(JSON.stringify(entries), "--tokens-file");

  it("refuse one secret granted to two roles, and a secret shorter than the minimum, naming it", () => {
    const { tokens } = parseArgs(["--token", "agent:shared-secret-1", "--token", "ops:shared-secret-1"], {}).config;
    expect(refusedWith(() => new Authenticator(tokens))).toMatch(/same token is granted to roles agent and ops/);
    // The same secret as a digest in the file is the same secret.
    const hashed = [
      ...parseArgs(["--token", "agent:shared-secret-1"], {}).config.tokens,
      ...file([{ role: "engine", sha256: tokenDigest("shared-secret-1") }]),
    ];
    expect(refusedWith(() => new Authenticator(hashed))).toMatch(/roles agent and engine/);
    expect(refusedWith(() => parseArgs(["--token", "agent:short"], {}))).toMatch(/at least 8 characters/);
  });

  it("read a sha256 entry as the token's digest, and refuse an entry with both, neither or a bad digest", () => {
    const [g] = file([{ role: "ops", sha256: tokenDigest("ops-secret-xyz").toUpperCase(), name: "alice" }]);
    expect(new Authenticator([g!]).resolve("ops-secret-xyz")?.principal).toBe("alice");
    expect(refusedWith(() => file([{ role: "ops", token: "ops-secret-xyz", sha256: tokenDigest("x") }]))).toMatch(/either token .* or sha256/);
    expect(refusedWith(() => file([{ role: "ops" }]))).toMatch(/either token/);
    expect(refusedWith(() => file([{ role: "ops", sha256: "abc" }]))).toMatch(/64 hex digits/);
  });

  it("are made by `aiflowd token new`, whose entry holds only the digest and authenticates the token", () => {
    let out = "";
    expect(tokenCommand(["new", "agent", "--name", "gpu-pool", "--agents", "gpu-*", "--tenants", "t1", "--json"], (t) => (out += t))).toBe(0);
    const { token, entry } = JSON.parse(out) as { token: string; entry: Record<string, unknown> };
    expect(token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(JSON.stringify(entry)).not.toContain(token);
    expect(entry).toEqual({ role: "agent", sha256: tokenDigest(token), name: "gpu-pool", tenants: ["t1"], agents: ["gpu-*"] });
    const identity = new Authenticator(file([entry])).resolve(token);
    expect(identity).toMatchObject({ principal: "gpu-pool", agents: ["gpu-*"] });
    expect(refusedWith(() => tokenCommand(["new", "engine", "--agents", "x"], () => {}))).toMatch(/agent tokens only/);
    expect(refusedWith(() => tokenCommand(["new", "root"], () => {}))).toMatch(/ROLE must be one of agent\|engine\|ops/);
  });
});

describe("a daemon on a non-loopback address", () => {
  const fx = useTestDb("tls_config");

  it("refuses to start without TLS, naming the ways out", async () => {
    const err = await fx.startDaemon({ config: { listen: { host: "0.0.0.0", port: 0 } } }).then(
      () => new Error("it started"),
      (e: unknown) => e as Error,
    );
    expect(err).toBeInstanceOf(ConfigError);
    expect(err.message).toMatch(/0\.0\.0\.0 is not loopback.*--tls-cert and --tls-key, or --insecure-plaintext/);
  });

  it("starts with --insecure-plaintext, and says so in its log", async () => {
    const logs = captureLog("info");
    const daemon = await fx.startDaemon({ log: logs.log, config: { listen: { host: "0.0.0.0", port: 0 }, insecurePlaintext: true } });
    expect(daemon.scheme).toBe("http");
    expect(logs.lines().some((l) => l.level === 40 && String(l.msg).startsWith("--insecure-plaintext: serving h2c on a non-loopback address"))).toBe(true);
  });
});
