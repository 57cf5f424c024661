/**
 * AgentStore against real Postgres, with a fake clock: every time the store writes comes from the
 * caller, so the assertions below can name exact instants.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { decodeTime } from "ulid";
import { FakeClock } from "../src/clock.js";
import { AgentStore, type RegisterInput } from "../src/store/agents.js";
import { agentRow, ULID } from "./support/agents.js";
import { openCountingPool, type CountingPool } from "./support/counting-pool.js";
import { createTestDb, type TestDb } from "./support/db.js";

let db: TestDb;
let counting: CountingPool;
let store: AgentStore;
const clock = new FakeClock(Date.UTC(2026, 0, 1, 12));

beforeAll(async () => {
  db = await createTestDb({ label: "agstore" });
  counting = await openCountingPool(db.url);
  store = new AgentStore(counting.pool, db.tables);
});
afterAll(async () => {
  await counting?.end();
  await db?.drop();
});

const input = (name: string, extra: Partial<RegisterInput> = {}): RegisterInput => ({
  name,
  httpAddress: "http://a:1",
  grpcAddress: "a:2",
  infraAddress: "a:3",
  agentVersion: "1.0.0",
  binaryPath: "/bin/agent",
  agentType: "remote",
  metadata: { tags: { zone: "z1" }, slots: 2, tenants: ["t1"], engineKinds: ["dag"], models: [] },
  ...extra,
});

const drain = { reason: "maintenance", deadline: null, startedAt: Date.UTC(2026, 0, 1), inFlightAtStart: 3, by: "ops-1" };
const table = () => db.tables.qualified("agent");

describe("AgentStore.register", () => {
  it("creates an agent with a fresh ULID taken at the clock's time", async () => {
    const now = clock.nowMs();
    counting.reset();
    const res = await store.register(input("reg-new"), now, "agent-abc");
    expect(counting.statements).toHaveLength(1);
    expect(res.created).toBe(true);
    expect(res.status).toBe("active");
    expect(res.id).toMatch(ULID);
    expect(decodeTime(res.id)).toBe(now);
    const row = await agentRow(db, "reg-new");
    expect(row).toMatchObject({
      id: res.id,
      http_address: "http://a:1",
      grpc_address: "a:2",
      infra_address: "a:3",
      agentversion: "1.0.0",
      binarypath: "/bin/agent",
      agenttype: "remote",
      status: "active",
      createdby: "agent-abc",
      updatedby: "agent-abc",
      metrics: null,
      deletedon: null,
    });
    expect(row!.metadata).toEqual({ tags: { zone: "z1" }, slots: 2, tenants: ["t1"], engineKinds: ["dag"], models: [] });
    expect(row!.createdon.getTime()).toBe(now);
    expect(row!.updatedon!.getTime()).toBe(now);
  });

  it("re-registering the same name keeps the id and creation, and replaces the registered fields", async () => {
    const first = await store.register(input("reg-again"), clock.nowMs(), "agent-abc");
    const createdOn = clock.nowMs();
    clock.advance(60_000);
    const second = await store.register(
      input("reg-again", {
        httpAddress: "http://b:1",
        grpcAddress: null,
        infraAddress: "b:3",
        agentVersion: "2.0.0",
        binaryPath: "/usr/bin/agent",
        agentType: "local",
        metadata: { tags: { zone: "z2" }, slots: 8, tenants: [], engineKinds: ["graph"], models: ["m"] },
      }),
      clock.nowMs(),
      "agent-def",
    );
    expect(second).toEqual({ id: first.id, status: "active", created: false });
    const row = await agentRow(db, "reg-again");
    expect(row).toMatchObject({
      id: first.id,
      http_address: "http://b:1",
      grpc_address: null,
      infra_address: "b:3",
      agentversion: "2.0.0",
      binarypath: "/usr/bin/agent",
      agenttype: "local",
      createdby: "agent-abc",
      updatedby: "agent-def",
    });
    expect(row!.metadata).toEqual({ tags: { zone: "z2" }, slots: 8, tenants: [], engineKinds: ["graph"], models: ["m"] });
    expect(row!.createdon.getTime()).toBe(createdOn);
    expect(row!.updatedon!.getTime()).toBe(clock.nowMs());
    const count = await db.raw<{ n: number }>(`SELECT count(*)::int AS n FROM ${table()} WHERE name = 'reg-again'`);
    expect(count[0]!.n).toBe(1);
  });

  it("re-registering an inactive agent makes it active again", async () => {
    const { id } = await store.register(input("reg-inactive"), clock.nowMs(), "a");
    await store.deregister("reg-inactive", clock.nowMs(), "a");
    expect((await agentRow(db, "reg-inactive"))!.status).toBe("inactive");
    expect(await store.register(input("reg-inactive"), clock.nowMs(), "a")).toEqual({ id, status: "active", created: false });
  });

  it("a drain (metadata.drain) survives re-registration: status stays draining and the drain is kept", async () => {
    const { id } = await store.register(input("reg-drained"), clock.nowMs(), "a");
    await db.raw(`UPDATE ${table()} SET status = 'draining', metadata = metadata || jsonb_build_object('drain', $2::jsonb) WHERE name = $1`, [
      "reg-drained",
      JSON.stringify(drain),
    ]);
    clock.advance(1_000);
    const res = await store.register(
      input("reg-drained", { metadata: { tags: { new: "tag" }, slots: 1, tenants: [], engineKinds: [], models: [] } }),
      clock.nowMs(),
      "a",
    );
    expect(res).toEqual({ id, status: "draining", created: false });
    const row = await agentRow(db, "reg-drained");
    expect(row!.status).toBe("draining");
    // The rest of metadata is the agent's new offer; the drain is the daemon's and stays.
    expect(row!.metadata).toEqual({ tags: { new: "tag" }, slots: 1, tenants: [], engineKinds: [], models: [], drain });
    expect(await store.status("reg-drained")).toEqual({ id, name: "reg-drained", status: "draining", drain });
  });

  it("a drain survives the agent going inactive and coming back", async () => {
    const { id } = await store.register(input("reg-drained-gone"), clock.nowMs(), "a");
    await db.raw(`UPDATE ${table()} SET status = 'draining', metadata = metadata || jsonb_build_object('drain', $2::jsonb) WHERE name = $1`, [
      "reg-drained-gone",
      JSON.stringify(drain),
    ]);
    await store.deregister("reg-drained-gone", clock.nowMs(), "a");
    const res = await store.register(input("reg-drained-gone"), clock.nowMs(), "a");
    expect(res).toEqual({ id, status: "draining", created: false });
  });

  it("a soft-deleted agent that registers again is revived under its id, without its old drain", async () => {
    const { id } = await store.register(input("reg-deleted"), clock.nowMs(), "a");
    await db.raw(
      `UPDATE ${table()} SET status = 'draining', metadata = metadata || jsonb_build_object('drain', $2::jsonb), deletedby = 'ops', deletedon = now() WHERE name = $1`,
      ["reg-deleted", JSON.stringify(drain)],
    );
    expect(await store.status("reg-deleted")).toBeNull();
    expect(await store.get("reg-deleted")).toBeNull();
    const res = await store.register(input("reg-deleted"), clock.nowMs(), "a");
    expect(res).toEqual({ id, status: "active", created: false });
    const row = await agentRow(db, "reg-deleted");
    expect(row).toMatchObject({ deletedby: null, deletedon: null, status: "active" });
    expect(row!.metadata).not.toHaveProperty("drain");
  });
});

describe("AgentStore.writeHeartbeats", () => {
  it("writes a batch in one statement and returns each written agent's status (skipping unknown names)", async () => {
    const names = ["hb-1", "hb-2", "hb-3"];
    const ids = new Map<string, string>();
    for (const n of names) ids.set(n, (await store.register(input(n), clock.nowMs(), "a")).id);
    await db.raw(`UPDATE ${table()} SET status = 'draining', metadata = metadata || jsonb_build_object('drain', $1::jsonb) WHERE name = 'hb-3'`, [
      JSON.stringify(drain),
    ]);
    const t0 = clock.nowMs();
    const batch = names.map((name, i) => ({ name, metrics: { cpu: { utilization: 10 * i }, inFlight: i }, at: t0 + 1_000 + i }));
    counting.reset();
    const rows = await store.writeHeartbeats([...batch, { name: "hb-unknown", metrics: { inFlight: 0 }, at: t0 }]);
    expect(counting.statements).toHaveLength(1);
    expect(counting.statements[0]).toMatch(/^\s*UPDATE/);
    expect([...rows].sort((a, b) => a.name.localeCompare(b.name))).toEqual([
      { id: ids.get("hb-1"), name: "hb-1", status: "active", drain: null },
      { id: ids.get("hb-2"), name: "hb-2", status: "active", drain: null },
      { id: ids.get("hb-3"), name: "hb-3", status: "draining", drain },
    ]);
    for (const [i, n] of names.entries()) {
      const row = await agentRow(db, n);
      expect(row!.metrics).toEqual({ cpu: { utilization: 10 * i }, inFlight: i });
      expect(row!.updatedon!.getTime()).toBe(t0 + 1_000 + i);
      expect(row!.updatedby).toBe(n);
      expect(row!.status).toBe(i === 2 ? "draining" : "active");
    }
    expect(await agentRow(db, "hb-unknown")).toBeUndefined();
  });

  it("an empty batch costs no statement", async () => {
    counting.reset();
    expect(await store.writeHeartbeats([])).toEqual([]);
    expect(counting.statements).toHaveLength(0);
  });

  it("never revives an inactive agent, and skips soft-deleted ones", async () => {
    await store.register(input("hb-inactive"), clock.nowMs(), "a");
    await store.deregister("hb-inactive", clock.nowMs(), "a");
    await store.register(input("hb-deleted"), clock.nowMs(), "a");
    await db.raw(`UPDATE ${table()} SET deletedby = 'ops', deletedon = now() WHERE name = 'hb-deleted'`);
    const before = await agentRow(db, "hb-deleted");
    const rows = await store.writeHeartbeats([
      { name: "hb-inactive", metrics: { inFlight: 1 }, at: clock.nowMs() + 5 },
      { name: "hb-deleted", metrics: { inFlight: 1 }, at: clock.nowMs() + 5 },
    ]);
    expect(rows.map((r) => [r.name, r.status])).toEqual([["hb-inactive", "inactive"]]);
    expect((await agentRow(db, "hb-inactive"))!.status).toBe("inactive");
    expect(await agentRow(db, "hb-deleted")).toEqual(before);
  });
});

describe("AgentStore.markStaleInactive", () => {
  it("flips only live agents whose last write is older than the window, in one statement", async () => {
    const t0 = clock.nowMs();
    const at = (name: string, ms: number, status = "active") =>
      db.raw(`UPDATE ${table()} SET updatedon = $2, status = $3 WHERE name = $1`, [name, new Date(ms), status]);
    const mk = async (name: string) => (await store.register(input(name), t0, "a")).id;
    const old = await mk("st-old");
    const oldDraining = await mk("st-old-draining");
    await mk("st-boundary");
    await mk("st-fresh");
    await mk("st-old-inactive");
    await mk("st-old-deleted");
    await at("st-old", t0 - 20_000);
    await at("st-old-draining", t0 - 20_000, "draining");
    await at("st-boundary", t0 - 15_000);
    await at("st-fresh", t0 - 1_000);
    await at("st-old-inactive", t0 - 20_000, "inactive");
    await at("st-old-deleted", t0 - 20_000);
    await db.raw(`UPDATE ${table()} SET deletedby = 'ops', deletedon = now() WHERE name = 'st-old-deleted'`);

    counting.reset();
    const gone = await store.markStaleInactive(t0, t0 - 15_000);
    expect(counting.statements).toHaveLength(1);
    expect([...gone].filter((g) => g.name.startsWith("st-")).sort((a, b) => a.name.localeCompare(b.name))).toEqual([
      { id: old, name: "st-old" },
      { id: oldDraining, name: "st-old-draining" },
    ]);
    const status = async (n: string) => (await agentRow(db, n))!.status;
    expect(await status("st-old")).toBe("inactive");
    expect(await status("st-old-draining")).toBe("inactive");
    expect(await status("st-boundary")).toBe("active");
    expect(await status("st-fresh")).toBe("active");
    expect(await status("st-old-deleted")).toBe("active");
    const row = await agentRow(db, "st-old");
    expect(row!.updatedby).toBe("liveness-sweep");
    expect(row!.updatedon!.getTime()).toBe(t0);
    // A second sweep at the same instant finds nothing more.
    expect((await store.markStaleInactive(t0, t0 - 15_000)).filter((g) => g.name.startsWith("st-"))).toEqual([]);
  });

  it("two sweeps at once on separate connections flip each agent exactly once", async () => {
    const t0 = clock.nowMs();
    const names = Array.from({ length: 40 }, (_, i) => `race-sweep-${i}`);
    for (const n of names) await store.register(input(n), t0 - 60_000, "a");
    const other = new AgentStore(db.pool, db.tables);
    const [a, b] = await Promise.all([store.markStaleInactive(t0, t0 - 15_000), other.markStaleInactive(t0, t0 - 15_000)]);
    const flipped = [...a, ...b].map((g) => g.name).filter((n) => n.startsWith("race-sweep-"));
    expect(flipped.sort()).toEqual([...names].sort());
  });
});

describe("AgentStore.deregister", () => {
  it("marks the agent inactive at once and says who did it", async () => {
    const { id } = await store.register(input("dereg"), clock.nowMs(), "a");
    clock.advance(5);
    expect(await store.deregister("dereg", clock.nowMs(), "agent-xyz")).toEqual({ id });
    const row = await agentRow(db, "dereg");
    expect(row).toMatchObject({ status: "inactive", updatedby: "agent-xyz" });
    expect(row!.updatedon!.getTime()).toBe(clock.nowMs());
    expect(await store.status("dereg")).toEqual({ id, name: "dereg", status: "inactive", drain: null });
  });

  it("returns null for an unknown or soft-deleted agent and writes nothing", async () => {
    expect(await store.deregister("dereg-nobody", clock.nowMs(), "a")).toBeNull();
    await store.register(input("dereg-deleted"), clock.nowMs(), "a");
    await db.raw(`UPDATE ${table()} SET deletedby = 'ops', deletedon = now() WHERE name = 'dereg-deleted'`);
    expect(await store.deregister("dereg-deleted", clock.nowMs(), "a")).toBeNull();
    expect((await agentRow(db, "dereg-deleted"))!.status).toBe("active");
  });
});
