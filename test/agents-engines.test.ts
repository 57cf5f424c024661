/**
 * aiflow_engine: every daemon instance records itself per tenant, keeps the rows alive, marks them
 * stopped on a clean exit, and finds instances that stopped keeping alive stale. Each daemon has a
 * fake clock of its own, so "an instance that hangs" is a daemon whose clock stands still.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { ULID } from "./support/agents.js";
import type { TestDb } from "./support/db.js";
import { useTestDb } from "./support/kit.js";

const HEARTBEAT_MS = 5_000;
const WINDOW_MS = 3 * HEARTBEAT_MS;
const T0 = Date.UTC(2026, 4, 1);
const clockA = new FakeClock(T0);
const clockB = new FakeClock(T0);
// Daemons started on the schema are stopped after the file's tests (a stop is idempotent).
const fx = useTestDb("agengine");
let db: TestDb;
let a: Daemon | undefined;
let b: Daemon | undefined;

const config = (instanceId: string, tenants: string[]) => ({
  instanceId,
  tenants,
  heartbeatInterval: HEARTBEAT_MS,
  livenessIntervals: 3,
  heartbeatFlush: 3_600_000,
  sweepInterval: 3_600_000,
});

interface EngineDbRow {
  id: string;
  tenantkey: string;
  engineid: string;
  status: string;
  createdby: string;
  createdon: Date;
  updatedby: string;
  updatedon: Date;
}
const engines = async (engineid: string) =>
  db.raw<EngineDbRow & Record<string, unknown>>(`SELECT * FROM ${db.tables.qualified("engine")} WHERE engineid = $1 ORDER BY tenantkey`, [engineid]);
const statuses = async (engineid: string) => (await engines(engineid)).map((r) => [r.tenantkey, r.status]);
const insertEngine = (engineid: string, tenant: string, status: string, updatedMs: number) =>
  db.raw(
    `INSERT INTO ${db.tables.qualified("engine")} (id, tenantkey, engineid, status, createdby, createdon, updatedby, updatedon)
     VALUES (upper(substr(md5($1 || $2), 1, 26)), $2, $1, $3, $1, $4, $1, $4)`,
    [engineid, tenant, status, new Date(updatedMs)],
  );

beforeAll(() => {
  db = fx.db;
});

describe("aiflow_engine", () => {
  it("a daemon records itself as running for each tenant it serves", async () => {
    a = await fx.startDaemon({ clock: clockA, config: config("engine-a", ["t1", "t2"]) });
    const rows = await engines("engine-a");
    expect(rows.map((r) => [r.tenantkey, r.status, r.createdby, r.updatedon.getTime()])).toEqual([
      ["t1", "running", "engine-a", T0],
      ["t2", "running", "engine-a", T0],
    ]);
    for (const r of rows) expect(r.id).toMatch(ULID);
  });

  it("keeps its rows alive once per heartbeat interval, without adding rows", async () => {
    clockA.advance(HEARTBEAT_MS);
    await a!.maintenance.runOnce();
    const rows = await engines("engine-a");
    expect(rows).toHaveLength(2);
    for (const r of rows) expect(r.updatedon.getTime()).toBe(T0 + HEARTBEAT_MS);
  });

  it("another instance finds dead instances stale, and leaves live and stopped ones alone", async () => {
    // What a crashed instance leaves behind: running rows nobody refreshes.
    await insertEngine("engine-dead", "t1", "running", T0 - WINDOW_MS - 1);
    await insertEngine("engine-dead", "t2", "running", T0 - WINDOW_MS - 1);
    await insertEngine("engine-recent", "t1", "running", T0 - 1_000);
    await insertEngine("engine-gone", "t1", "stopped", T0 - 10 * WINDOW_MS);
    clockB.set(T0);
    b = await fx.startDaemon({ clock: clockB, config: config("engine-b", ["t1"]) });
    // B swept once as it started.
    expect(await statuses("engine-dead")).toEqual([
      ["t1", "stale"],
      ["t2", "stale"],
    ]);
    expect((await engines("engine-dead"))[0]!.updatedby).toBe("engine-b");
    expect(await statuses("engine-recent")).toEqual([["t1", "running"]]);
    expect(await statuses("engine-gone")).toEqual([["t1", "stopped"]]);
    expect(await statuses("engine-a")).toEqual([
      ["t1", "running"],
      ["t2", "running"],
    ]);
    expect(await statuses("engine-b")).toEqual([["t1", "running"]]);
  });

  it("an instance that stops keeping alive (its clock stands still) is found stale by the other", async () => {
    // A last kept alive at T0 + 5s; B's time moves past the window, and B keeps itself alive as it goes.
    for (let i = 0; i < 4; i++) {
      clockB.advance(HEARTBEAT_MS + 1);
      await b!.maintenance.runOnce();
    }
    expect(clockB.nowMs() - (T0 + HEARTBEAT_MS)).toBeGreaterThan(WINDOW_MS);
    expect(await statuses("engine-a")).toEqual([
      ["t1", "stale"],
      ["t2", "stale"],
    ]);
    expect(await statuses("engine-b")).toEqual([["t1", "running"]]);
  });

  it("an instance that comes back marks itself running again", async () => {
    clockA.set(clockB.nowMs());
    await a!.maintenance.runOnce();
    expect(await statuses("engine-a")).toEqual([
      ["t1", "running"],
      ["t2", "running"],
    ]);
  });

  it("a clean stop marks the instance stopped, and nobody marks a stopped instance stale", async () => {
    clockA.advance(1);
    await a!.stop();
    const rows = await engines("engine-a");
    expect(rows.map((r) => [r.tenantkey, r.status, r.updatedby, r.updatedon.getTime()])).toEqual([
      ["t1", "stopped", "engine-a", clockA.nowMs()],
      ["t2", "stopped", "engine-a", clockA.nowMs()],
    ]);
    clockB.advance(10 * WINDOW_MS);
    await b!.maintenance.runOnce();
    expect(await statuses("engine-a")).toEqual([
      ["t1", "stopped"],
      ["t2", "stopped"],
    ]);
    expect(await statuses("engine-b")).toEqual([["t1", "running"]]);
  });

  it("restarting under the same instance id reuses its rows", async () => {
    clockA.set(clockB.nowMs());
    a = await fx.startDaemon({ clock: clockA, config: config("engine-a", ["t1", "t2"]) });
    const rows = await engines("engine-a");
    expect(rows.map((r) => [r.tenantkey, r.status])).toEqual([
      ["t1", "running"],
      ["t2", "running"],
    ]);
    await a.stop();
    await b!.stop();
    expect(await statuses("engine-b")).toEqual([["t1", "stopped"]]);
    expect(await statuses("engine-a")).toEqual([
      ["t1", "stopped"],
      ["t2", "stopped"],
    ]);
  });
});
