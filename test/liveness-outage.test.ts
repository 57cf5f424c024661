/**
 * Agent liveness across database outages: daemons on one schema, each reaching Postgres through a
 * TCP proxy of its own that the test cuts and restores, one fake clock, timers parked so that every
 * flush and sweep happens when the test says. Agents beat to a daemon whose database path is down;
 * the heartbeats that daemon holds must count, wherever the sweep runs.
 */
import { afterEach, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { agentClient, agentRow, ok, registerRequest, type HeartbeatReply } from "./support/agents.js";
import type { grpc } from "./support/grpc-js.js";
import { useTestDb } from "./support/kit.js";
import { startTcpProxy, type TcpProxy } from "./support/tcp-proxy.js";

const HEARTBEAT_MS = 5_000;
const WINDOW_MS = 3 * HEARTBEAT_MS; // livenessIntervals × heartbeatInterval
/** A daemon silent this long is presumed dead (SILENT_DAEMON_WINDOWS in src/fleet/liveness.ts). */
const SILENT_DAEMON_MS = 4 * WINDOW_MS;
const PARKED = 3_600_000;

const clock = new FakeClock(Date.UTC(2026, 5, 1));
const fx = useTestDb("livoutage");

interface Side {
  daemon: Daemon;
  client: grpc.Client;
  /** This daemon's path to Postgres. */
  proxy: TcpProxy;
}

/** The daemons of the test running now. */
const sides: Side[] = [];

/** A daemon whose every connection to Postgres goes through a proxy of its own. */
async function side(instanceId: string): Promise<Side> {
  const proxy = fx.closers.add(await startTcpProxy(fx.db.url));
  const daemon = await fx.startDaemon({
    clock,
    config: {
      instanceId,
      databaseUrl: proxy.url,
      dbPoolSize: 2,
      heartbeatInterval: HEARTBEAT_MS,
      livenessIntervals: 3,
      heartbeatFlush: PARKED,
      sweepInterval: PARKED,
    },
  });
  const s = { daemon, proxy, client: fx.closers.add(agentClient(daemon.address)) };
  sides.push(s);
  return s;
}

// Each test's daemons stop cleanly after it: a daemon left running but idle would be one the next
// test's sweeps wait for, as they wait for any daemon that stopped writing.
afterEach(async () => {
  for (const s of sides.splice(0)) {
    s.proxy.refuse(null);
    await s.daemon.stop();
  }
});

/** The database is away for this daemon: open connections close, new ones fail. */
const cutOff = (s: Side) => {
  s.proxy.refuse("close");
  s.proxy.cut();
};
const reconnect = (s: Side) => s.proxy.refuse(null);

const register = (s: Side, name: string) => ok(s.client, "register", registerRequest(name));
const beat = (s: Side, name: string) => ok<HeartbeatReply>(s.client, "heartbeat", { name, metrics: { cpuUtilization: 1 }, inFlight: 0 });
/** Everything a daemon writes on its own in one sweep interval: its buffered heartbeats, then its sweeps. */
const tick = async (s: Side) => {
  await s.daemon.maintenance.flushHeartbeats().catch(() => {});
  await s.daemon.maintenance.runOnce();
};
const statusOf = async (name: string) => (await agentRow(fx.db, name))?.status;
const lastBeatOf = async (name: string) => (await agentRow(fx.db, name))?.updatedon?.getTime();

describe("agent liveness through a database outage", () => {
  it("agents beating to a daemon cut off for longer than the window stay active while another daemon sweeps, and liveness works once it is back", async () => {
    const a = await side("outage-a");
    const b = await side("outage-b");
    const held = ["held-1", "held-2"];
    for (const n of held) await register(b, n);
    await register(a, "on-a-silent");
    for (const n of held) await beat(b, n);
    await beat(a, "on-a-silent");
    await tick(a);
    await tick(b);
    const silentSince = clock.nowMs();

    cutOff(b);
    try {
      const cutAt = clock.nowMs();
      while (clock.nowMs() - cutAt < 3 * WINDOW_MS) {
        clock.advance(HEARTBEAT_MS);
        // B still answers its agents (from its cache) and holds their beats; it can write nothing.
        for (const n of held) expect((await beat(b, n)).status).toBe("AGENT_STATUS_ACTIVE");
        await tick(b);
        await tick(a);
        for (const n of held) expect(await statusOf(n), `${n} at +${clock.nowMs() - cutAt}ms of the outage`).toBe("active");
        // A's own silent agent is judged as ever: B's outage holds back only the agents B holds.
        expect(await statusOf("on-a-silent")).toBe(clock.nowMs() - silentSince > WINDOW_MS ? "inactive" : "active");
      }
      expect(await statusOf("on-a-silent")).toBe("inactive");
    } finally {
      reconnect(b);
    }
    const lastBeat = clock.nowMs();

    // The first daemon to sweep after the outage is not the one holding the beats.
    clock.advance(1_000);
    await tick(a);
    for (const n of held) expect(await statusOf(n)).toBe("active");
    await tick(b);
    for (const n of held) {
      expect(await statusOf(n)).toBe("active");
      // The beat time B received, not the time it could write it.
      expect(await lastBeatOf(n)).toBe(lastBeat);
    }

    // held-2 stops beating; held-1 goes on. Every daemon writes as usual now.
    const stoppedAt = lastBeat;
    while (clock.nowMs() - stoppedAt <= WINDOW_MS + HEARTBEAT_MS) {
      clock.advance(HEARTBEAT_MS);
      await beat(b, "held-1");
      await tick(b);
      await tick(a);
      expect(await statusOf("held-1")).toBe("active");
      expect(await statusOf("held-2")).toBe(clock.nowMs() - stoppedAt > WINDOW_MS ? "inactive" : "active");
    }
    expect(await statusOf("held-2")).toBe("inactive");
  });

  it("after an outage of the database itself, longer than any daemon is trusted, the first daemon back does not sweep what another still holds", async () => {
    const e = await side("outage-e");
    const g = await side("outage-g");
    await register(e, "on-e");
    await register(g, "on-g");
    await beat(e, "on-e");
    await beat(g, "on-g");
    await tick(e);
    await tick(g);

    cutOff(e);
    cutOff(g);
    try {
      const downAt = clock.nowMs();
      while (clock.nowMs() - downAt < 2 * SILENT_DAEMON_MS) {
        clock.advance(HEARTBEAT_MS);
        await beat(e, "on-e");
        await beat(g, "on-g");
        await tick(e);
        await tick(g);
      }
      // E is back; G's path stays down for another window and more, while E sweeps.
      reconnect(e);
      const backAt = clock.nowMs();
      while (clock.nowMs() - backAt <= WINDOW_MS + HEARTBEAT_MS) {
        clock.advance(HEARTBEAT_MS);
        await beat(e, "on-e");
        await beat(g, "on-g");
        await tick(e);
        await tick(g);
        expect(await statusOf("on-e")).toBe("active");
        expect(await statusOf("on-g"), `on-g at +${clock.nowMs() - backAt}ms after E came back`).toBe("active");
      }
    } finally {
      reconnect(e);
      reconnect(g);
    }
    const lastBeat = clock.nowMs();
    clock.advance(1_000);
    await tick(g);
    expect(await statusOf("on-g")).toBe("active");
    expect(await lastBeatOf("on-g")).toBe(lastBeat);
  });

  it("a daemon cut off on its own writes the beats it holds before its own sweep judges them", async () => {
    const s = await side("outage-solo");
    await register(s, "solo");
    await beat(s, "solo");
    await tick(s);

    cutOff(s);
    try {
      const cutAt = clock.nowMs();
      while (clock.nowMs() - cutAt < 2 * WINDOW_MS) {
        clock.advance(HEARTBEAT_MS);
        await beat(s, "solo");
        await s.daemon.maintenance.runOnce();
      }
    } finally {
      reconnect(s);
    }
    const lastBeat = clock.nowMs();
    clock.advance(1_000);
    // Only the sweeps: no flush is asked for first.
    await s.daemon.maintenance.runOnce();
    expect(await statusOf("solo")).toBe("active");
    expect(await lastBeatOf("solo")).toBe(lastBeat);
  });

  it("a daemon that stopped cleanly holds none of its agents' beats: they are judged by their time alone", async () => {
    const p = await side("outage-p");
    const q = await side("outage-q");
    await register(q, "left-with-q");
    await beat(q, "left-with-q");
    await tick(p);
    await tick(q);
    const lastBeat = clock.nowMs();
    // A clean stop writes what the daemon holds, then marks it stopped.
    await q.daemon.stop();
    while (clock.nowMs() - lastBeat <= WINDOW_MS) {
      clock.advance(HEARTBEAT_MS);
      await tick(p);
      expect(await statusOf("left-with-q")).toBe(clock.nowMs() - lastBeat > WINDOW_MS ? "inactive" : "active");
    }
    expect(await statusOf("left-with-q")).toBe("inactive");
  });

  it("the agents of a daemon that never comes back go inactive once it has been silent for the limit", async () => {
    const c = await side("outage-c");
    const d = await side("outage-d");
    await register(d, "gone-with-d");
    await beat(d, "gone-with-d");
    await tick(c);
    await tick(d);
    const lastWrite = clock.nowMs();

    cutOff(d);
    try {
      // Up to the limit exactly, D may only be cut off, holding newer beats of the agent.
      while (clock.nowMs() - lastWrite < SILENT_DAEMON_MS) {
        clock.advance(HEARTBEAT_MS);
        await tick(c);
        expect(await statusOf("gone-with-d"), `at +${clock.nowMs() - lastWrite}ms of D's silence`).toBe("active");
      }
      expect(clock.nowMs()).toBe(lastWrite + SILENT_DAEMON_MS);
      clock.advance(1);
      await tick(c);
      expect(await statusOf("gone-with-d")).toBe("inactive");
    } finally {
      reconnect(d);
    }
  });
});

describe("liveness without an outage", () => {
  it("an agent that stops beating goes inactive at the first sweep past its deadline: daemons keep alive on every sweep", async () => {
    const r = await side("prompt-r");
    await register(r, "prompt");
    // The beat falls between two heartbeat intervals of the daemon's own schedule.
    clock.advance(2_000);
    await beat(r, "prompt");
    const lastBeat = clock.nowMs();
    while (clock.nowMs() - lastBeat <= WINDOW_MS) {
      clock.advance(1_000);
      await tick(r);
      expect(await statusOf("prompt"), `at +${clock.nowMs() - lastBeat}ms`).toBe(clock.nowMs() - lastBeat > WINDOW_MS ? "inactive" : "active");
    }
  });
});
