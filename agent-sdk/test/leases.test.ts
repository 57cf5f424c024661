/**
 * Leases: a handler whose lease is lost is aborted and nothing is reported for it; a handler that
 * runs for several lease TTLs keeps its lease through renewals, which the heartbeat thread makes
 * (on a connection of its own, so the call logs here see none) except while it is down, when the
 * main thread makes them until a restarted thread is ready. blocked-handler.test.ts shows what
 * that buys: a handler blocking the event loop keeps its lease.
 *
 * The lost-lease tests run on daemons with a fake clock whose sweeps never fire on their own: the
 * test moves the clock past the TTL and runs the sweep, or takes the lease away in the database,
 * so what happens and when is decided by the test, not by timing.
 */
import type { Worker } from "node:worker_threads";
import { beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../../src/clock.js";
import type { Daemon } from "../../src/daemon.js";
import { captureLog } from "../../test/support/agents.js";
import { TOKENS } from "../../test/support/daemon.js";
import type { TestDb } from "../../test/support/db.js";
import { useTestDb } from "../../test/support/kit.js";
import { WorkAbortedError } from "../src/index.js";
import { callLog, deferred, finished, Producer, testAgent, until, WorkItemStatus } from "./support.js";

const clock = new FakeClock(Date.UTC(2026, 2, 1));
const fakeTime = useTestDb("sdklease");
const realTime = useTestDb("sdklease_rt");
let db: TestDb;
/** Lease TTL 30s: no renewal happens while a test runs (they come every 10s of real time). */
let sweeping: Daemon;
/** Lease TTL 300ms: renewals every 100ms. */
let renewing: Daemon;
/** A real clock and sweeps every 50ms. */
let realtime: Daemon;
/** The same, with a lease TTL that outlasts a heartbeat thread's death by far. */
let handover: Daemon;

beforeAll(async () => {
  db = fakeTime.db;
  // Heartbeats every minute: moving the fake clock past a lease TTL must not also make the agent look dead.
  const fake = { heartbeatInterval: 60_000, sweepInterval: 3_600_000, heartbeatFlush: 3_600_000 };
  sweeping = await fakeTime.startDaemon({ clock, config: { ...fake, instanceId: "sweeping", leaseTtl: 30_000 } });
  renewing = await fakeTime.startDaemon({ clock, config: { ...fake, instanceId: "renewing", leaseTtl: 300 } });
  realtime = await realTime.startDaemon({ config: { instanceId: "realtime", leaseTtl: 300, sweepInterval: 50, heartbeatInterval: 1_000 } });
  handover = await realTime.startDaemon({ config: { instanceId: "handover", leaseTtl: 1_500, sweepInterval: 50, heartbeatInterval: 1_000 } });
});

/** A handler that waits for its signal, then returns anyway (as careless code would). */
function waitsForAbort() {
  const started = deferred();
  const aborted = deferred<unknown>();
  const handler = async (_item: unknown, ctx: { signal: AbortSignal }) => {
    started.resolve();
    await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
    aborted.resolve(ctx.signal.reason);
    return "a result nobody may see";
  };
  return { started: started.promise, aborted: aborted.promise, handler };
}

const reportedIds = (calls: ReturnType<typeof callLog>) =>
  calls.calls
    .filter((c) => c.method === "Complete" || c.method === "Fail")
    .flatMap((c) => (c.message as { items: { workItemId: string }[] }).items.map((i) => i.workItemId));

describe("lease lost mid-handler", () => {
  it("the lease expires and is swept: the handler's signal aborts and its result is not reported", async () => {
    const producer = new Producer(sweeping.address, "t1");
    const calls = callLog();
    const h = waitsForAbort();
    const agent = testAgent(sweeping.address, { engineKinds: ["swept"], interceptors: [calls.interceptor], handlers: { swept: h.handler } });
    await agent.start();
    const [id] = await producer.enqueue([{ engineKind: "swept", maxRetries: 3 }]);
    await h.started;
    const outcome = finished(agent, id!);

    clock.advance(30_001);
    await sweeping.maintenance.runOnce();

    // The sweep revokes the lease and tells the agent at once (a cancel directive saying why).
    const reason = await h.aborted;
    expect(reason).toBeInstanceOf(WorkAbortedError);
    expect(reason).toMatchObject({ kind: "cancelled", message: "lease expired" });
    expect((await outcome).outcome).toEqual({ kind: "cancelled", reason: "lease expired" });
    await until("the handler returned", () => agent.inFlight === 0);
    expect(reportedIds(calls)).not.toContain(id);
    // Back in the queue with an attempt spent; the late result went nowhere.
    expect(await producer.get(id!)).toMatchObject({ status: WorkItemStatus.PENDING, retryCount: 0, redeliveryCount: 1, resultJson: "", agentId: "" });
    producer.close();
  });

  it("a renewal the daemon refuses (the lease changed hands) aborts the handler with lease-lost and reports nothing", async () => {
    const producer = new Producer(renewing.address, "t1");
    const calls = callLog();
    const h = waitsForAbort();
    const agent = testAgent(renewing.address, { engineKinds: ["stolen"], interceptors: [calls.interceptor], handlers: { stolen: h.handler } });
    await agent.start();
    expect(agent.registration?.leaseTtlMs).toBe(300);
    const [id] = await producer.enqueue([{ engineKind: "stolen" }]);
    await h.started;
    const outcome = finished(agent, id!);

    // What another daemon re-dispatching the item would leave behind: a different fencing token, and no directive.
    await db.raw(`UPDATE ${db.tables.qualified("work_item")} SET lease_token = 'somebody-else' WHERE id = $1`, [id]);

    const reason = await h.aborted;
    expect(reason).toMatchObject({ name: "WorkAbortedError", kind: "lease-lost" });
    expect((reason as Error).message).toMatch(/^lease lost/);
    expect((await outcome).outcome.kind).toBe("lease-lost");
    // The renewal that found the lease lost was the heartbeat thread's.
    expect(calls.count("ExtendLease")).toBe(0);
    await until("the handler returned", () => agent.inFlight === 0);
    expect(reportedIds(calls)).not.toContain(id);
    expect(await producer.get(id!)).toMatchObject({ status: WorkItemStatus.DISPATCHED, resultJson: "" });
    // Reads never show a lease token; the row still holds the other holder's.
    expect((await db.raw<{ lease_token: string }>(`SELECT lease_token FROM ${db.tables.qualified("work_item")} WHERE id = $1`, [id]))[0]?.lease_token).toBe(
      "somebody-else",
    );
    producer.close();
  });
});

describe("lease renewal", () => {
  it("a handler running for several lease TTLs keeps its lease and completes", async () => {
    const producer = new Producer(realtime.address, "t1");
    const calls = callLog();
    const agent = testAgent(realtime.address, {
      engineKinds: ["slow"],
      interceptors: [calls.interceptor],
      handlers: { slow: (_item, ctx) => new Promise((resolve) => setTimeout(() => resolve(ctx.signal.aborted ? "aborted" : "done"), 1_200)) },
    });
    await agent.start();
    const [id] = await producer.enqueue([{ engineKind: "slow" }]);
    const [done] = await producer.waitDone([id!]);
    // Four TTLs with sweeps every 50ms: only renewals kept it, and all of them came from the heartbeat thread.
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, retryCount: 0, resultJson: JSON.stringify("done") });
    expect(calls.count("ExtendLease")).toBe(0);
    producer.close();
  });

  it("while the heartbeat thread is down the main thread renews, and it hands renewal back to the restarted thread", async () => {
    const threads: Worker[] = [];
    const spawned = (w: Worker) => threads.push(w);
    process.on("worker", spawned);
    try {
      const producer = new Producer(handover.address, "t1");
      const calls = callLog();
      const log = captureLog("debug");
      const started = deferred();
      const gate = deferred();
      const agent = testAgent(handover.address, {
        engineKinds: ["orphaned"],
        interceptors: [calls.interceptor],
        logger: log.log,
        handlers: {
          orphaned: async () => {
            started.resolve();
            await gate.promise;
            return "done";
          },
        },
      });
      await agent.start();
      expect(threads).toHaveLength(1);
      const [id] = await producer.enqueue([{ engineKind: "orphaned" }]);
      await started.promise;
      await renewedTimes(id!, 2);
      expect(calls.count("ExtendLease")).toBe(0);

      await threads[0]!.terminate();
      const renewalsOf = () =>
        calls.calls.filter(
          (c) => c.method === "ExtendLease" && c.ended === "ok" && (c.message as { leases: { workItemId: string }[] }).leases.some((l) => l.workItemId === id),
        );
      await until("the main thread renewed the lease twice", () => renewalsOf().length >= 2);
      await until("a restarted thread took renewal back", () => log.lines().some((l) => l.msg === "the heartbeat thread is back: it renews the leases again"));
      expect(threads).toHaveLength(2);
      const byMainThread = calls.count("ExtendLease");
      // The restarted thread was handed the lease: it keeps it alone.
      await renewedTimes(id!, 3);
      expect(calls.count("ExtendLease")).toBe(byMainThread);

      gate.resolve();
      const [done] = await producer.waitDone([id!]);
      expect(done).toMatchObject({
        status: WorkItemStatus.COMPLETED,
        retryCount: 0,
        redeliveryCount: 0,
        agentId: agent.name,
        resultJson: JSON.stringify("done"),
      });
      // Neither the bearer token nor the fencing token is ever logged, whichever thread renewed.
      const token = (await rtDb().raw<{ lease_token: string }>(`SELECT lease_token FROM ${rtDb().tables.qualified("work_item")} WHERE id = $1`, [id]))[0]
        ?.lease_token;
      expect(token).toBeTruthy();
      const lines = log.raw().join("\n");
      expect(lines).not.toContain(token);
      expect(lines).not.toContain(TOKENS.agent);
      producer.close();
    } finally {
      process.off("worker", spawned);
    }
  });
});

const rtDb = () => realTime.db;

/**
 * Resolves once the lease of item `id` (on the real-time daemons' schema) has been renewed `times` times
 * from now, as its row shows; fails at once if the item is no longer held.
 */
async function renewedTimes(id: string, times: number): Promise<void> {
  const seen = new Set<string>();
  let first: string | undefined;
  await until(`the lease of ${id} was renewed ${times} times`, async () => {
    const [row] = await rtDb().raw<{ status: string; lease_expires_at: string }>(
      `SELECT status, lease_expires_at FROM ${rtDb().tables.qualified("work_item")} WHERE id = $1`,
      [id],
    );
    if (row?.status !== "dispatched") throw new Error(`item ${id} is ${row?.status ?? "gone"}: its lease was lost`);
    first ??= row.lease_expires_at;
    if (row.lease_expires_at !== first) seen.add(row.lease_expires_at);
    return seen.size >= times;
  });
}
