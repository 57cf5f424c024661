/**
 * The HTTP endpoints beside the gRPC port: the probes (/healthz, /readyz turning not-ready while the
 * database is away and ready again when it returns), who may read /metrics (a metrics token; under
 * mutual TLS an ops certificate), HTTPS with the gRPC port's certificate and its reloads, and the
 * settings refused at start.
 */
import { X509Certificate } from "node:crypto";
import { copyFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import tls from "node:tls";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import { ConfigError } from "../src/config.js";
import type { Daemon } from "../src/daemon.js";
import { latestVersion } from "../src/db/migrate.js";
import { silentLogger } from "../src/log.js";
import { Readiness } from "../src/observability/readiness.js";
import { until, useTestDb } from "./support/kit.js";
import { httpGet, scrapeMetrics } from "./support/metrics.js";
import { Pki } from "./support/pki.js";
import { startTcpProxy, type TcpProxy } from "./support/tcp-proxy.js";

const f = useTestDb("httpendpoints");
const HTTP = { httpListen: { host: "127.0.0.1", port: 0 } };
const readyz = async (d: Daemon) => {
  const r = await httpGet(`${d.httpUrl}/readyz`);
  return { status: r.status, body: JSON.parse(r.text) as { status: string; checks: Record<string, string> } };
};

describe("the probes", () => {
  let proxy: TcpProxy;
  let daemon: Daemon;
  beforeAll(async () => {
    proxy = await startTcpProxy(f.db.url);
    f.closers.defer(() => proxy.close());
    daemon = await f.startDaemon({ config: { ...HTTP, databaseUrl: proxy.url, dbPoolSize: 2 } });
  });
  afterAll(() => proxy.refuse(null));

  it("/healthz answers 200 and /readyz says ready, check by check", async () => {
    expect(await httpGet(`${daemon.httpUrl}/healthz`)).toMatchObject({ status: 200, text: "ok\n" });
    expect(await readyz(daemon)).toEqual({ status: 200, body: { status: "ready", checks: { shutdown: "ok", database: "ok", schema: "ok", listen: "ok" } } });
  });

  it("/readyz turns not-ready while the database is away, saying why without its address, and ready again once it is back", async () => {
    proxy.refuse("close");
    proxy.cut();
    let down = await readyz(daemon);
    await until("/readyz says the database is away", async () => /unavailable|did not answer/.test((down = await readyz(daemon)).body.checks.database!));
    expect(down.status).toBe(503);
    expect(down.body.status).toBe("not ready");
    expect(down.body.checks.database).toMatch(/the database is unavailable/);
    expect(JSON.stringify(down.body)).not.toMatch(/127\.0\.0\.1|:\d{4,5}/);
    // /healthz is the process, not its dependencies.
    expect((await httpGet(`${daemon.httpUrl}/healthz`)).status).toBe(200);
    proxy.refuse(null);
    await until("/readyz says ready again", async () => (await readyz(daemon)).status === 200, 20_000, 50);
    const m = await scrapeMetrics(daemon.httpUrl!);
    expect(m.series("aiflow_listen_reconnects_total")).toBeGreaterThanOrEqual(1);
  });

  it("a daemon shutting down, or on a schema older or newer than it was built for, is not ready", async () => {
    const base = { pool: daemon.pool, tables: daemon.tables, clock: new FakeClock(), listening: () => true, log: silentLogger() };
    const stopping = new AbortController();
    stopping.abort();
    expect((await new Readiness({ ...base, draining: stopping.signal }).report()).checks.shutdown).toBe("shutting down");
    const open = new AbortController().signal;
    const older = await new Readiness({ ...base, draining: open, expectedVersion: latestVersion() + 1 }).report();
    expect(older).toMatchObject({ ready: false, checks: { schema: expect.stringMatching(/older than this aiflowd needs .*aiflowd migrate/) } });
    const newer = await new Readiness({ ...base, draining: open, expectedVersion: latestVersion() - 1 }).report();
    expect(newer).toMatchObject({ ready: false, checks: { schema: expect.stringMatching(/newer than this aiflowd knows .*upgrade aiflowd/) } });
    expect((await new Readiness({ ...base, draining: open, listening: () => false }).report()).checks.listen).toMatch(/LISTEN connection is down/);
  });
});

describe("--metrics-token", () => {
  const token = "metrics-secret-0123456789";
  let daemon: Daemon;
  beforeAll(async () => {
    daemon = await f.startDaemon({ config: { ...HTTP, metricsToken: token } });
  });

  it("/metrics needs the token as a bearer token; the probes need nothing", async () => {
    const none = await httpGet(`${daemon.httpUrl}/metrics`);
    expect(none.status).toBe(401);
    expect(none.headers["www-authenticate"]).toMatch(/^Bearer /);
    expect(none.text).toMatch(/metrics token/);
    expect((await httpGet(`${daemon.httpUrl}/metrics`, { headers: { authorization: "Bearer metrics-secret-wrong-value" } })).status).toBe(401);
    expect((await httpGet(`${daemon.httpUrl}/metrics`, { headers: { authorization: token } })).status).toBe(401);
    const m = await scrapeMetrics(daemon.httpUrl!, { headers: { authorization: `Bearer ${token}` } });
    expect(m.family("aiflow_agents")).toBeDefined();
    expect((await httpGet(`${daemon.httpUrl}/readyz`)).status).toBe(200);
    expect((await httpGet(`${daemon.httpUrl}/healthz`)).status).toBe(200);
  });
});

describe("--metrics-listen", () => {
  it("serves /metrics and the probes on an address of its own, behind the metrics token; the webhook port answers /metrics 404 and keeps its webhooks, console and probes", async () => {
    const token = "metrics-secret-0123456789";
    const daemon = await f.startDaemon({ config: { ...HTTP, metricsListen: { host: "127.0.0.1", port: 0 }, metricsToken: token } });
    expect(daemon.metricsUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(daemon.metricsUrl).not.toBe(daemon.httpUrl);
    const m = await scrapeMetrics(daemon.metricsUrl!, { headers: { authorization: `Bearer ${token}` } });
    expect(m.family("aiflow_agents")).toBeDefined();
    expect((await httpGet(`${daemon.metricsUrl}/metrics`)).status).toBe(401);
    expect((await httpGet(`${daemon.metricsUrl}/readyz`)).status).toBe(200);
    // Nothing but the scrape and the probes there.
    expect((await httpGet(`${daemon.metricsUrl}/console/`)).status).toBe(404);
    expect((await httpGet(`${daemon.metricsUrl}/hooks/t/h`, { method: "POST" })).status).toBe(404);

    const onWebhookPort = await httpGet(`${daemon.httpUrl}/metrics`, { headers: { authorization: `Bearer ${token}` } });
    expect(onWebhookPort).toMatchObject({ status: 404, text: expect.stringMatching(/--metrics-listen/) });
    expect((await httpGet(`${daemon.httpUrl}/healthz`)).status).toBe(200);
    expect((await httpGet(`${daemon.httpUrl}/console/`)).status).not.toBe(404);
    // An unknown trigger: the webhook route still answers there.
    expect((await httpGet(`${daemon.httpUrl}/hooks/t/nope`, { method: "POST" })).text).toMatch(/no webhook trigger|signature|unsigned/);
  });

  it("off loopback without TLS is refused at start, naming --metrics-listen", async () => {
    await expect(f.startDaemon({ config: { metricsListen: { host: "0.0.0.0", port: 0 }, tlsCert: undefined } })).rejects.toThrow(/--metrics-listen.*TLS/);
  });
});

describe("over TLS", () => {
  const pki = Pki.create();
  const other = Pki.create("another-ca");
  const server = pki.server();
  const second = pki.server("server-2");
  const ops = pki.client("ops", { uris: ["spiffe://aiflow/ops/prometheus"] });
  const agent = pki.client("agent", { uris: ["spiffe://aiflow/agent/gpu-1"] });
  const stranger = other.client("stranger", { uris: ["spiffe://aiflow/ops/prometheus"] });
  const live = { cert: join(pki.dir, "live.crt"), key: join(pki.dir, "live.key") };
  copyFileSync(server.cert, live.cert);
  copyFileSync(server.key, live.key);
  afterAll(() => {
    pki.close();
    other.close();
  });
  const ca = () => ({ ca: pki.ca.certPem });

  it("serves HTTPS with the gRPC port's certificate, refuses plain HTTP, and serves the new certificate after a reload", async () => {
    const daemon = await f.startDaemon({ config: { ...HTTP, tlsCert: live.cert, tlsKey: live.key } });
    expect(daemon.httpUrl).toMatch(/^https:\/\//);
    const port = Number(new URL(daemon.httpUrl!).port);
    const served = () =>
      new Promise<string>((resolve, reject) => {
        const s = tls.connect({ host: "127.0.0.1", port, ca: pki.ca.certPem, servername: "localhost" }, () => {
          resolve(new X509Certificate(s.getPeerX509Certificate()!.raw).serialNumber);
          s.end();
        });
        s.on("error", reject);
      });
    const serial = (pem: Buffer) => new X509Certificate(pem).serialNumber;
    expect(await served()).toBe(serial(server.certPem));
    expect((await scrapeMetrics(daemon.httpUrl!, { tls: ca() })).family("aiflow_agents")).toBeDefined();
    await expect(httpGet(`${daemon.httpUrl!.replace("https:", "http:")}/healthz`)).rejects.toThrow();
    copyFileSync(second.cert, live.cert);
    copyFileSync(second.key, live.key);
    expect(daemon.reloadTls()).toBe("reloaded");
    expect(await served()).toBe(serial(second.certPem));
    expect((await httpGet(`${daemon.httpUrl}/healthz`, { tls: ca() })).status).toBe(200);
  });

  it("under mutual TLS, /metrics takes an ops certificate and no other; the probes take a caller without one", async () => {
    const daemon = await f.startDaemon({ config: { ...HTTP, tlsCert: server.cert, tlsKey: server.key, tlsClientCa: pki.ca.cert } });
    const url = `${daemon.httpUrl}/metrics`;
    expect((await scrapeMetrics(daemon.httpUrl!, { tls: { ...ca(), cert: ops.certPem, key: ops.keyPem } })).family("aiflow_agents")).toBeDefined();
    expect((await httpGet(url, { tls: { ...ca(), cert: agent.certPem, key: agent.keyPem } })).status).toBe(401);
    expect((await httpGet(url, { tls: { ...ca(), cert: stranger.certPem, key: stranger.keyPem } })).status).toBe(401);
    const bare = await httpGet(url, { tls: ca() });
    expect(bare.status).toBe(401);
    expect(bare.text).toMatch(/ops client certificate/);
    expect((await httpGet(`${daemon.httpUrl}/readyz`, { tls: ca() })).status).toBe(200);
  });
});

describe("settings refused at start", () => {
  it("a non-loopback --http-listen without TLS, and a port in use, each name --http-listen", async () => {
    const open = f.startDaemon({ config: { httpListen: { host: "0.0.0.0", port: 0 }, tlsCert: undefined } });
    await expect(open).rejects.toThrow(ConfigError);
    await expect(open).rejects.toThrow(/--http-listen.*TLS/);
    const taken = createServer();
    await new Promise<void>((r) => taken.listen(0, "127.0.0.1", r));
    try {
      const port = (taken.address() as { port: number }).port;
      await expect(f.startDaemon({ config: { httpListen: { host: "127.0.0.1", port } } })).rejects.toThrow(
        new RegExp(`--http-listen.*127\\.0\\.0\\.1:${port} is in use`),
      );
    } finally {
      taken.close();
    }
  });
});
