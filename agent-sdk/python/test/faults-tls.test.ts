/**
 * The Python agent through faults and over TLS: a daemon killed with SIGKILL mid-item and started
 * again on its port, a first address that refuses connections, a daemon serving TLS and one
 * serving mutual TLS (certificates made for this file by openssl, test/support/pki.ts).
 *
 * Producers enqueue through a plaintext daemon on the same schema: what the agent's daemon pushes
 * it learns of from the database, as a daemon of a cluster does.
 */
import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../../../src/daemon.js";
import { agentRow } from "../../../test/support/agents.js";
import { freePort } from "../../../test/support/free-port.js";
import { useTestDb } from "../../../test/support/kit.js";
import { Pki } from "../../../test/support/pki.js";
import { spawnDaemon } from "../../test/daemon-process.js";
import { Producer, WorkItemStatus } from "../../test/support.js";
import { PythonAgent } from "./python-agent.js";

const fx = useTestDb("pyfaults");
let plain: Daemon;
let producer: Producer;
let seq = 0;
const agentName = (what: string) => `py-${what}-${++seq}`;

beforeAll(async () => {
  plain = await fx.startDaemon({ config: { instanceId: "py-plain", heartbeatInterval: 500, heartbeatFlush: 50, sweepInterval: 50 } });
  producer = fx.closers.add(new Producer(plain.address, "t1"));
});

describe("a daemon killed and started again", () => {
  let child: ChildProcess | undefined;
  afterAll(async () => {
    if (child && child.exitCode === null && child.signalCode === null) {
      child.kill("SIGKILL");
      await once(child, "exit");
    }
  });

  it("mid-item (SIGKILL): the handler keeps running, the agent registers again with the daemon back on its port, reports the result there and takes work again", async () => {
    const port = await freePort();
    // The daemon is back well within the agent's liveness window (a few heartbeat intervals) and its
    // lease: an outage longer than that makes the restarted daemon judge the agent gone, and give its
    // item back with a redelivery spent, as it should.
    const timings = { heartbeatInterval: "10s", leaseTtl: "60s" };
    child = await spawnDaemon(fx.db.schema, port, "py-killed-1", timings);
    const address = `127.0.0.1:${port}`;
    const name = agentName("survivor");
    const py = PythonAgent.start(address, { name, engine_kinds: ["py-survive"], reconnect: { initial: 0.05, max: 0.5 } });
    const first = await py.next("registered", (e) => e.event === "registered");
    await py.state("running");
    const [id] = await producer.enqueue([{ engineKind: "py-survive", payloadJson: JSON.stringify({ block: true }) }]);
    await py.started(id!);

    child.kill("SIGKILL");
    await once(child, "exit");
    await py.next("the agent noticed", (e) => e.event === "disconnected");
    // It finishes while no daemon is there: its report waits for one.
    py.send(`release ${id}`);
    child = await spawnDaemon(fx.db.schema, port, "py-killed-2", timings);

    const [done] = await producer.waitDone([id!], 30_000);
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, agentId: name, retryCount: 0, redeliveryCount: 0 });
    expect(await py.finished(id!)).toMatchObject({ outcome: "completed" });
    const again = py.events.filter((e) => e.event === "registered");
    expect(again.length).toBeGreaterThanOrEqual(2);
    expect(again.at(-1)).toMatchObject({ id: first.id, created: false });
    expect(py.events.filter((e) => e.event === "state").map((e) => e.state)).toEqual(["starting", "running"]);

    const [next] = await producer.enqueue([{ engineKind: "py-survive" }]);
    expect((await producer.waitDone([next!], 30_000))[0]).toMatchObject({ status: WorkItemStatus.COMPLETED, agentId: name });
    py.send("drain");
    expect(await py.exited).toBe(0);
    expect((await agentRow(fx.db, name))?.status).toBe("inactive");
  });

  it("fails over from a first address that refuses connections to the second, which serves", async () => {
    const dead = `127.0.0.1:${await freePort()}`;
    const name = agentName("failover");
    const py = PythonAgent.start(dead, { name, address: undefined, addresses: [dead, plain.address], engine_kinds: ["py-failover"], reconnect: { initial: 0.05, max: 0.2 } });
    const registered = await py.next("registered", (e) => e.event === "registered");
    expect(registered.address).toBe(plain.address);
    const [id] = await producer.enqueue([{ engineKind: "py-failover" }]);
    expect((await producer.waitDone([id!]))[0]).toMatchObject({ status: WorkItemStatus.COMPLETED, agentId: name });
  });
});

