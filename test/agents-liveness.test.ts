/**
 * Liveness and the multi-daemon behaviour of AgentService: two real daemons on one schema, one fake
 * clock, timers parked so that every flush and sweep happens when the test says (runOnce /
 * flushHeartbeats). Streams are read by awaiting their next message, never by sleeping.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import pg from "pg";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { silentLogger } from "../src/log.js";
import { DirectiveHub } from "../src/fleet/directives.js";
import {
  agentClient,
  agentRow,
  captureLog,
  ok,
  registerRequest,
  watchDirectives,
  type CapturedLog,
  type DirectiveStream,
  type HeartbeatReply,
  type RegisterReply,
} from "./support/agents.js";
import type { TestDb } from "./support/db.js";
import type { grpc } from "./support/grpc-js.js";
import { until, useTestCluster } from "./support/kit.js";

const HEARTBEAT_MS = 5_000;
const WINDOW_MS = 3 * HEARTBEAT_MS; // livenessIntervals (default 3) × heartbeatInterval (default 5s)
const PARKED = 3_600_000;

const clock = new FakeClock(Date.UTC(2026, 2, 1));
const logA: CapturedLog = captureLog();
const logB: CapturedLog = captureLog();
const fx = useTestCluster("aglive", {
  clock,
  instances: ["live-a", "live-b"],
  config: { heartbeatInterval: HEARTBEAT_MS, livenessIntervals: 3, heartbeatFlush: PARKED, sweepInterval: PARKED },
  log: (id) => (id === "live-a" ? logA : logB).log,
});
let db: TestDb;
let a: Daemon;
let b: Daemon;
let clientA: grpc.Client;
let clientB: grpc.Client;
const streams: DirectiveStream[] = [];

beforeAll(async () => {
  db = fx.db;
  [a, b] = fx.daemons;
  clientA = agentClient(a.address);
  clientB = agentClient(b.address);
});
afterAll(async () => {
  for (const s of streams) s.close();
  clientA?.close();
  clientB?.close();
});

const register = (client: grpc.Client, name: string) => ok<RegisterReply>(client, "register", registerRequest(name));
const heartbeat = (client: grpc.Client, name: string) => ok<HeartbeatReply>(client, "heartbeat", { name, metrics: { cpuUtilization: 1 }, inFlight: 0 });
const watch = (client: grpc.Client, name: string) => {
  const s = watchDirectives(client, name);
  streams.push(s);
  return s;
};
const statusOf = async (name: string) => (await agentRow(db, name))?.status;

describe("agent liveness", () => {
  it("an agent silent for livenessIntervals × heartbeatInterval goes inactive; one that kept beating stays active", async () => {
    await register(clientA, "live-silent");
    await register(clientA, "live-beating");
    await heartbeat(clientA, "live-silent");
    await heartbeat(clientA, "live-beating");
    await a.maintenance.flushHeartbeats();
    const start = clock.nowMs();

    clock.advance(10_000);
    await heartbeat(clientA, "live-beating");
    await a.maintenance.flushHeartbeats();
    expect((await agentRow(db, "live-beating"))!.updatedon!.getTime()).toBe(start + 10_000);

    // Exactly the window: not yet.
    clock.advance(WINDOW_MS - 10_000);
    await a.maintenance.runOnce();
    expect(await statusOf("live-silent")).toBe("active");

    clock.advance(1);
    await a.maintenance.runOnce();
    expect(await statusOf("live-silent")).toBe("inactive");
    expect(await statusOf("live-beating")).toBe("active");
    const row = await agentRow(db, "live-silent");
    expect(row!.updatedby).toBe("liveness-sweep");
    expect(row!.updatedon!.getTime()).toBe(clock.nowMs());

    // Its next heartbeat, on either daemon, tells it so (and carries the status directive).
    const onA = await heartbeat(clientA, "live-silent");
    expect(onA.status).toBe("AGENT_STATUS_INACTIVE");
    expect(onA.directives).toContainEqual(
      expect.objectContaining({ kind: "status", status: expect.objectContaining({ status: "AGENT_STATUS_INACTIVE", reason: "missed heartbeats" }) }),
    );
    expect((await heartbeat(clientB, "live-silent")).status).toBe("AGENT_STATUS_INACTIVE");
    // A heartbeat does not revive it: the agent must register again.
    await a.maintenance.flushHeartbeats();
    await b.maintenance.flushHeartbeats();
    expect(await statusOf("live-silent")).toBe("inactive");
  });

  it("the flip reaches WatchDirectives streams on both daemons at once", async () => {
    await register(clientA, "live-watched");
    const onA = watch(clientA, "live-watched");
    const onB = watch(clientB, "live-watched");
    expect((await onA.next()).status?.status).toBe("AGENT_STATUS_ACTIVE");
    expect((await onB.next()).status?.status).toBe("AGENT_STATUS_ACTIVE");
    clock.advance(WINDOW_MS + 1);
    await a.maintenance.runOnce();
    for (const s of [onA, onB]) {
      const d = await s.next();
      expect(d.kind).toBe("status");
      expect(d.status).toMatchObject({ status: "AGENT_STATUS_INACTIVE", reason: "missed heartbeats" });
    }
  });

  it("a drained agent that goes silent goes inactive too, and comes back draining", async () => {
    const { id } = await register(clientA, "live-drained");
    const drain = { reason: "rebuild", deadline: null, startedAt: clock.nowMs(), inFlightAtStart: 0, by: "ops" };
    await db.raw(
      `UPDATE ${db.tables.qualified("agent")} SET status = 'draining', metadata = metadata || jsonb_build_object('drain', $1::jsonb) WHERE name = 'live-drained'`,
      [JSON.stringify(drain)],
    );
    clock.advance(WINDOW_MS + 1);
    await a.maintenance.runOnce();
    expect(await statusOf("live-drained")).toBe("inactive");
    expect(await register(clientB, "live-drained")).toMatchObject({ id, status: "AGENT_STATUS_DRAINING", created: false });
  });
});

describe("several daemons", () => {
  it("an agent that re-registers on one daemon is ACTIVE in heartbeats answered by another", async () => {
    await register(clientA, "live-back");
    const onB = watch(clientB, "live-back");
    expect((await onB.next()).status?.status).toBe("AGENT_STATUS_ACTIVE");
    clock.advance(WINDOW_MS + 1);
    await a.maintenance.runOnce();
    // Daemon B has heard that the agent went inactive.
    expect((await onB.next()).status?.status).toBe("AGENT_STATUS_INACTIVE");
    expect((await register(clientA, "live-back")).status).toBe("AGENT_STATUS_ACTIVE");
    expect(await statusOf("live-back")).toBe("active");
    expect((await heartbeat(clientB, "live-back")).status).toBe("AGENT_STATUS_ACTIVE");
  });

  it("deregistering through one daemon reaches the agent's stream and heartbeats on another", async () => {
    await register(clientA, "live-leaving");
    // B has the agent cached as active.
    expect((await heartbeat(clientB, "live-leaving")).status).toBe("AGENT_STATUS_ACTIVE");
    const onB = watch(clientB, "live-leaving");
    expect((await onB.next()).status?.status).toBe("AGENT_STATUS_ACTIVE");
    await ok(clientA, "deregister", { name: "live-leaving" });
    expect(await statusOf("live-leaving")).toBe("inactive");
    expect((await onB.next()).status?.status).toBe("AGENT_STATUS_INACTIVE");
    expect((await heartbeat(clientB, "live-leaving")).status).toBe("AGENT_STATUS_INACTIVE");
  });

  it("a directive issued while WatchDirectives is still loading the agent is not lost", async () => {
    await register(clientA, "live-late");
    await register(clientA, "live-sentinel");
    // The sentinel's stream on B is open: what B's listener hears for it, B has heard for the other agent before.
    const sentinel = watch(clientB, "live-sentinel");
    expect((await sentinel.next()).kind).toBe("status");

    const locker = new pg.Client({ connectionString: db.url });
    await locker.connect();
    const publisher = new DirectiveHub(db.pool, db.tables.channel("directive"), clock, silentLogger(), 60_000);
    try {
      // Hold the agent table so B's read of the (not yet cached) agent blocks inside WatchDirectives.
      await locker.query("BEGIN");
      await locker.query(`LOCK TABLE ${db.tables.qualified("agent")} IN ACCESS EXCLUSIVE MODE`);
      const late = watch(clientB, "live-late");
      await until("WatchDirectives is blocked reading the agent", async () => {
        const r = await db.raw<{ n: number }>(`SELECT count(*)::int AS n FROM pg_locks WHERE NOT granted AND relation = $1::regclass`, [
          db.tables.qualified("agent"),
        ]);
        return r[0]!.n > 0;
      });
      await publisher.publish("live-late", { kind: "cancel", workItemId: "wi-late", leaseToken: "lt-late", reason: "cancelled" });
      await publisher.publish("live-sentinel", { kind: "cancel", workItemId: "wi-sentinel", leaseToken: "lt-s", reason: "cancelled" });
      expect((await sentinel.next()).cancel?.workItemId).toBe("wi-sentinel");
      await locker.query("ROLLBACK");

      expect((await late.next()).status?.status).toBe("AGENT_STATUS_ACTIVE");
      const d = await late.next(5_000);
      expect(d).toMatchObject({ kind: "cancel", cancel: { workItemId: "wi-late", leaseToken: "lt-late" } });
    } finally {
      await locker.query("ROLLBACK").catch(() => {});
      await locker.end();
    }
  });

  it("sweeps run by two daemons at once flip each agent exactly once, without errors", async () => {
    const names = Array.from({ length: 30 }, (_, i) => `live-swept-${String(i).padStart(2, "0")}`);
    const ids = new Map<string, string>();
    for (const [i, n] of names.entries()) ids.set(n, (await register(i % 2 ? clientA : clientB, n)).id);
    const auditBefore = [logA.audit().length, logB.audit().length] as const;
    clock.advance(WINDOW_MS + 1);
    await Promise.all([a.maintenance.runOnce(), b.maintenance.runOnce()]);

    for (const n of names) expect(await statusOf(n)).toBe("inactive");
    const sweepIds = [...logA.audit().slice(auditBefore[0]), ...logB.audit().slice(auditBefore[1])]
      .filter((x) => x.rec.by === "liveness-sweep")
      .flatMap((x) => x.rec.ids as string[])
      .filter((id) => [...ids.values()].includes(id));
    expect(sweepIds.sort()).toEqual([...ids.values()].sort());
    // Other maintenance tasks (queue, affinity) are not under test here; the agent sweep and handlers are.
    const errors = [...logA.lines(), ...logB.lines()].filter((l) => (l.level as number) >= 50 && (l.task === undefined || l.task === "agent-liveness"));
    expect(errors).toEqual([]);
  });

  it("racing registrations of one name through two daemons end in one row, and every reply has its id", async () => {
    const clients = [
      clientA,
      clientB,
      agentClient(a.address),
      agentClient(b.address),
      agentClient(a.address),
      agentClient(b.address),
      agentClient(a.address),
      agentClient(b.address),
    ];
    try {
      for (let round = 0; round < 20; round++) {
        const name = `live-race-${round}`;
        const replies = await Promise.all(clients.map((c) => register(c, name)));
        const distinct = new Set(replies.map((r) => r.id));
        expect(distinct.size, `round ${round}: ${[...distinct].join(", ")}`).toBe(1);
        expect(replies.filter((r) => r.created)).toHaveLength(1);
        const rows = await db.raw<{ id: string }>(`SELECT id FROM ${db.tables.qualified("agent")} WHERE name = $1`, [name]);
        expect(rows).toEqual([{ id: replies[0]!.id }]);
      }
    } finally {
      for (const c of clients.slice(2)) c.close();
    }
  });
});

describe("maintenance driven by the clock", () => {
  it("runOnce called while a run is in progress still sweeps at the time it was called", async () => {
    await register(clientA, "live-run-twice");
    const first = a.maintenance.runOnce();
    clock.advance(WINDOW_MS + 1);
    const second = a.maintenance.runOnce();
    await Promise.all([first, second]);
    expect(await statusOf("live-run-twice")).toBe("inactive");
  });
});
