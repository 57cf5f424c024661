/**
 * The directive hub over a real LISTEN connection: what it caches of each agent's status, and what
 * becomes of that cache when the connection is dropped and comes back (directives published in
 * between are lost, so the cache can no longer be trusted).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import { PgListener } from "../src/db/notify.js";
import { silentLogger } from "../src/log.js";
import { DirectiveHub, type DirectiveMessage } from "../src/fleet/directives.js";
import { createTestDb, type TestDb } from "./support/db.js";

let db: TestDb;
let listener: PgListener;
let hub: DirectiveHub;
let channel: string;

beforeAll(async () => {
  db = await createTestDb({ migrate: false, label: "directives" });
  channel = db.tables.channel("directive");
  listener = new PgListener(db.url, silentLogger(), { firstRetryMs: 10 });
  await listener.start();
  hub = new DirectiveHub(db.pool, channel, new FakeClock(), silentLogger(), 60_000);
  await hub.start(listener);
});
afterAll(async () => {
  await listener?.stop();
  await db?.drop();
});

const draining: DirectiveMessage = { kind: "status", status: "draining", reason: "deploy", drainDeadline: null };

/** Resolves with the next directive the hub hears for `agent`. */
const heard = (agent: string) =>
  new Promise<DirectiveMessage>((resolve) => {
    const off = hub.subscribe(agent, (d) => {
      off();
      resolve(d);
    });
  });

describe("directive hub", () => {
  it("updates a cached agent's status from a status directive it hears", async () => {
    hub.remember("cached", { status: "active", drain: null });
    const next = heard("cached");
    await hub.publish("cached", draining);
    expect(await next).toEqual(draining);
    expect(hub.known("cached")?.status).toBe("draining");
    expect(hub.known("cached")?.drain?.reason).toBe("deploy");
  });

  it("forgets every cached status when its listener reconnects, and hears directives again after", async () => {
    hub.remember("missed", { status: "active", drain: null });
    const reconnected = new Promise<void>((resolve) => listener.onReconnect(resolve));
    // Drop this hub's LISTEN connection from the server side, as a failover or a restart would. Any
    // drain published until it is back is lost, so a kept ACTIVE would be answered to the agent
    // (heartbeats and claims read the cache) for as long as it runs.
    const killed = await db.raw<{ ok: boolean }>(
      `SELECT pg_terminate_backend(pid) AS ok FROM pg_stat_activity WHERE application_name = 'aiflowd-listen' AND query LIKE '%' || $1 || '%'`,
      [channel],
    );
    expect(killed).toEqual([{ ok: true }]);
    await reconnected;
    expect(hub.known("missed")).toBeUndefined();

    hub.remember("missed", { status: "active", drain: null });
    const next = heard("missed");
    await hub.publish("missed", draining);
    expect(await next).toEqual(draining);
    expect(hub.known("missed")?.status).toBe("draining");
  });
});

describe("the scope cache", () => {
  it("ages by the hub's clock: a scope is served until maxAgeMs has passed on it, then read afresh", () => {
    const clock = new FakeClock();
    const scoped = new DirectiveHub(db.pool, channel, clock, silentLogger(), 60_000);
    const scope = { tenants: ["t1"], kinds: ["k"], slots: 2 };
    scoped.rememberScope("a1", scope);
    expect(scoped.scope("a1", 5_000)).toEqual(scope);
    clock.advance(4_999);
    expect(scoped.scope("a1", 5_000)).toEqual(scope);
    clock.advance(1);
    expect(scoped.scope("a1", 5_000)).toBeUndefined();
  });
});
