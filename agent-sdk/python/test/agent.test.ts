/**
 * The Python agent library (agent-sdk/python) against a real daemon: each test runs worker.py in
 * Debian's Python on stock grpcio and watches it through its events, the daemon's rows and the
 * producer's view of the items.
 *
 * Lost-lease cases run on a daemon whose lease TTL is 30s and whose clock the test does not move:
 * renewals come every 10s of real time, so none lands while the test takes the lease away.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import type { Daemon } from "../../../src/daemon.js";
import type { TableName } from "../../../src/db/tables.js";
import { agentRow } from "../../../test/support/agents.js";
import { TOKENS } from "../../../test/support/daemon.js";
import { useTestDb } from "../../../test/support/kit.js";
import { Producer, until, WorkItemStatus } from "../../test/support.js";
import { PythonAgent } from "./python-agent.js";

const fx = useTestDb("pyagent");
/** Heartbeats every 200ms, sweeps every 50ms, leases of 30s. */
let daemon: Daemon;
let producer: Producer;
let seq = 0;
const agentName = (what: string) => `py-${what}-${++seq}`;

beforeAll(async () => {
  daemon = await fx.startDaemon({ config: { instanceId: "py-1", backoffBase: 1, backoffCap: 1, heartbeatInterval: 200, heartbeatFlush: 50, sweepInterval: 50, leaseTtl: 30_000 } });
  producer = fx.closers.add(new Producer(daemon.address, "t1"));
});

const table = (name: TableName) => fx.db.tables.qualified(name);

