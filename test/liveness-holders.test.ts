/**
 * The liveness sweep's statement against rows as daemons leave them. An agent whose last beat is
 * older than the window waits while a daemon may hold a newer one unwritten: one whose keepalive
 * (the time up to which it has written every beat it received) is behind the agent's deadline, and
 * that has not stopped and is not presumed dead. When the sweeping daemon wrote the agent's last
 * beat, only that daemon may.
 */
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import { DirectiveHub } from "../src/fleet/directives.js";
import { HeartbeatBuffer } from "../src/fleet/heartbeat-buffer.js";
import { silentLogger } from "../src/log.js";
import { AgentStore, type SweepHolders } from "../src/store/agents.js";
import { EngineStore } from "../src/store/engines.js";
import { agentRow } from "./support/agents.js";
import { useTestDb } from "./support/kit.js";

const T = Date.UTC(2026, 6, 1);
const WINDOW_MS = 15_000;
const fx = useTestDb("livholders");
let agents: AgentStore;
let engines: EngineStore;
const daemons = new Set<string>();

beforeAll(() => {
  agents = new AgentStore(fx.db.pool, fx.db.tables);
  engines = new EngineStore(fx.db.pool, fx.db.tables);
});
// A case's daemons stop after it, so that the next case's sweeps do not wait for them.
afterEach(async () => {
  for (const d of daemons) await engines.markStopped(d, T);
  daemons.clear();
});

/** A daemon instance whose keepalive says it has written every beat it received before `atMs`. */
async function keptAlive(daemon: string, atMs: number, tenants = ["t1"]): Promise<void> {
  daemons.add(daemon);
  await engines.keepAlive(daemon, tenants, atMs);
}

const registered = (name: string, atMs: number) =>
  agents.register(
    { name, httpAddress: null, grpcAddress: null, infraAddress: null, agentVersion: null, binaryPath: null, agentType: null, metadata: {} },
    atMs,
    "ops",
  );

/** An agent whose last written beat arrived at `atMs`. */
async function lastBeat(name: string, atMs: number): Promise<void> {
  await registered(name, atMs - 1_000);
  await agents.writeHeartbeats([{ name, metrics: {}, at: atMs }]);
}

/** Which of `names` one sweep at `nowMs` flips. */
async function flipped(names: readonly string[], nowMs: number, holders: Partial<SweepHolders> = {}): Promise<string[]> {
  const gone = await agents.markStaleInactive(nowMs, nowMs - WINDOW_MS, { self: "sweeper", ownBeats: [], presumedDeadBeforeMs: null, ...holders });
  return gone
    .map((g) => g.name)
    .filter((n) => names.includes(n))
    .sort();
}