describe("TLS", () => {
  const pki = Pki.create();
  const stranger = Pki.create("another-ca");
  const server = pki.server();
  const gpu = pki.client("gpu", { uris: ["spiffe://aiflow/agent/gpu-*"] });
  let tls: Daemon;
  let mtls: Daemon;
  beforeAll(async () => {
    const common = { heartbeatInterval: 500, heartbeatFlush: 50, sweepInterval: 50, tlsCert: server.cert, tlsKey: server.key };
    tls = await fx.startDaemon({ config: { ...common, instanceId: "py-tls" } });
    mtls = await fx.startDaemon({ config: { ...common, instanceId: "py-mtls", tlsClientCa: pki.ca.cert } });
  });
  afterAll(() => {
    pki.close();
    stranger.close();
  });

  it("an agent given the CA dials a bare address over TLS, heartbeats and runs work", async () => {
    const name = agentName("tls");
    const py = PythonAgent.start(tls.address, { name, tls: { ca: pki.ca.cert }, engine_kinds: ["py-tls"] });
    await py.state("running");
    const [id] = await producer.enqueue([{ engineKind: "py-tls", payloadJson: JSON.stringify({ over: "tls" }) }]);
    const [done] = await producer.waitDone([id!]);
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, agentId: name });
    expect(JSON.parse(done!.resultJson)).toMatchObject({ echo: { over: "tls" } });
  });

  it("under mutual TLS, a certificate naming spiffe://aiflow/agent/gpu-* registers gpu-… with no token and runs work", async () => {
    const name = `gpu-py-${++seq}`;
    const py = PythonAgent.start(mtls.address, { name, token: null, tls: { ca: pki.ca.cert, cert: gpu.cert, key: gpu.key }, engine_kinds: ["py-mtls"] });
    expect(await py.next("registered", (e) => e.event === "registered")).toMatchObject({ created: true });
    const [id] = await producer.enqueue([{ engineKind: "py-mtls" }]);
    expect((await producer.waitDone([id!]))[0]).toMatchObject({ status: WorkItemStatus.COMPLETED, agentId: name });
  });

  it("the same certificate cannot register cpu-…: the daemon's refusal fails the agent, which exits saying why", async () => {
    const py = PythonAgent.start(mtls.address, { name: `cpu-py-${++seq}`, token: null, tls: { ca: pki.ca.cert, cert: gpu.cert, key: gpu.key } });
    const failed = await py.next("the agent failed", (e) => e.event === "failed");
    expect(failed.error).toMatch(/refused to register agent 'cpu-py-\d+': PERMISSION_DENIED/);
    expect(await py.exited).toBe(1);
  });

  it("an agent that does not trust the daemon's CA says the handshake failed and names tls.ca, and keeps trying", async () => {
    const py = PythonAgent.start(tls.address, { name: agentName("untrusting"), tls: { ca: stranger.ca.cert }, reconnect: { initial: 0.05, max: 0.2 } });
    const line = await py.logged(/no daemon reachable/);
    expect(line).toMatch(/the TLS handshake failed: the daemon's certificate is not trusted: give the CA that signed it as tls\.ca/);
    expect(py.events.filter((e) => e.event === "state").map((e) => e.state)).toEqual(["starting"]);
    py.send("stop");
    expect(await py.exited).toBe(0);
  });
});
