/**
 * The SDK over TLS, with certificates made for this file by openssl (../../test/support/pki.ts):
 * what the `tls` option accepts and refuses before anything is sent; rotation of the client
 * certificate, seen by a TLS server of the test's own that answers with the serial each connection
 * presented; and end to end against real daemons serving TLS, mutual TLS and h2c: work over
 * https://, failed handshakes said in words, a SPIFFE identity registering with no token (and not as
 * a name it does not cover), a handshake refused, a rotated certificate presented at the next
 * connection, and failover between addresses.
 */
import { X509Certificate } from "node:crypto";
import { once } from "node:events";
import { copyFileSync, mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TLSSocket } from "node:tls";
import { createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { agentRow, captureLog } from "../../test/support/agents.js";
import { TOKENS } from "../../test/support/daemon.js";
import { freePort } from "../../test/support/free-port.js";
import { useTestDb } from "../../test/support/kit.js";
import { Pki, type CertPair } from "../../test/support/pki.js";
import type { Daemon } from "../../src/daemon.js";
import { GuardedSessionManager } from "@aiflow/wire/client/session-manager";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { AgentFailedError, type Agent } from "../src/index.js";
import { resolveOptions, type AgentOptions } from "../src/options.js";
import { TlsMaterial } from "../src/tls.js";
import { agentName, homedName, testAgent, until, WorkItemStatus } from "./support.js";

const pki = Pki.create();
const stranger = Pki.create("another-ca");
const serverCert = pki.server();
const certs = {
  gpu: pki.client("gpu", { uris: ["spiffe://aiflow/agent/gpu-*"] }),
  gpuNext: pki.client("gpu-next", { uris: ["spiffe://aiflow/agent/gpu-*"] }),
  cpu: pki.client("cpu", { uris: ["spiffe://aiflow/agent/cpu-*"] }),
  /** A certificate with no identity of ours: its holder's calls need a token. */
  producer: pki.client("producer", {}),
  stranger: stranger.client("stranger", { uris: ["spiffe://aiflow/agent/gpu-*"] }),
};
/** Files of the test's own, which rotations replace. */
const scratch = mkdtempSync(join(tmpdir(), "aiflow-sdk-tls-"));
afterAll(() => {
  pki.close();
  stranger.close();
  rmSync(scratch, { recursive: true, force: true });
});

let files = 0;
/** A copy of `pair` at paths of its own. */
function ownCopy(pair: CertPair): { cert: string; key: string } {
  const n = ++files;
  const cert = join(scratch, `agent-${n}.crt`);
  const key = join(scratch, `agent-${n}.key`);
  copyFileSync(pair.cert, cert);
  copyFileSync(pair.key, key);
  return { cert, key };
}

/** Replaces `path` with `contents` by a rename, as a certificate manager does. */
function replace(path: string, contents: Buffer | string): void {
  writeFileSync(`${path}.next`, contents);
  renameSync(`${path}.next`, path);
}

const base: AgentOptions = { address: "127.0.0.1:1", name: "tls-opts", tenants: ["t1"], handlers: { dag: async () => 1 } };

describe("the tls option", () => {
  it("makes bare addresses https://, keeps https:// ones, and reads the files at once", () => {
    const o = resolveOptions({ ...base, address: undefined, addresses: ["127.0.0.1:7400", "https://b.example:7400/"], tls: { ca: pki.ca.cert } });
    expect(o.urls).toEqual(["https://127.0.0.1:7400", "https://b.example:7400"]);
    expect(o.addresses).toEqual(["127.0.0.1:7400", "https://b.example:7400/"]);
    expect(o.tls?.current().ca?.equals(pki.ca.certPem)).toBe(true);
    expect(resolveOptions(base).urls).toEqual(["http://127.0.0.1:1"]);
    expect(resolveOptions({ ...base, address: "https://127.0.0.1:1" })).toMatchObject({ urls: ["https://127.0.0.1:1"], tls: undefined });
  });

  it("refuses an http:// address with tls, a certificate without its key, and files that do not read or parse, naming the option and the path", () => {
    const missing = join(scratch, "missing.pem");
    const garbage = join(scratch, "garbage.pem");
    writeFileSync(garbage, "not a certificate\n");
    const refused =
      (tls: AgentOptions["tls"], address = "127.0.0.1:1") =>
      () =>
        resolveOptions({ ...base, address, tls });
    expect(refused({ ca: pki.ca.cert }, "http://127.0.0.1:1")).toThrow(
      "createAgent: address 'http://127.0.0.1:1' is plaintext (http://), but tls is given: write https:// or leave the scheme out",
    );
    expect(() => resolveOptions({ ...base, address: undefined, addresses: ["https://a:1", "http://b:1"], tls: {} })).toThrow(
      "createAgent: addresses 'http://b:1' is plaintext",
    );
    expect(refused({ cert: certs.gpu.cert })).toThrow("createAgent: tls.cert and tls.key go together: give both (got only tls.cert)");
    expect(refused({ key: certs.gpu.key })).toThrow("createAgent: tls.cert and tls.key go together: give both (got only tls.key)");
    expect(refused({ ca: missing })).toThrow(`createAgent: tls.ca: cannot read ${missing} (ENOENT`);
    expect(refused({ ca: garbage })).toThrow(`createAgent: tls.ca (${garbage}) holds no PEM certificate`);
    expect(refused({ cert: garbage, key: certs.gpu.key })).toThrow(`createAgent: tls.cert (${garbage}) is not a PEM certificate`);
    expect(refused({ cert: certs.gpu.cert, key: certs.cpu.key })).toThrow(
      `createAgent: tls.cert (${certs.gpu.cert}) and tls.key (${certs.cpu.key}) do not belong together`,
    );
    expect(refused({ cert: certs.gpu.certPem, key: Buffer.from("nope") })).toThrow("createAgent: tls.key is not a PEM private key");
    expect(refused({ ca: pki.ca.cert, serverName: "" })).toThrow("createAgent: tls.serverName must be a host name");
  });
});

/**
 * A TLS server of the test's own that asks for a client certificate signed by `pki`'s CA and
 * answers every request with the serial the connection presented.
 */
async function serialServer(): Promise<{ url: string; close(): Promise<void> }> {
  const server = http2.createSecureServer({
    cert: serverCert.certPem,
    key: serverCert.keyPem,
    ca: pki.ca.certPem,
    requestCert: true,
    rejectUnauthorized: true,
  });
  server.on("stream", (stream) => {
    const socket = stream.session?.socket as TLSSocket;
    stream.respond({ ":status": 200 });
    stream.end(socket.getPeerCertificate().serialNumber);
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    url: `https://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

/** The serial the session presented, asked over `sessions` as the SDK's transport asks (a request on its current session). */
async function presented(sessions: Http2SessionManager): Promise<string> {
  const stream = await sessions.request("GET", "/", {}, {});
  // A session aborted later errors its streams; this one is done with by then.
  stream.on("error", () => {});
  stream.end();
  let body = "";
  for await (const chunk of stream) body += String(chunk);
  return body;
}

const serialOf = (pair: CertPair) => new X509Certificate(pair.certPem).serialNumber;

describe("rotating the client certificate", () => {
  let server: Awaited<ReturnType<typeof serialServer>>;
  beforeAll(async () => {
    server = await serialServer();
  });
  afterAll(() => server.close());

  /** Sessions to the serial server presenting `material`, as Link makes them. */
  const sessionsWith = (material: TlsMaterial) =>
    new GuardedSessionManager(server.url, {}, { createConnection: (authority: URL) => material.connect(authority) });

  it("a new connection presents the files as they are then; an open one keeps what it presented; calls never re-read", async () => {
    const paths = ownCopy(certs.gpu);
    const reloads: string[][] = [];
    const material = new TlsMaterial({ ca: pki.ca.cert, ...paths }, { reloaded: (parts) => reloads.push(parts) });
    material.load();
    const sessions = sessionsWith(material);
    expect(await presented(sessions)).toBe(serialOf(certs.gpu));

    replace(paths.cert, certs.gpuNext.certPem);
    replace(paths.key, certs.gpuNext.keyPem);
    // The open connection goes on with the certificate it presented, and reads nothing.
    expect(await presented(sessions)).toBe(serialOf(certs.gpu));
    expect(reloads).toEqual([]);

    sessions.abort();
    expect(await presented(sessions)).toBe(serialOf(certs.gpuNext));
    expect(reloads).toEqual([["cert", "key"]]);
    // Nothing changed since: the next connection reads nothing again.
    sessions.abort();
    expect(await presented(sessions)).toBe(serialOf(certs.gpuNext));
    expect(reloads).toHaveLength(1);
    sessions.abort();
  });

  it("an agent refused in the handshake (no client certificate: the server's alert) says the handshake failed and names tls.cert and tls.key", async () => {
    const log = captureLog("warn");
    const agent = testAgent(server.url, { logger: log.log, tls: { ca: pki.ca.cert }, handlers: { x: async () => 1 } });
    const lines = await loggedThenStop(agent, log, /no daemon reachable/);
    expect(lines.find((l) => /no daemon reachable/.test(l))).toMatch(
      /the TLS handshake failed: the daemon refused this agent's client certificate \(tlsv13 alert certificate required\): give tls\.cert and tls\.key/,
    );
    expect(agent.registration).toBeUndefined();
  });

  it("a file that does not parse, or a certificate swapped before its key, leaves the last good pair in use, with one warning", async () => {
    const paths = ownCopy(certs.gpu);
    const warnings: string[] = [];
    const material = new TlsMaterial({ ca: pki.ca.cert, ...paths }, { warn: (m) => warnings.push(m) });
    material.load();
    const sessions = sessionsWith(material);
    expect(await presented(sessions)).toBe(serialOf(certs.gpu));

    // Half a rotation: the new certificate, the old key.
    replace(paths.cert, certs.gpuNext.certPem);
    sessions.abort();
    expect(await presented(sessions)).toBe(serialOf(certs.gpu));
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain(`tls.cert (${paths.cert}) and tls.key (${paths.key}) do not belong together`);
    expect(warnings[0]).toContain("new connections keep the certificates last read");

    // Still failing (now unreadable): no second warning.
    replace(paths.key, "-----BEGIN PRIVATE KEY-----\ntruncated");
    sessions.abort();
    expect(await presented(sessions)).toBe(serialOf(certs.gpu));
    rmSync(paths.key);
    sessions.abort();
    expect(await presented(sessions)).toBe(serialOf(certs.gpu));
    expect(warnings).toHaveLength(1);

    // The rotation completes: the next connection presents the new pair.
    replace(paths.key, certs.gpuNext.keyPem);
    sessions.abort();
    expect(await presented(sessions)).toBe(serialOf(certs.gpuNext));
    // And a later failure warns again.
    replace(paths.cert, "garbage");
    sessions.abort();
    expect(await presented(sessions)).toBe(serialOf(certs.gpuNext));
    expect(warnings).toHaveLength(2);
    sessions.abort();
  });
});

/** A producer over TLS: QueueService with the engine token, presenting a certificate of no identity when the daemon asks for one. */
class TlsProducer {
  readonly #sessions: Http2SessionManager;
  readonly queue: Client<typeof QueueService>;

  constructor(address: string, client?: CertPair) {
    const baseUrl = `https://${address}`;
    this.#sessions = new Http2SessionManager(baseUrl, {}, { ca: pki.ca.certPem, cert: client?.certPem, key: client?.keyPem });
    const transport = createGrpcTransport({
      baseUrl,
      sessionManager: this.#sessions,
      interceptors: [(next) => (req) => (req.header.set("authorization", `Bearer ${TOKENS.engine}`), next(req))],
    });
    this.queue = createClient(QueueService, transport);
  }

  async enqueue(engineKind: string): Promise<string> {
    const res = await this.queue.enqueue({ tenantKey: "t1", items: [{ engineKind }] });
    return res.results[0]!.id;
  }

  /** The item once finished (Wait long-polls). */
  async done(id: string) {
    for (;;) {
      const res = await this.queue.wait({ tenantKey: "t1", ids: [id], timeout: { seconds: 5n } });
      if (res.done) return res.items[0]!;
    }
  }

  close(): void {
    this.#sessions.abort();
  }
}

const fx = useTestDb("sdktls");
const daemonConfig = (instanceId: string, extra: Partial<import("../../src/config.js").Config> = {}) => ({
  instanceId,
  tlsCert: serverCert.cert,
  tlsKey: serverCert.key,
  heartbeatInterval: 500,
  heartbeatFlush: 50,
  sweepInterval: 50,
  ...extra,
});

/** Waits until `agent` logged a line matching `re`, then stops it; the lines it logged. */
async function loggedThenStop(agent: Agent, log: ReturnType<typeof captureLog>, re: RegExp): Promise<string[]> {
  const starting = agent.start();
  await until(`the agent logged ${re}`, () => log.raw().some((l) => re.test(l)));
  await agent.stop();
  await starting;
  return log.raw();
}

describe("a daemon serving TLS", () => {
  let daemon: Daemon;
  let producer: TlsProducer;
  beforeAll(async () => {
    daemon = await fx.startDaemon({ config: daemonConfig("sdk-tls") });
    producer = fx.closers.add(new TlsProducer(daemon.address));
  });

  it("an agent given the CA connects over https:// (its address bare) and runs work", async () => {
    const agent = testAgent(daemon.address, { tls: { ca: pki.ca.cert }, engineKinds: ["tls-plain"], handlers: { "tls-plain": async () => "over tls" } });
    await agent.start();
    const done = await producer.done(await producer.enqueue("tls-plain"));
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, resultJson: JSON.stringify("over tls") });
    // The heartbeat thread's own connection is TLS too.
    await until("a heartbeat landed", async () => ((await agentRow(fx.db, agent.name))?.metrics ?? null) !== null);
  });

  it("serverName: the daemon's certificate is checked against it instead of the address's host", async () => {
    const agent = testAgent(daemon.address, { tls: { ca: pki.ca.cert, serverName: "localhost" }, handlers: { x: async () => 1 } });
    await agent.start();
    expect(agent.registration?.address).toBe(daemon.address);
    const log = captureLog("warn");
    const elsewhere = testAgent(daemon.address, { logger: log.log, tls: { ca: pki.ca.cert, serverName: "elsewhere.example" }, handlers: { x: async () => 1 } });
    const lines = await loggedThenStop(elsewhere, log, /no daemon reachable/);
    expect(lines.find((l) => /no daemon reachable/.test(l))).toMatch(
      /the daemon's certificate is not trusted \(Hostname\/IP does not match certificate's altnames: Host: elsewhere\.example.*tls\.serverName/,
    );
  });

  it("an agent that does not trust the daemon's CA says the handshake failed and names tls.ca", async () => {
    const log = captureLog("warn");
    const agent = testAgent(`https://${daemon.address}`, { logger: log.log, tls: { ca: stranger.ca.cert }, handlers: { x: async () => 1 } });
    const lines = await loggedThenStop(agent, log, /no daemon reachable/);
    expect(lines.find((l) => /no daemon reachable/.test(l))).toMatch(
      /the TLS handshake failed: the daemon's certificate is not trusted \(.*\): give the CA that signed it as tls\.ca/,
    );
    expect(agent.registration).toBeUndefined();
  });
});

