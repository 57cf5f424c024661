/**
 * A daemon that has just started, or just got the database back, judges agent liveness only after
 * a full liveness window (livenessIntervals × heartbeatInterval) in which agents could reach it and
 * other daemons could write the heartbeats they held. One fake clock, timers parked: every flush
 * and sweep happens when the test says. Daemons reach Postgres through TCP proxies of their own
 * that the test cuts and restores.
 */
import { afterEach, describe, expect, it } from "vitest";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import { FakeClock } from "../src/clock.js";
import type { Config } from "../src/config.js";
import type { Daemon } from "../src/daemon.js";
import { agentClient, agentRow, ok, registerRequest } from "./support/agents.js";
import { bearer, TOKENS } from "./support/daemon.js";
import type { grpc } from "./support/grpc-js.js";
import { useTestDb } from "./support/kit.js";
import { Conn, itemRow, Producer, TestAgent } from "./support/queue.js";
import { startTcpProxy, type TcpProxy } from "./support/tcp-proxy.js";

const HEARTBEAT_MS = 5_000;
const WINDOW_MS = 3 * HEARTBEAT_MS; // livenessIntervals × heartbeatInterval
/** Longer than the window, so that a restart can outlast the window and still fall inside it. */
const LEASE_MS = 20_000;
const PARKED = 3_600_000;
const TENANT = "t1";

const clock = new FakeClock(Date.UTC(2026, 8, 1));
const fx = useTestDb("livregain");

const config = (instanceId: string, extra: Partial<Config> = {}): Partial<Config> => ({
  instanceId,
  heartbeatInterval: HEARTBEAT_MS,
  livenessIntervals: 3,
  leaseTtl: LEASE_MS,
  heartbeatFlush: PARKED,
  sweepInterval: PARKED,
  ...extra,
});

/** The daemons of the test running now, stopped after it: an idle one would hold back the next test's sweeps. */
const running: { daemon: Daemon; proxy?: TcpProxy }[] = [];
afterEach(async () => {
  for (const r of running.splice(0)) {
    r.proxy?.refuse(null);
    await r.daemon.stop();
  }
});

const statusOf = async (name: string) => (await agentRow(fx.db, name))?.status;
/** Everything a daemon writes on its own in one sweep interval: its buffered heartbeats, then its sweeps. */
const tick = async (d: Daemon) => {
  await d.maintenance.flushHeartbeats().catch(() => {});
  await d.maintenance.runOnce();
};

describe("a daemon restart", () => {
  it("costs no redelivery: the new daemon's first run (before it serves) and its runs within the window mark nothing inactive and expire nothing; past the window a silent agent goes inactive as ever", async () => {
    const first = await fx.startDaemon({ clock, config: config("restart-1") });
    running.push({ daemon: first });
    const p = fx.closers.add(new Producer(first.address));
    const back = fx.closers.add(await TestAgent.register(first.address, "restart-back", { tenants: [TENANT], engineKinds: ["dag"] }));
    const gone = fx.closers.add(await TestAgent.register(first.address, "restart-gone", { tenants: [TENANT], engineKinds: ["dag"] }));
    await p.enqueue(TENANT, [{ engineKind: "dag" }, { engineKind: "dag" }]);
    const [held] = await back.claim(1);
    const [lost] = await gone.claim(1);
    await back.heartbeat();
    await gone.heartbeat();
    await tick(first);
    // A clean stop: the daemon writes what it holds and says it stopped.
    await first.stop();

    // Down longer than the window, shorter than the lease.
    clock.advance(WINDOW_MS + 1_000);
    const second = await fx.startDaemon({ clock, config: config("restart-2") });
    running.push({ daemon: second });
    const startedAt = clock.nowMs();
    expect(startedAt).toBeLessThan(Number(held!.leaseExpiresAtNs / 1_000_000n));
    // startDaemon ran the first maintenance run before it served.
    for (const n of ["restart-back", "restart-gone"]) expect(await statusOf(n), `${n} after the first run`).toBe("active");

    // restart-back reaches the new daemon (without registering again), beats and renews.
    const conn = fx.closers.add(new Conn(second.address));
    const call = { headers: bearer(TOKENS.agent) };
    clock.advance(1_000);
    expect((await conn.agent.heartbeat({ name: "restart-back" }, call)).status).toBe(AgentStatus.ACTIVE);
    const renewed = await conn.agent.extendLease({ name: "restart-back", leases: [{ workItemId: held!.id, leaseToken: held!.leaseToken }] }, call);
    expect(renewed.outcomes.map((o) => o.ok)).toEqual([true]);

    // Runs up to the window: restart-gone is silent, and its lease ran out meanwhile, but it could
    // still be on its way to this daemon.
    while (clock.nowMs() + HEARTBEAT_MS - startedAt < WINDOW_MS) {
      clock.advance(HEARTBEAT_MS);
      await conn.agent.heartbeat({ name: "restart-back" }, call);
      await tick(second);
      expect(await statusOf("restart-gone"), `at +${clock.nowMs() - startedAt}ms`).toBe("active");
      expect(await itemRow(fx.db, lost!.id)).toMatchObject({ status: "dispatched", agent_id: "restart-gone", lease_token: lost!.leaseToken });
    }
    const completed = await conn.agent.complete(
      { name: "restart-back", items: [{ workItemId: held!.id, leaseToken: held!.leaseToken, resultJson: '"done"' }] },
      call,
    );
    expect(completed.outcomes.map((o) => o.ok)).toEqual([true]);
    expect(await itemRow(fx.db, held!.id)).toMatchObject({ status: "completed", redelivery_count: 0 });

    // A full window since the start, and no beat: inactive, its item back in the queue.
    clock.set(startedAt + WINDOW_MS);
    await conn.agent.heartbeat({ name: "restart-back" }, call);
    await tick(second);
    expect(await statusOf("restart-gone")).toBe("inactive");
    expect(await statusOf("restart-back")).toBe("active");
    expect(await itemRow(fx.db, lost!.id)).toMatchObject({ status: "pending", redelivery_count: 1, error: "agent 'restart-gone' went inactive" });
  });
});

