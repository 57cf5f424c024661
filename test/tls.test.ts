/**
 * Transport security end to end, with a stock @grpc/grpc-js client built from our protos and
 * certificates made for this file by openssl (./support/pki.ts): TLS, mutual TLS, identity from a
 * client certificate's SPIFFE URI, tokens and certificates together, rotation of the server's
 * certificate under an open long-poll, and what is and is not logged.
 */
import { X509Certificate } from "node:crypto";
import { copyFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import tls from "node:tls";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { tokenDigest } from "../src/domain/tokens.js";
import { captureLog, registerRequest } from "./support/agents.js";
import { TOKENS } from "./support/daemon.js";
import { grpc, loadService, unary } from "./support/grpc-js.js";
import { until, useTestDb } from "./support/kit.js";
import { Pki, type CertPair } from "./support/pki.js";

const AgentClient = loadService("aiflow/cluster/v1/agent.proto", "aiflow.cluster.v1.AgentService");
const QueueClient = loadService("aiflow/cluster/v1/queue.proto", "aiflow.cluster.v1.QueueService");
const OpsClient = loadService("aiflow/cluster/v1/ops.proto", "aiflow.cluster.v1.OpsService");

const pki = Pki.create();
const other = Pki.create("another-ca");
const serverCert = pki.server();
const certs = {
  gpu: pki.client("gpu", { uris: ["spiffe://aiflow/agent/gpu-*"] }),
  engine: pki.client("engine", { uris: ["spiffe://aiflow/engine/producer-1"] }),
  expired: pki.client("expired", { uris: ["spiffe://aiflow/agent/gpu-*"], expired: true }),
  stranger: other.client("stranger", { uris: ["spiffe://aiflow/agent/gpu-*"] }),
  twoRoles: pki.client("two-roles", { uris: ["spiffe://aiflow/agent/gpu-1", "spiffe://aiflow/ops/alice"] }),
  otherDomain: pki.client("other-domain", { uris: ["spiffe://elsewhere/agent/gpu-1"] }),
};

afterAll(() => {
  pki.close();
  other.close();
});

const db = useTestDb("tls");

function credentials(client?: CertPair, ca: Buffer = pki.ca.certPem): grpc.ChannelCredentials {
  return grpc.credentials.createSsl(ca, client?.keyPem ?? null, client?.certPem ?? null);
}

/** [code or "ok", response] of one unary call; a refused handshake is UNAVAILABLE. */
async function call(Client: grpc.ServiceClientConstructor, address: string, creds: grpc.ChannelCredentials, method: string, req: object, token?: string) {
  const client = new Client(address, creds, { "grpc.ssl_target_name_override": "localhost" });
  try {
    const [err, res] = await unary(client, method, req, token);
    return { code: err ? grpc.status[err.code] : "OK", details: err?.details, res };
  } finally {
    client.close();
  }
}

describe("a daemon serving TLS (no client CA)", () => {
  let daemon: Daemon;
  const logs = captureLog("debug");
  beforeAll(async () => {
    daemon = await db.startDaemon({ log: logs.log, config: { tlsCert: serverCert.cert, tlsKey: serverCert.key } });
  });

  it("serves a stock client that trusts its CA, and says https", async () => {
    expect(daemon.scheme).toBe("https");
    const r = await call(OpsClient, daemon.address, credentials(), "listAgents", {}, TOKENS.ops);
    expect(r.code).toBe("OK");
  });

  it("negotiates TLS 1.3 and h2, and refuses TLS 1.1", async () => {
    const handshake = (opts: tls.ConnectionOptions) =>
      new Promise<{ version: string | null; alpn: string | false | null } | Error>((resolve) => {
        const s = tls.connect({ host: "127.0.0.1", port: daemon.port, ca: pki.ca.certPem, servername: "localhost", ALPNProtocols: ["h2"], ...opts }, () => {
          resolve({ version: s.getProtocol(), alpn: s.alpnProtocol });
          s.end();
        });
        s.on("error", resolve);
      });
    expect(await handshake({})).toEqual({ version: "TLSv1.3", alpn: "h2" });
    expect(await handshake({ minVersion: "TLSv1.2", maxVersion: "TLSv1.2" })).toEqual({ version: "TLSv1.2", alpn: "h2" });
    expect(await handshake({ minVersion: "TLSv1", maxVersion: "TLSv1.1" })).toBeInstanceOf(Error);
  });

  it("refuses plaintext to the TLS port", async () => {
    const r = await call(OpsClient, daemon.address, grpc.credentials.createInsecure(), "listAgents", {}, TOKENS.ops);
    expect(r.code).toBe("UNAVAILABLE");
  });

  it("is refused by a client that does not trust its certificate", async () => {
    const r = await call(OpsClient, daemon.address, credentials(undefined, other.ca.certPem), "listAgents", {}, TOKENS.ops);
    expect(r.code).toBe("UNAVAILABLE");
  });

  it("still needs a token: a certificate is no identity without --tls-client-ca", async () => {
    const r = await call(OpsClient, daemon.address, credentials(certs.engine), "listAgents", {});
    expect(r.code).toBe("UNAUTHENTICATED");
  });
});

describe("a daemon serving mutual TLS", () => {
  let daemon: Daemon;
  const logs = captureLog("debug");
  beforeAll(async () => {
    daemon = await db.startDaemon({ log: logs.log, config: { tlsCert: serverCert.cert, tlsKey: serverCert.key, tlsClientCa: pki.ca.cert } });
  });

  it("refuses in the handshake a client with no certificate, an expired one, or one from another CA, and logs why", async () => {
    const before = daemon.serverStats.tlsRefused;
    for (const creds of [credentials(), credentials(certs.expired), credentials(certs.stranger)]) {
      const r = await call(AgentClient, daemon.address, creds, "register", registerRequest("gpu-1"), TOKENS.agent);
      expect(r.code).toBe("UNAVAILABLE");
    }
    await until("the three refusals are counted", () => daemon.serverStats.tlsRefused - before >= 3);
    const refusals = logs.lines().filter((l) => l.msg === "connection refused in the TLS handshake: its client certificate is not accepted");
    expect(refusals.length).toBeGreaterThanOrEqual(3);
    for (const r of refusals) expect(r).toMatchObject({ remote: "127.0.0.1", reason: expect.any(String) });
    expect(refusals.slice(-3).map((r) => r.reason)).toEqual(["NO_CLIENT_CERTIFICATE", "CERT_HAS_EXPIRED", "UNABLE_TO_VERIFY_LEAF_SIGNATURE"]);
  });

  it("lets an agent certificate for gpu-* register gpu-1 with no token, and not cpu-1", async () => {
    const ok = await call(AgentClient, daemon.address, credentials(certs.gpu), "register", registerRequest("gpu-1"));
    expect(ok.code).toBe("OK");
    const no = await call(AgentClient, daemon.address, credentials(certs.gpu), "register", registerRequest("cpu-1"));
    expect(no.code).toBe("PERMISSION_DENIED");
    expect(no.details).toMatch(/client certificate may not act as agent 'cpu-1'.*'gpu-\*'/);
  });

  it("gives a certificate its role only: an agent certificate cannot call the queue", async () => {
    const r = await call(OpsClient, daemon.address, credentials(certs.gpu), "listAgents", {});
    expect(r.code).toBe("PERMISSION_DENIED");
    const engine = await call(QueueClient, daemon.address, credentials(certs.engine), "enqueue", {
      tenantKey: "default",
      items: [{ engineKind: "dag", idempotencyKey: "tls-1" }],
    });
    expect(engine.code).toBe("OK");
  });

  it("with a token and a certificate, needs both to name the same role, and holds both limits", async () => {
    const agrees = await call(AgentClient, daemon.address, credentials(certs.gpu), "register", registerRequest("gpu-2"), TOKENS.agent);
    expect(agrees.code).toBe("OK");
    const disagrees = await call(AgentClient, daemon.address, credentials(certs.gpu), "register", registerRequest("gpu-3"), TOKENS.engine);
    expect(disagrees.code).toBe("PERMISSION_DENIED");
    expect(disagrees.details).toMatch(/name different callers/);
    // The token may act as any agent; the certificate only as gpu-*.
    const outside = await call(AgentClient, daemon.address, credentials(certs.gpu), "register", registerRequest("cpu-2"), TOKENS.agent);
    expect(outside.code).toBe("PERMISSION_DENIED");
  });

  it("refuses a certificate that names two roles; one of another trust domain names no one", async () => {
    const two = await call(AgentClient, daemon.address, credentials(certs.twoRoles), "register", registerRequest("gpu-1"));
    expect(two.code).toBe("PERMISSION_DENIED");
    expect(two.details).toMatch(/two roles/);
    const foreign = await call(AgentClient, daemon.address, credentials(certs.otherDomain), "register", registerRequest("gpu-1"));
    expect(foreign.code).toBe("UNAUTHENTICATED");
  });
});

describe("rotating the server's certificate", () => {
  let daemon: Daemon;
  const logs = captureLog("debug");
  const dir = pki.dir;
  const live = { cert: join(dir, "live.crt"), key: join(dir, "live.key") };
  const second = pki.server("server-2");
  beforeAll(async () => {
    copyFileSync(serverCert.cert, live.cert);
    copyFileSync(serverCert.key, live.key);
    daemon = await db.startDaemon({ log: logs.log, config: { tlsCert: live.cert, tlsKey: live.key } });
  });

  /** The serial of the certificate a new connection is served. */
  const servedSerial = () =>
    new Promise<string>((resolve, reject) => {
      const s = tls.connect({ host: "127.0.0.1", port: daemon.port, ca: pki.ca.certPem, servername: "localhost", ALPNProtocols: ["h2"] }, () => {
        resolve(s.getPeerCertificate().serialNumber);
        s.end();
      });
      s.on("error", reject);
    });
  const serialOf = (pem: Buffer) => new X509Certificate(pem).serialNumber;

  it("keeps a waiting long-poll claim, and serves new connections the new certificate", async () => {
    const client = new AgentClient(daemon.address, credentials(), { "grpc.ssl_target_name_override": "localhost" });
    try {
      const [regErr] = await unary(
        client,
        "register",
        registerRequest("rot-1", { metadata: { slots: 1, tenants: ["default"], engineKinds: ["rot"] } }),
        TOKENS.agent,
      );
      expect(regErr).toBeNull();
      expect(await servedSerial()).toBe(serialOf(serverCert.certPem));
      // The claim waits on the connection opened before the reload; were it dropped, the claim
      // would fail UNAVAILABLE instead of taking the item enqueued after.
      const waiting = unary<{ items: { id: string }[] }>(client, "claim", { name: "rot-1", maxItems: 1, wait: { seconds: 20 } }, TOKENS.agent);
      copyFileSync(second.cert, live.cert);
      copyFileSync(second.key, live.key);
      expect(daemon.reloadTls()).toBe("reloaded");
      expect(await servedSerial()).toBe(serialOf(second.certPem));
      // The long-poll's connection was not dropped: an item enqueued now reaches it.
      const producer = new QueueClient(daemon.address, credentials(), { "grpc.ssl_target_name_override": "localhost" });
      const [enqErr] = await unary(producer, "enqueue", { tenantKey: "default", items: [{ engineKind: "rot", idempotencyKey: "rot-item" }] }, TOKENS.engine);
      producer.close();
      expect(enqErr).toBeNull();
      const [claimErr, claimed] = await waiting;
      expect(claimErr).toBeNull();
      expect(claimed!.items).toHaveLength(1);
    } finally {
      client.close();
    }
  });

  it("refuses a bad new pair with one log line and keeps serving the old one", async () => {
    const before = await servedSerial();
    writeFileSync(live.key, "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n");
    expect(daemon.reloadTls()).toBe("refused");
    expect(daemon.reloadTls()).toBe("refused");
    expect(logs.lines().filter((l) => l.msg === "new TLS files refused; serving with the previous certificate")).toHaveLength(1);
    expect(await servedSerial()).toBe(before);
    copyFileSync(second.key, live.key);
    expect(daemon.reloadTls()).toBe("unchanged");
  });

  it("notices changed files by itself", async () => {
    const third = pki.server("server-3");
    copyFileSync(third.key, live.key);
    copyFileSync(third.cert, live.cert);
    await until("a new connection is served the third certificate", async () => (await servedSerial()) === serialOf(third.certPem), 15_000, 100);
  });
});

describe("tokens that are safe to store", () => {
  let daemon: Daemon;
  const logs = captureLog("trace");
  const secret = "a-hashed-ops-secret-0123";
  beforeAll(async () => {
    const file = join(pki.dir, "tokens.json");
    writeFileSync(
      file,
      JSON.stringify([
        { role: "ops", sha256: tokenDigest(secret), name: "hashed-ops" },
        { role: "agent", token: TOKENS.agent },
      ]),
    );
    const { parseArgs } = await import("../src/config.js");
    const { tokens } = parseArgs(["--tokens-file", file], {}).config;
    daemon = await db.startDaemon({ log: logs.log, config: { tokens, tlsCert: serverCert.cert, tlsKey: serverCert.key } });
  });

  it("authenticates a token the file holds only the SHA-256 of", async () => {
    const r = await call(OpsClient, daemon.address, credentials(), "listAgents", {}, secret);
    expect(r.code).toBe("OK");
  });

  it("does not take the digest itself, nor another role's digest, for a token", async () => {
    for (const t of [tokenDigest(secret), tokenDigest(TOKENS.agent)]) {
      const r = await call(OpsClient, daemon.address, credentials(), "listAgents", {}, t);
      expect(r.code).toBe("UNAUTHENTICATED");
    }
  });

  it("never logs a token, a digest or a key", async () => {
    await call(OpsClient, daemon.address, credentials(), "listAgents", {}, "wrong-token-abcdef");
    const text = logs.raw().join("\n");
    expect(text).toContain("authentication failed");
    for (const s of [secret, tokenDigest(secret), TOKENS.agent, tokenDigest(TOKENS.agent), "wrong-token-abcdef", serverCert.keyPem.toString().split("\n")[1]!])
      expect(text).not.toContain(s);
  });
});