describe("a Python agent", () => {
  it("registers by name with its capacity, heartbeats its metrics, and completes the work pushed to it", async () => {
    const name = agentName("basic");
    const py = PythonAgent.start(daemon.address, {
      name,
      slots: 3,
      engine_kinds: ["py-basic"],
      tags: { zone: "a" },
      capacity: { cpu_millis: 4000, memory_mb: 8192, gpus: [{ index: 0, model: "Test GPU", memory_mb: 16384 }] },
      heartbeat_metrics: { gpus: [{ index: 0, model: "Test GPU", utilization: 12.5, memory_used_mb: 1024, memory_total_mb: 16384 }] },
    });
    const registered = await py.next("registered", (e) => e.event === "registered");
    expect(registered).toMatchObject({ created: true, status: "active", address: daemon.address });
    await py.state("running");

    const ids = await producer.enqueue(Array.from({ length: 30 }, (_, i) => ({ engineKind: "py-basic", payloadJson: JSON.stringify({ n: i }) })));
    const done = await producer.waitDone(ids);
    for (const [i, item] of done.entries()) {
      expect(item).toMatchObject({ status: WorkItemStatus.COMPLETED, agentId: name, retryCount: 0, redeliveryCount: 0 });
      expect(JSON.parse(item.resultJson)).toMatchObject({ by: name, echo: { n: ids.indexOf(item.id) }, attempt: 1 });
      expect(ids).toContain(done[i]!.id);
    }
    expect(py.count("started")).toBe(30);

    const row = await agentRow(fx.db, name);
    expect(row).toMatchObject({ status: "active", agenttype: "remote" });
    expect(row!.id).toBe(registered.id);
    expect(row!.metadata).toMatchObject({ slots: 3, tags: { zone: "a" }, tenants: ["t1"], engineKinds: ["py-basic", "pyasync"] });
    expect(JSON.stringify(row!.metadata)).toContain("Test GPU");
    // A heartbeat sent while the work ran reports it in flight; wait for one sent after it all finished.
    let metrics: Record<string, unknown> = {};
    await until("a heartbeat with GPU metrics and nothing in flight landed", async () => {
      metrics = ((await agentRow(fx.db, name))?.metrics ?? {}) as Record<string, unknown>;
      return JSON.stringify(metrics).includes("Test GPU") && metrics.inFlight === 0;
    });
    expect(metrics).toHaveProperty("cpu");
    expect(metrics).toHaveProperty("memory");
    expect(metrics).toMatchObject({ inFlight: 0, gpus: [{ index: 0, model: "Test GPU", utilization: 12.5 }] });
    expect((metrics as { disks: { mount: string }[] }).disks[0]?.mount).toBe("/");
  });

  it("fails retryable errors back to the queue, dead-letters the others, names what it handles for a kind it has no handler for, and runs async handlers", async () => {
    const name = agentName("outcomes");
    const py = PythonAgent.start(daemon.address, { name, slots: 2, engine_kinds: ["py-out"], unhandled_kinds: ["py-none"] });
    await py.state("running");
    const [retry, fatal, asyncId, orphan] = await producer.enqueue([
      { engineKind: "py-out", maxRetries: 1, payloadJson: JSON.stringify({ fail: "flaky disk", retryable: true }) },
      { engineKind: "py-out", maxRetries: 5, payloadJson: JSON.stringify({ fail: "bad input", retryable: false }) },
      { engineKind: "pyasync", payloadJson: JSON.stringify({ hello: "async" }) },
      { engineKind: "py-none", taskName: "resize", maxRetries: 5 },
    ]);
    const done = await producer.waitDone([retry!, fatal!, asyncId!, orphan!]);
    const byId = new Map(done.map((d) => [d.id, d]));
    // Retried once (its one retry), then failed for good.
    expect(byId.get(retry!)).toMatchObject({ status: WorkItemStatus.FAILED, retryCount: 1 });
    expect(byId.get(retry!)!.error).toContain("RuntimeError: flaky disk");
    expect(byId.get(fatal!)).toMatchObject({ status: WorkItemStatus.FAILED, retryCount: 0 });
    expect(byId.get(fatal!)!.error).toContain("NonRetryableError: bad input");
    expect(JSON.parse(byId.get(asyncId!)!.resultJson)).toEqual({ by: name, echo: { hello: "async" }, async: true });
    expect(byId.get(orphan!)).toMatchObject({ status: WorkItemStatus.FAILED, retryCount: 0 });
    expect(byId.get(orphan!)!.error).toContain("no handler for engine kind 'py-none', task 'resize': this agent handles py-out, pyasync");
    expect((await py.finished(fatal!)).outcome).toBe("failed");
  });

  it("a completion whose lease token moved is refused by the daemon: the item keeps the other holder's lease and no result", async () => {
    const name = agentName("zombie");
    const py = PythonAgent.start(daemon.address, { name, engine_kinds: ["py-zombie"] });
    await py.state("running");
    const [id] = await producer.enqueue([{ engineKind: "py-zombie", payloadJson: JSON.stringify({ block: true }) }]);
    await py.started(id!);
    // What another daemon re-dispatching the item would leave behind: a new fencing token, no directive.
    await fx.db.raw(`UPDATE ${table("work_item")} SET lease_token = 'somebody-else', agent_id = 'other-agent' WHERE id = $1`, [id]);
    py.send(`release ${id}`);
    const finished = await py.finished(id!);
    expect(finished).toMatchObject({ outcome: "lease-lost" });
    const [row] = await fx.db.raw<{ status: string; lease_token: string; agent_id: string; result: unknown }>(`SELECT status, lease_token, agent_id, result FROM ${table("work_item")} WHERE id = $1`, [id]);
    expect(row).toMatchObject({ status: "dispatched", lease_token: "somebody-else", agent_id: "other-agent", result: null });
  });

  it("a cancel directive reaches a running handler (sync and async) and nothing is reported for it", async () => {
    const name = agentName("cancel");
    const py = PythonAgent.start(daemon.address, { name, slots: 2, engine_kinds: ["py-cancel"] });
    await py.state("running");
    const [syncId, asyncId] = await producer.enqueue([
      { engineKind: "py-cancel", payloadJson: JSON.stringify({ block: true }) },
      { engineKind: "pyasync", payloadJson: JSON.stringify({ block: true }) },
    ]);
    await py.started(syncId!);
    await py.started(asyncId!);
    await producer.queue.cancel({ tenantKey: "t1", ids: [syncId!, asyncId!], reason: "user gave up" });
    const aborted = await py.next("the sync handler saw its cancellation", (e) => e.event === "aborted" && e.id === syncId);
    expect(aborted.reason).toMatch(/^cancelled: /);
    const cancelled = await py.next("the async handler's task was cancelled", (e) => e.event === "aborted" && e.id === asyncId);
    expect(cancelled).toMatchObject({ async_cancelled: true });
    expect(await py.finished(syncId!)).toMatchObject({ outcome: "cancelled" });
    expect(await py.finished(asyncId!)).toMatchObject({ outcome: "cancelled" });
    expect((await producer.get(syncId!)).status).toBe(WorkItemStatus.CANCELLED);
  });

  it("a handler holds its slot until it returns, even after its item was cancelled: the next item waits for it", async () => {
    const name = agentName("slot");
    const py = PythonAgent.start(daemon.address, { name, slots: 1, prefetch: 0, engine_kinds: ["py-slot"] });
    await py.state("running");
    const [zombie] = await producer.enqueue([{ engineKind: "py-slot", payloadJson: JSON.stringify({ block: true, ignore_abort: true }) }]);
    await py.started(zombie!);
    await producer.queue.cancel({ tenantKey: "t1", ids: [zombie!], reason: "changed my mind" });
    expect(await py.finished(zombie!)).toMatchObject({ outcome: "cancelled" });
    const [next] = await producer.enqueue([{ engineKind: "py-slot" }]);
    // Its handler still runs (it ignores the cancellation): the one slot is not free for the next item.
    py.send(`release ${zombie}`);
    expect(await py.finished(next!)).toMatchObject({ outcome: "completed" });
    const order = py.events.map((e) => `${e.event}:${e.id ?? ""}`);
    expect(order.indexOf(`returned:${zombie}`)).toBeGreaterThan(-1);
    expect(order.indexOf(`started:${next}`)).toBeGreaterThan(order.indexOf(`returned:${zombie}`));
    expect((await producer.get(zombie!)).status).toBe(WorkItemStatus.CANCELLED);
  });

  it("takes items ahead of a free slot once it has measured its handlers, and a drain gives back those still waiting, unstarted and unspent", async () => {
    const name = agentName("ahead");
    const py = PythonAgent.start(daemon.address, { name, slots: 1, prefetch: 8, engine_kinds: ["py-ahead"], on_daemon_drain: "exit" });
    await py.state("running");
    // Quick items first: the handler's time and the round trip are measured.
    await producer.waitDone(await producer.enqueue(Array.from({ length: 20 }, () => ({ engineKind: "py-ahead" }))));
    const [blocker] = await producer.enqueue([{ engineKind: "py-ahead", payloadJson: JSON.stringify({ block: true }) }]);
    await py.started(blocker!);
    const queued = await producer.enqueue(Array.from({ length: 8 }, () => ({ engineKind: "py-ahead" })));
    const heldByAgent = async () =>
      Number((await fx.db.raw<{ n: string }>(`SELECT count(*) AS n FROM ${table("work_item")} WHERE id = ANY($1) AND status = 'dispatched' AND agent_id = $2`, [queued, name]))[0]!.n);
    await until("the agent holds items ahead of its one slot", async () => (await heldByAgent()) > 0);
    const waiting = (await fx.db.raw<{ id: string }>(`SELECT id FROM ${table("work_item")} WHERE id = ANY($1) AND status = 'dispatched' AND agent_id = $2`, [queued, name])).map((r) => r.id);

    const ops = fx.clientAt(daemon.address, OpsService, TOKENS.ops);
    await ops.drainAgent({ name, reason: "ahead test" });
    for (const id of waiting) expect(await py.finished(id)).toMatchObject({ outcome: "released" });
    for (const id of waiting) expect(py.events.some((e) => e.event === "started" && e.id === id)).toBe(false);
    py.send("release all");
    expect(await py.exited).toBe(0);
    expect((await producer.get(blocker!)).status).toBe(WorkItemStatus.COMPLETED);
    for (const id of waiting) expect(await producer.get(id)).toMatchObject({ status: WorkItemStatus.PENDING, retryCount: 0, redeliveryCount: 0 });
  });

  it("an operator's drain with a deadline: it takes nothing more, gives the item still running back at the deadline without spending an attempt, and pauses; an undrain resumes it", async () => {
    const name = agentName("opsdrain");
    const py = PythonAgent.start(daemon.address, { name, slots: 2, engine_kinds: ["py-opsdrain"] });
    await py.state("running");
    const [stuck] = await producer.enqueue([{ engineKind: "py-opsdrain", payloadJson: JSON.stringify({ block: true }) }]);
    await py.started(stuck!);
    const ops = fx.clientAt(daemon.address, OpsService, TOKENS.ops);
    await ops.drainAgent({ name, deadline: durationFromMs(300), reason: "rolling deploy" });
    await py.state("draining");
    // Enqueued during the drain: nobody takes it while the only agent drains.
    const [later] = await producer.enqueue([{ engineKind: "py-opsdrain" }]);
    expect(await py.finished(stuck!)).toMatchObject({ outcome: "released" });
    await py.state("paused");
    expect(await producer.get(stuck!)).toMatchObject({ status: WorkItemStatus.PENDING, retryCount: 0, redeliveryCount: 0 });
    // Whoever gave it back, the daemon's sweep or the agent's own timer (LeaseRef.drain_deadline), the drain says so.
    expect((await ops.getAgent({ name })).agent?.drain?.releasedAtDeadline).toBe(1);
    expect(py.events.some((e) => e.event === "started" && e.id === later)).toBe(false);
    expect((await agentRow(fx.db, name))?.status).toBe("draining");

    py.send("release all");
    await ops.undrainAgent({ name });
    const done = await producer.waitDone([stuck!, later!]);
    expect(done.map((d) => d.status)).toEqual([WorkItemStatus.COMPLETED, WorkItemStatus.COMPLETED]);
    expect(done.map((d) => d.agentId)).toEqual([name, name]);
  });

  it("SIGTERM drains within graceful_shutdown: the item still running then goes back unspent, the agent deregisters and exits 0", async () => {
    const name = agentName("sigterm");
    const py = PythonAgent.start(daemon.address, { name, engine_kinds: ["py-term"], handle_signals: true, graceful_shutdown: 0.3 });
    await py.state("running");
    const [quick, stuck] = await producer.enqueue([{ engineKind: "py-term" }, { engineKind: "py-term", payloadJson: JSON.stringify({ block: true }) }]);
    expect((await producer.waitDone([quick!]))[0]?.status).toBe(WorkItemStatus.COMPLETED);
    await py.started(stuck!);
    py.signal("SIGTERM");
    expect(await py.finished(stuck!)).toMatchObject({ outcome: "released" });
    expect(await py.exited).toBe(0);
    const states = py.events.filter((e) => e.event === "state").map((e) => e.state);
    expect(states).toEqual(["starting", "running", "draining", "drained", "stopped"]);
    expect(await producer.get(stuck!)).toMatchObject({ status: WorkItemStatus.PENDING, retryCount: 0, redeliveryCount: 0 });
    expect((await agentRow(fx.db, name))?.status).toBe("inactive");
  });
});

describe("a Python agent's liveness", () => {
  let fast: Daemon;
  beforeAll(async () => {
    // A liveness window of 1.2 s and leases of 1 s (renewed every third): the handler below computes for 3 TTLs.
    fast = await fx.startDaemon({ config: { instanceId: "py-fast", heartbeatInterval: 400, heartbeatFlush: 50, sweepInterval: 50, leaseTtl: 1_000 } });
  });

  it("a handler computing for several lease TTLs keeps its lease: the liveness thread renews it, and the agent never looks dead", async () => {
    const name = agentName("spin");
    const py = PythonAgent.start(fast.address, { name, engine_kinds: ["py-spin"] });
    await py.state("running");
    const p = new Producer(fast.address, "t1");
    const [id] = await p.enqueue([{ engineKind: "py-spin", payloadJson: JSON.stringify({ spin: 3 }) }]);
    const [done] = await p.waitDone([id!], 30_000);
    p.close();
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, agentId: name, redeliveryCount: 0, retryCount: 0 });
    expect(await py.finished(id!)).toMatchObject({ outcome: "completed" });
    expect((await agentRow(fx.db, name))?.status).toBe("active");
  });
});
