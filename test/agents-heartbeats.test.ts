/**
 * Heartbeat coalescing: the buffer the daemon uses, built over a slonik pool that counts the
 * statements it executes, so "one statement per flush" is asserted rather than assumed.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import { silentLogger } from "../src/log.js";
import { DirectiveHub } from "../src/fleet/directives.js";
import { HeartbeatBuffer } from "../src/fleet/heartbeat-buffer.js";
import { AgentStore } from "../src/store/agents.js";
import { agentRow, agentRows, captureLog, type CapturedLog } from "./support/agents.js";
import { openCountingPool, type CountingPool } from "./support/counting-pool.js";
import { createTestDb, type TestDb } from "./support/db.js";

const clock = new FakeClock(Date.UTC(2026, 3, 1));
let db: TestDb;
let counting: CountingPool;
let store: AgentStore;
let hub: DirectiveHub;
let auditLog: CapturedLog;
let buffer: HeartbeatBuffer;

beforeAll(async () => {
  db = await createTestDb({ label: "aghb" });
  counting = await openCountingPool(db.url);
  store = new AgentStore(counting.pool, db.tables);
  hub = new DirectiveHub(counting.pool, db.tables.channel("directive"), clock, silentLogger(), 10_000);
  auditLog = captureLog();
  buffer = new HeartbeatBuffer(store, hub, auditLog.log);
});
afterAll(async () => {
  await buffer?.stop();
  await counting?.end();
  await db?.drop();
});

/** Registers many agents in one INSERT (setup, not under test). */
async function seed(prefix: string, n: number, atMs: number): Promise<string[]> {
  await db.raw(
    `INSERT INTO ${db.tables.qualified("agent")} (id, name, status, metadata, createdby, createdon, updatedby, updatedon)
     SELECT upper(substr(md5($1 || g::text), 1, 26)), $1 || lpad(g::text, 4, '0'), 'active', '{}'::jsonb, 'seed', $2, 'seed', $2
       FROM generate_series(1, $3::int) AS g`,
    [prefix, new Date(atMs), n],
  );
  return Array.from({ length: n }, (_, i) => `${prefix}${String(i + 1).padStart(4, "0")}`);
}

describe("HeartbeatBuffer", () => {
  it("coalesces heartbeats: 500 agents beating three times each cost ONE statement at flush", async () => {
    const t0 = clock.nowMs();
    const names = await seed("coal-", 500, t0 - 60_000);
    for (let beat = 1; beat <= 3; beat++) {
      clock.advance(100);
      for (const [i, name] of names.entries()) buffer.add({ name, metrics: { beat, cpu: { utilization: i % 100 }, inFlight: i }, at: clock.nowMs() });
    }
    // Nothing is written by a heartbeat itself.
    expect(counting.statements).toHaveLength(0);
    expect(buffer.size).toBe(500);

    counting.reset();
    await buffer.flush();
    expect(counting.statements).toHaveLength(1);
    expect(counting.statements[0]).toMatch(/^\s*UPDATE/);
    expect(buffer.size).toBe(0);

    const rows = await agentRows(db, "coal-");
    expect(rows).toHaveLength(500);
    for (const [i, row] of rows.entries()) {
      expect(row.metrics).toEqual({ beat: 3, cpu: { utilization: i % 100 }, inFlight: i });
      expect(row.updatedon!.getTime()).toBe(clock.nowMs());
    }
    // The flush also refreshed the daemon's status cache, so heartbeats answer without reading the database.
    expect(hub.known("coal-0001")).toEqual({ status: "active", drain: null });
    // An empty flush costs nothing.
    counting.reset();
    await buffer.flush();
    expect(counting.statements).toHaveLength(0);
  });

  it("a flush requested while another is running also writes the beats that arrived in between", async () => {
    const [first, second] = await seed("race-", 2, clock.nowMs());
    buffer.add({ name: first!, metrics: { v: 1 }, at: clock.nowMs() });
    const running = buffer.flush();
    clock.advance(10);
    buffer.add({ name: second!, metrics: { v: 2 }, at: clock.nowMs() });
    buffer.add({ name: first!, metrics: { v: 3 }, at: clock.nowMs() });
    await buffer.flush();
    expect((await agentRow(db, second!))!.metrics).toEqual({ v: 2 });
    expect((await agentRow(db, first!))!.metrics).toEqual({ v: 3 });
    await running;
    expect(buffer.size).toBe(0);
  });

  it("forgets the cached state of an agent that no longer exists, so its next heartbeat is NOT_FOUND", async () => {
    hub.remember("gone-agent", { status: "active", drain: null });
    buffer.add({ name: "gone-agent", metrics: {}, at: clock.nowMs() });
    await buffer.flush();
    expect(hub.known("gone-agent")).toBeUndefined();
  });

  it("discard() drops a buffered beat", async () => {
    const [name] = await seed("discard-", 1, clock.nowMs());
    buffer.add({ name: name!, metrics: { v: 1 }, at: clock.nowMs() + 1 });
    buffer.discard(name!);
    counting.reset();
    await buffer.flush();
    expect(counting.statements).toHaveLength(0);
    expect((await agentRow(db, name!))!.metrics).toBeNull();
  });

  it("audits no flush: a heartbeat changes no state worth a record (the audit stream is for registration, drain, removal)", async () => {
    const [name] = await seed("audited-", 1, clock.nowMs());
    const before = auditLog.audit().length;
    buffer.add({ name: name!, metrics: { cpu: { utilization: 12.3456 } }, at: clock.nowMs() });
    await buffer.flush();
    expect((await agentRow(db, name!))!.metrics).toMatchObject({ cpu: { utilization: 12.3456 } });
    expect(auditLog.audit().slice(before)).toEqual([]);
  });
});
