/**
 * Leases through a database outage longer than the lease: an agent that stayed in touch with a
 * daemon (its heartbeats reached it while the database was away) keeps its leases, extended when
 * the database comes back, before any expiry sweep; its work completes under the token it was
 * dispatched with. An agent that was not in touch loses its lease as before, once the agents of
 * every daemon have had their lease's length to be heard again. One fake clock, timers parked;
 * each daemon reaches Postgres through a TCP proxy of its own that the test cuts and restores.
 */
import { afterEach, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { useTestDb } from "./support/kit.js";
import { itemRow, nsText, Producer, TestAgent, type WorkItem } from "./support/queue.js";
import { startTcpProxy, type TcpProxy } from "./support/tcp-proxy.js";

const HEARTBEAT_MS = 5_000;
const LEASE_MS = 10_000;
const PARKED = 3_600_000;
const TENANT = "t1";

const clock = new FakeClock(Date.UTC(2026, 9, 1));
const fx = useTestDb("leaseout");

interface Side {
  daemon: Daemon;
  proxy: TcpProxy;
}
const sides: Side[] = [];
afterEach(async () => {
  for (const s of sides.splice(0)) {
    s.proxy.refuse(null);
    await s.daemon.stop();
  }
});

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
      leaseTtl: LEASE_MS,
      heartbeatFlush: PARKED,
      sweepInterval: PARKED,
    },
  });
  const s = { daemon, proxy };
  sides.push(s);
  return s;
}

const cutOff = (s: Side) => {
  s.proxy.refuse("close");
  s.proxy.cut();
};
const tick = async (s: Side) => {
  await s.daemon.maintenance.flushHeartbeats().catch(() => {});
  await s.daemon.maintenance.runOnce();
};
const agentOn = (s: Side, name: string) =>
  TestAgent.register(s.daemon.address, name, { tenants: [TENANT], engineKinds: [name] }).then((a) => fx.closers.add(a));
/** One item of the agent's own engine kind, claimed by it. */
async function holding(s: Side, agent: TestAgent): Promise<WorkItem> {
  const p = fx.closers.add(new Producer(s.daemon.address));
  await p.one(TENANT, { engineKind: agent.name });
  const [item] = await agent.claim(1);
  expect(item).toBeDefined();
  return item!;
}
const held = (item: WorkItem, agent: string) => ({ status: "dispatched", agent_id: agent, lease_token: item.leaseToken, redelivery_count: 0 });

describe("leases through an outage longer than the lease", () => {
  it("an agent that kept beating to the daemon keeps its lease and completes; one that did not loses it once its lease's length has passed since the database came back", async () => {
    const d = await side("lease-solo");
    const kept = await agentOn(d, "lo-kept");
    const quiet = await agentOn(d, "lo-quiet");
    const k = await holding(d, kept);
    const q = await holding(d, quiet);
    await kept.heartbeat();
    await quiet.heartbeat();
    await tick(d);

    cutOff(d);
    const downAt = clock.nowMs();
    try {
      while (clock.nowMs() - downAt < 3 * LEASE_MS) {
        clock.advance(HEARTBEAT_MS);
        // Only lo-kept reaches the daemon meanwhile; neither can renew a lease.
        await kept.heartbeat();
        await tick(d);
      }
    } finally {
      d.proxy.refuse(null);
    }
    expect(clock.nowMs()).toBeGreaterThan(Number(k.leaseExpiresAtNs / 1_000_000n) + LEASE_MS);

    clock.advance(1_000);
    await kept.heartbeat();
    await tick(d);
    const backAt = clock.nowMs();
    // The same dispatch, its lease a full TTL from now; the other lease is left for now.
    expect(await itemRow(fx.db, k.id)).toMatchObject({ ...held(k, "lo-kept"), lease_expires_at: nsText(backAt + LEASE_MS) });
    expect(await itemRow(fx.db, q.id)).toMatchObject({ ...held(q, "lo-quiet"), lease_expires_at: String(q.leaseExpiresAtNs) });
    expect((await kept.complete([k], "done")).map((o) => o.ok)).toEqual([true]);
    expect(await itemRow(fx.db, k.id)).toMatchObject({ status: "completed", lease_token: k.leaseToken, redelivery_count: 0 });

    // lo-quiet is alive again (it beats) but never renews: its lease goes once LEASE_MS has passed
    // since the database came back, as it would have at the end of a lease granted then.
    while (clock.nowMs() - backAt < LEASE_MS + HEARTBEAT_MS) {
      clock.advance(HEARTBEAT_MS);
      await quiet.heartbeat();
      await tick(d);
      if (clock.nowMs() - backAt < LEASE_MS) expect(await itemRow(fx.db, q.id), `at +${clock.nowMs() - backAt}ms`).toMatchObject(held(q, "lo-quiet"));
      else
        expect(await itemRow(fx.db, q.id)).toMatchObject({ status: "pending", agent_id: null, lease_token: null, redelivery_count: 1, error: "lease expired" });
    }
    expect((await quiet.complete([q])).map((o) => o.ok)).toEqual([false]);
  });

  it("with two daemons, the first back does not expire the leases that the other, back later, extends for the agents it heard", async () => {
    const x = await side("lease-x");
    const y = await side("lease-y");
    const onY = await agentOn(y, "lo-on-y");
    const item = await holding(y, onY);
    await onY.heartbeat();
    await tick(x);
    await tick(y);

    cutOff(x);
    cutOff(y);
    const downAt = clock.nowMs();
    try {
      while (clock.nowMs() - downAt < 3 * LEASE_MS) {
        clock.advance(HEARTBEAT_MS);
        await onY.heartbeat();
        await tick(x);
        await tick(y);
      }
      // X gets the database back first, and sweeps.
      x.proxy.refuse(null);
      clock.advance(1_000);
      await tick(x);
      expect(await itemRow(fx.db, item.id)).toMatchObject(held(item, "lo-on-y"));
      clock.advance(HEARTBEAT_MS);
      await onY.heartbeat();
      await tick(x);
      expect(await itemRow(fx.db, item.id)).toMatchObject(held(item, "lo-on-y"));
    } finally {
      y.proxy.refuse(null);
    }
    // Y is back: the agent it heard from through the outage keeps its lease from now.
    await tick(y);
    const yBack = clock.nowMs();
    expect(await itemRow(fx.db, item.id)).toMatchObject({ ...held(item, "lo-on-y"), lease_expires_at: nsText(yBack + LEASE_MS) });
    clock.advance(LEASE_MS - 1);
    await onY.heartbeat();
    await tick(y);
    await tick(x);
    expect(await itemRow(fx.db, item.id)).toMatchObject(held(item, "lo-on-y"));
    expect((await onY.complete([item])).map((o) => o.ok)).toEqual([true]);
  });
});