/** A daemon reaching Postgres through a proxy of its own, and a stock agent client of it. */
async function side(instanceId: string) {
  const proxy = fx.closers.add(await startTcpProxy(fx.db.url));
  const daemon = await fx.startDaemon({ clock, config: config(instanceId, { databaseUrl: proxy.url, dbPoolSize: 2 }) });
  running.push({ daemon, proxy });
  return { daemon, proxy, client: fx.closers.add(agentClient(daemon.address)) as grpc.Client };
}
const cutOff = (proxy: TcpProxy) => {
  proxy.refuse("close");
  proxy.cut();
};
const beat = (client: grpc.Client, name: string) => ok(client, "heartbeat", { name, metrics: { cpuUtilization: 1 }, inFlight: 0 });

describe("after an outage of the database", () => {
  it("the first daemon back waits a window before judging an agent whose last write is its registration, while the daemon holding its beats comes back", async () => {
    const x = await side("regain-x");
    const y = await side("regain-y");
    await tick(x.daemon);
    await tick(y.daemon);
    // Registered on Y; its beats reach Y and are not written yet when the database goes away.
    await ok(y.client, "register", registerRequest("reg-on-y"));
    await ok(y.client, "register", registerRequest("reg-silent"));
    cutOff(x.proxy);
    cutOff(y.proxy);
    const downAt = clock.nowMs();
    while (clock.nowMs() - downAt < 2 * WINDOW_MS) {
      clock.advance(HEARTBEAT_MS);
      await beat(y.client, "reg-on-y");
      await tick(x.daemon);
      await tick(y.daemon);
    }

    // X is back first; Y a little later, within the window.
    x.proxy.refuse(null);
    clock.advance(1_000);
    await beat(y.client, "reg-on-y");
    await tick(x.daemon);
    // X's first run since it reached the database again: its window starts here.
    const xBack = clock.nowMs();
    expect(await statusOf("reg-on-y")).toBe("active");
    clock.advance(HEARTBEAT_MS);
    await beat(y.client, "reg-on-y");
    await tick(x.daemon);
    expect(await statusOf("reg-on-y")).toBe("active");
    y.proxy.refuse(null);
    await tick(y.daemon);
    expect(await statusOf("reg-on-y")).toBe("active");

    while (clock.nowMs() - xBack <= WINDOW_MS) {
      clock.advance(HEARTBEAT_MS);
      await beat(y.client, "reg-on-y");
      await tick(y.daemon);
      await tick(x.daemon);
      expect(await statusOf("reg-on-y"), `at +${clock.nowMs() - xBack}ms after X came back`).toBe("active");
      // The agent that never beat is judged by its registration's time, once X has waited its window.
      expect(await statusOf("reg-silent")).toBe(clock.nowMs() - xBack >= WINDOW_MS ? "inactive" : "active");
    }
  });
});
