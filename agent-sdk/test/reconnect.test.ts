/**
 * Surviving the daemon: a restart on the same address mid-work, a failover to a second daemon of
 * the same database, and a first address that is down from the start. Work in flight keeps running
 * meanwhile and is reported once a daemon answers again (its lease outlives the outage).
 */
import { beforeAll, describe, expect, it } from "vitest";
import { agentRow, captureLog } from "../../test/support/agents.js";
import type { TestDb } from "../../test/support/db.js";
import { freePort } from "../../test/support/free-port.js";
import { useTestDb } from "../../test/support/kit.js";
import type { Registration } from "../src/index.js";
import { callLog, deferred, finished, homedName, Producer, testAgent, until, WorkItemStatus } from "./support.js";

const fx = useTestDb("sdkreconn");
let db: TestDb;
beforeAll(() => {
  db = fx.db;
});

/** A daemon on the file's schema (stopped after the file's tests, if a test has not stopped it). */
const start = (instanceId: string, port = 0) =>
  fx.startDaemon({ config: { instanceId, listen: { host: "127.0.0.1", port }, heartbeatInterval: 2_000, heartbeatFlush: 50, sweepInterval: 50 } });

describe("daemon restart", () => {
  it("mid-work: the handler keeps running, the agent registers again with the new daemon on the same port and reports the result", async () => {
    const first = await start("restart-1");
    const producer = new Producer(first.address, "t1");
    const running = deferred();
    const gate = deferred();
    const registrations: Registration[] = [];
    let disconnects = 0;
    const agent = testAgent(first.address, {
      engineKinds: ["survivor"],
      handlers: {
        survivor: async (_item, ctx) => {
          running.resolve();
          await gate.promise;
          return { aborted: ctx.signal.aborted };
        },
      },
    });
    agent.on("registered", (r) => registrations.push(r));
    agent.on("disconnected", () => disconnects++);
    await agent.start();
    const [id] = await producer.enqueue([{ engineKind: "survivor" }]);
    await running.promise;
    producer.close();

    await first.stop();
    // The item finishes while no daemon is there: its report waits for one.
    gate.resolve();
    await until("the agent noticed", () => disconnects > 0);
    expect(agent.state).toBe("running");

    const second = await start("restart-2", first.port);
    const producer2 = new Producer(second.address, "t1");
    const [done] = await producer2.waitDone([id!]);
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, retryCount: 0 });
    expect(JSON.parse(done!.resultJson)).toEqual({ aborted: false });
    expect(registrations.length).toBeGreaterThanOrEqual(2);
    expect(registrations.at(-1)).toMatchObject({ address: first.address, created: false, id: registrations[0]!.id });
    expect(agent.state).toBe("running");

    // And it goes on working with the new daemon.
    const [next] = await producer2.enqueue([{ engineKind: "survivor" }]);
    expect((await producer2.waitDone([next!]))[0]?.status).toBe(WorkItemStatus.COMPLETED);
    producer2.close();
  });
});

describe("several addresses", () => {
  it("the first address is down from the start: the agent registers with the second and works", async () => {
    const live = await start("second-address");
    const dead = `127.0.0.1:${await freePort()}`;
    const producer = new Producer(live.address, "t1");
    // Its home is the dead address: it starts there, and fails over.
    const agent = testAgent([dead, live.address], {
      name: homedName("sdk", 0, 2),
      engineKinds: ["failover-start"],
      handlers: { "failover-start": async () => "served" },
    });
    await agent.start();
    expect(agent.registration?.address).toBe(live.address);
    const [id] = await producer.enqueue([{ engineKind: "failover-start" }]);
    expect((await producer.waitDone([id!]))[0]).toMatchObject({ status: WorkItemStatus.COMPLETED, resultJson: JSON.stringify("served") });
    // Its heartbeat thread found the live daemon too: the row's metrics come from heartbeats only.
    await until("a heartbeat landed", async () => ((await agentRow(db, agent.name))?.metrics ?? null) !== null);
    producer.close();
  });

  it("the daemon in use goes away mid-work: the agent fails over to the other one and reports there", async () => {
    const a = await start("failover-a");
    const b = await start("failover-b");
    const producer = new Producer(b.address, "t1");
    const running = deferred();
    const gate = deferred();
    const agent = testAgent([a.address, b.address], {
      name: homedName("sdk", 0, 2),
      engineKinds: ["failover-mid"],
      handlers: {
        "failover-mid": async () => {
          running.resolve();
          await gate.promise;
          return "reported elsewhere";
        },
      },
    });
    await agent.start();
    expect(agent.registration?.address).toBe(a.address);
    const [id] = await producer.enqueue([{ engineKind: "failover-mid" }]);
    await running.promise;
    await a.stop();
    gate.resolve();
    const [done] = await producer.waitDone([id!]);
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, resultJson: JSON.stringify("reported elsewhere") });
    expect(agent.registration?.address).toBe(b.address);
    producer.close();
  });
});

describe("shutting down without a daemon", () => {
  it("stop() while the daemon is gone still finishes, within the report and deregistration bounds", async () => {
    const d = await start("gone-at-stop");
    const producer = new Producer(d.address, "t1");
    const running = deferred();
    const calls = callLog();
    const log = captureLog();
    const agent = testAgent(d.address, {
      engineKinds: ["orphaned"],
      rpcTimeoutMs: 1_000,
      interceptors: [calls.interceptor],
      logger: log.log,
      handlers: {
        orphaned: async (_item, ctx) => {
          running.resolve();
          await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
        },
      },
    });
    await agent.start();
    const [id] = await producer.enqueue([{ engineKind: "orphaned" }]);
    await running.promise;
    const outcome = finished(agent, id!);
    producer.close();
    await d.stop();
    await agent.stop();
    expect(agent.state).toBe("stopped");
    // Each step that needs the daemon ended at its bound (rpcTimeoutMs) by giving up, not by an answer:
    // the release that cannot land leaves the item unreported (its lease brings it back) ...
    expect((await outcome).outcome).toEqual({ kind: "unreported", reason: "the daemon did not answer before the agent stopped" });
    // ... and the deregistration, tried and refused by a closed port, is given up.
    const deregistrations = calls.calls.filter((c) => c.method === "Deregister");
    expect(deregistrations.length).toBeGreaterThan(0);
    expect(deregistrations.map((c) => c.ended).filter((e) => e === "ok")).toEqual([]);
    expect(log.lines().map((l) => l.msg)).toContain("could not deregister: the daemon marks this agent inactive once its heartbeats stop");
  });

  it("stop() while the first registration is still being retried stops at once", async () => {
    const agent = testAgent(`127.0.0.1:${await freePort()}`, { engineKinds: ["never"], handlers: { never: () => undefined } });
    const starting = agent.start();
    await until("registration is being retried", () => agent.state === "starting");
    await agent.stop();
    await starting;
    expect(agent.state).toBe("stopped");
    expect(agent.registration).toBeUndefined();
  });
});