describe("AgentStore.markStaleInactive and the daemons that may hold newer beats", () => {
  it("an agent whose last beat another daemon wrote waits until every daemon has kept alive since its deadline", async () => {
    await lastBeat("x-elsewhere", T);
    await keptAlive("sweeper", T + WINDOW_MS);
    await keptAlive("other", T + WINDOW_MS - 1);
    expect(await flipped(["x-elsewhere"], T + 2 * WINDOW_MS)).toEqual([]);
    await keptAlive("other", T + WINDOW_MS);
    expect(await flipped(["x-elsewhere"], T + 2 * WINDOW_MS)).toEqual(["x-elsewhere"]);
  });

  it("an agent whose last beat the sweeping daemon wrote waits for that daemon alone", async () => {
    await lastBeat("y-mine", T);
    await lastBeat("y-mine-then-moved", T);
    await lastBeat("y-not-mine", T);
    await keptAlive("sweeper", T + WINDOW_MS);
    await keptAlive("other", T);
    // The sweeper's beat of y-mine-then-moved is older than the one its row shows: not the last.
    const ownBeats = [
      { name: "y-mine", at: T },
      { name: "y-mine-then-moved", at: T - 5 },
    ];
    expect(await flipped(["y-mine", "y-mine-then-moved", "y-not-mine"], T + 2 * WINDOW_MS, { ownBeats })).toEqual(["y-mine"]);

    await lastBeat("y-mine-behind", T);
    await keptAlive("sweeper", T + WINDOW_MS - 1);
    expect(await flipped(["y-mine-behind"], T + 2 * WINDOW_MS, { ownBeats: [{ name: "y-mine-behind", at: T }] })).toEqual([]);
  });

  it("a daemon marked stale still counts: marking it leaves its keepalive as it was", async () => {
    await lastBeat("h-stale", T);
    await keptAlive("silent", T);
    expect((await engines.markStale(T + 1, "someone")).map((r) => [r.engineid, r.status, r.updatedon])).toEqual([["silent", "stale", T]]);
    expect(await flipped(["h-stale"], T + 2 * WINDOW_MS)).toEqual([]);
  });

  it("a daemon that stopped cleanly holds nothing", async () => {
    await lastBeat("h-stopped", T);
    await keptAlive("leaving", T);
    await engines.markStopped("leaving", T);
    expect(await flipped(["h-stopped"], T + WINDOW_MS)).toEqual([]);
    expect(await flipped(["h-stopped"], T + WINDOW_MS + 1)).toEqual(["h-stopped"]);
  });

  it("a daemon presumed dead holds nothing: its keepalive is older than the bound", async () => {
    await lastBeat("h-dead", T);
    await keptAlive("dead", T);
    expect(await flipped(["h-dead"], T + 10 * WINDOW_MS)).toEqual([]);
    expect(await flipped(["h-dead"], T + 10 * WINDOW_MS, { presumedDeadBeforeMs: T })).toEqual([]);
    expect(await flipped(["h-dead"], T + 10 * WINDOW_MS, { presumedDeadBeforeMs: T + 1 })).toEqual(["h-dead"]);
  });

  it("an agent whose last write was no heartbeat (a registration) is judged by its time alone", async () => {
    await registered("h-registered", T);
    expect((await agentRow(fx.db, "h-registered"))!.updatedby).toBe("ops");
    await keptAlive("silent", T - WINDOW_MS);
    expect(await flipped(["h-registered"], T + WINDOW_MS)).toEqual([]);
    expect(await flipped(["h-registered"], T + WINDOW_MS + 1)).toEqual(["h-registered"]);
  });

  it("a daemon's newest keepalive counts, whatever its rows of tenants it no longer serves say", async () => {
    await lastBeat("h-tenants", T);
    // A tenant served before a restart that was no clean stop: nothing keeps that row alive.
    await keptAlive("restarted", T, ["t-old"]);
    await keptAlive("restarted", T + WINDOW_MS, ["t1"]);
    expect(await flipped(["h-tenants"], T + WINDOW_MS + 1)).toEqual(["h-tenants"]);
  });
});

describe("HeartbeatBuffer.ownBeatsBefore", () => {
  it("lists, per agent, the newest beat this daemon wrote that arrived before the bound, and forgets those before the other", async () => {
    const clock = new FakeClock(T);
    const hub = new DirectiveHub(fx.db.pool, fx.db.tables.channel("directive"), clock, silentLogger(), 10_000);
    const buffer = new HeartbeatBuffer(agents, hub, silentLogger());
    for (const n of ["own-1", "own-2", "own-left"]) await registered(n, T);
    const beat = (name: string, at: number) => buffer.add({ name, metrics: {}, at });
    beat("own-1", T + 1);
    beat("own-1", T + 2);
    beat("own-2", T + 3);
    beat("own-left", T + 1);
    beat("own-unregistered", T + 1);
    await buffer.flush();
    // Deregistered: its beats are no longer this daemon's to hold.
    buffer.discard("own-left");
    const byName = (xs: { name: string; at: number }[]) => [...xs].sort((x, y) => x.name.localeCompare(y.name));
    expect(buffer.ownBeatsBefore(T + 3, T)).toEqual([{ name: "own-1", at: T + 2 }]);
    expect(byName(buffer.ownBeatsBefore(T + 4, T))).toEqual([
      { name: "own-1", at: T + 2 },
      { name: "own-2", at: T + 3 },
    ]);
    expect(buffer.ownBeatsBefore(T + 4, T + 3)).toEqual([{ name: "own-2", at: T + 3 }]);
    expect(buffer.ownBeatsBefore(T + 4, T)).toEqual([{ name: "own-2", at: T + 3 }]);
  });
});