describe("a daemon serving h2c", () => {
  it("an agent dialling it as https:// says the daemon does not speak TLS there", async () => {
    const plain = await fx.startDaemon({ config: { instanceId: "sdk-h2c" } });
    const log = captureLog("warn");
    const agent = testAgent(`https://${plain.address}`, { logger: log.log, tls: { ca: pki.ca.cert }, handlers: { x: async () => 1 } });
    const lines = await loggedThenStop(agent, log, /no daemon reachable/);
    expect(lines.find((l) => /no daemon reachable/.test(l))).toMatch(/the TLS handshake failed: the daemon does not speak TLS there \(.+\): is it serving h2c/);
    await plain.stop();
  });
});

describe("a daemon serving mutual TLS", () => {
  let daemon: Daemon;
  let producer: TlsProducer;
  const config = () => daemonConfig("sdk-mtls", { tlsClientCa: pki.ca.cert });
  beforeAll(async () => {
    daemon = await fx.startDaemon({ config: config() });
    producer = fx.closers.add(new TlsProducer(daemon.address, certs.producer));
  });

  it("an agent whose certificate names spiffe://aiflow/agent/gpu-* registers gpu-… with no token, heartbeats and runs an item", async () => {
    const agent = testAgent(daemon.address, {
      token: undefined,
      name: agentName("gpu"),
      tls: { ca: pki.ca.cert, cert: certs.gpu.cert, key: certs.gpu.key },
      engineKinds: ["mtls-gpu"],
      handlers: { "mtls-gpu": async (item) => ({ ran: item.engineKind }) },
    });
    await agent.start();
    expect(agent.registration?.created).toBe(true);
    const done = await producer.done(await producer.enqueue("mtls-gpu"));
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED });
    expect(JSON.parse(done.resultJson)).toEqual({ ran: "mtls-gpu" });
    await until("a heartbeat landed", async () => ((await agentRow(fx.db, agent.name))?.metrics ?? null) !== null);
  });

  it("the same certificate cannot register cpu-…: PERMISSION_DENIED fails the start", async () => {
    const agent = testAgent(daemon.address, {
      token: undefined,
      name: agentName("cpu"),
      tls: { ca: pki.ca.cert, ...certs.gpu },
      handlers: { x: async () => 1 },
    });
    const err = await agent.start().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(AgentFailedError);
    expect((err as Error).message).toMatch(/refused to register agent 'cpu-[^']+': \[permission_denied\]/);
    expect(agent.state).toBe("failed");
  });

  it("an agent with no client certificate, or one another CA signed, is refused in the handshake: it says it cannot connect", async () => {
    for (const tls of [{ ca: pki.ca.cert }, { ca: pki.ca.cert, cert: certs.stranger.cert, key: certs.stranger.key }]) {
      const refusedBefore = daemon.serverStats.tlsRefused;
      const log = captureLog("warn");
      const agent = testAgent(daemon.address, { logger: log.log, name: agentName("gpu"), tls, handlers: { x: async () => 1 } });
      await loggedThenStop(agent, log, /no daemon reachable: .*retrying/);
      expect(agent.registration).toBeUndefined();
      // The daemon closes such a connection as its handshake ends, without an alert the agent could
      // read a reason from (the daemon logs it); that it was this refusal shows in its count.
      expect(daemon.serverStats.tlsRefused).toBeGreaterThan(refusedBefore);
    }
  });

  it("a rotated certificate is what the next connection presents: after the daemon restarts, the agent registers under the new one", async () => {
    const paths = ownCopy(certs.gpu);
    const name = agentName("gpu");
    const agent = testAgent(daemon.address, { token: undefined, name, tls: { ca: pki.ca.cert, ...paths }, handlers: { x: async () => 1 } });
    await agent.start();
    // The new pair names cpu-* only, so the daemon refusing gpu-… proves it is the one presented.
    replace(paths.cert, certs.cpu.certPem);
    replace(paths.key, certs.cpu.keyPem);
    const port = daemon.port;
    await daemon.stop();
    daemon = await fx.startDaemon({ config: { ...config(), listen: { host: "127.0.0.1", port } } });
    await until("the agent failed", () => agent.state === "failed");
    expect(agent.error?.message).toMatch(new RegExp(`refused to register agent '${name}': \\[permission_denied\\]`));
  });

  it("fails over from a TLS address that refuses connections to one that serves", async () => {
    const dead = `https://127.0.0.1:${await freePort()}`;
    const agent = testAgent([dead, daemon.address], {
      token: undefined,
      // Its home is the dead address: it starts there, and fails over.
      name: homedName("gpu", 0, 2),
      tls: { ca: pki.ca.certPem, cert: certs.gpu.certPem, key: certs.gpu.keyPem },
      engineKinds: ["mtls-failover"],
      handlers: { "mtls-failover": async () => "second" },
    });
    await agent.start();
    expect(agent.registration?.address).toBe(daemon.address);
    const done = await producer.done(await producer.enqueue("mtls-failover"));
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, resultJson: JSON.stringify("second") });
  });
});
