/**
 * Rate limits (src/domain/rate-limits.ts) kept by the claim statement, raced by two agents on two
 * connection pools (as two daemons would claim) at the same instants of a fake clock:
 *   - no window of one interval ever holds more of a key's dispatches than count + burst − 1
 *     (measured from the dispatch times in the table), and the limit is reached, not just kept;
 *   - items without a limit, and items of other keys, are not held back behind a limited backlog;
 *   - a waiting claim whose only work is held by a limit takes it when the key's next slot comes,
 *     with nothing else to wake it.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FakeClock, msToNs } from "../src/clock.js";
import { openPool } from "../src/db/pool.js";
import { windowBound } from "../src/domain/rate-limits.js";
import { WorkItemStore, type ClaimedRow } from "../src/store/work-items.js";
import { createTestDb, type TestDb } from "./support/db.js";
import { useTestDb } from "./support/kit.js";
import { scrapeMetrics } from "./support/metrics.js";
import { newItem, Producer, STATEMENT, TestAgent, untilStatementRan } from "./support/queue.js";

const NOW = Date.UTC(2026, 0, 1);
let db: TestDb;
let other: Awaited<ReturnType<typeof openPool>>;
beforeAll(async () => {
  db = await createTestDb({ label: "rlimit" });
  other = await openPool({ url: db.url, maxConnections: 4 });
});
afterAll(async () => {
  await other?.end();
  await db?.drop();
});

const table = (name: "agent" | "work_item" | "rate_limit") => db.tables.qualified(name);
const backoff = { baseMs: 1000, capMs: 1000, jitter: false };

async function reset(): Promise<void> {
  await db.raw(`DELETE FROM ${table("work_item")}; DELETE FROM ${table("rate_limit")}; DELETE FROM ${table("agent")}`);
  await db.raw(
    `INSERT INTO ${table("agent")} (id, name, status, metadata, createdby, createdon)
     VALUES ('A1', 'a', 'active', $1, 'test', now()), ('B1', 'b', 'active', $1, 'test', now())`,
    [JSON.stringify({ tenants: ["t"], engineKinds: ["dag"] })],
  );
}

const limit = (key: string, count: number, intervalMs: number, burst: number, prefix = false) =>
  db.raw(
    `INSERT INTO ${table("rate_limit")} (id, tenant_key, key, prefix, limit_count, interval_ns, burst, createdby, createdon) VALUES ($1, 't', $2, $3, $4, $5, $6, 'test', now())`,
    [`R${key}${prefix}`, key, prefix, count, String(msToNs(intervalMs)), burst],
  );

const keyed = (key: string | null) => newItem({ rateLimitKey: key, workerParams: key ? { rateLimitKey: key } : null });

let seq = 0;
/** A claim of up to `max` at `nowMs`, asking again for the rest while a rate limit held rows back (as the daemon's Claim does). */
async function claimAt(store: WorkItemStore, agent: string, nowMs: number, max = 8): Promise<ClaimedRow[]> {
  const out: ClaimedRow[] = [];
  for (let round = 0; round < 4 && out.length < max; round++) {
    const r = await store.claim({
      agent,
      instance: "test",
      max: max - out.length,
      nowMs,
      leaseTtlMs: 3_600_000,
      affinity: { policy: "rebind", graceMs: 60_000 },
      bindingSeed: `01KC${String(++seq).padStart(22, "0")}`,
      liveEdgeMs: 0,
      leaseToken: `tok-${seq}`,
    });
    out.push(...r.claimed);
    if (!r.heldBack || r.claimed.length === 0) break;
  }
  return out;
}

/** Dispatch times (epoch ms) of the items of `key`, ascending. */
async function dispatchTimes(key: string): Promise<number[]> {
  const rows = await db.raw<{ at: string }>(
    `SELECT dispatched_at::text AS at FROM ${table("work_item")} WHERE rate_limit_key = $1 AND dispatched_at IS NOT NULL ORDER BY dispatched_at`,
    [key],
  );
  return rows.map((r) => Number(BigInt(r.at) / 1_000_000n));
}

/** The most dispatches any half-open window [d, d + interval) holds, d running over the dispatch times. */
function busiestWindow(times: readonly number[], intervalMs: number): number {
  let most = 0;
  for (let i = 0, j = 0; i < times.length; i++) {
    while (j < times.length && times[j]! < times[i]! + intervalMs) j++;
    most = Math.max(most, j - i);
  }
  return most;
}

describe("rate limits in the claim", () => {
  for (const burst of [1, 5])
    it(`10 per second with a burst of ${burst}: no window of a second holds more than ${windowBound({ count: 10, intervalMs: 1000, burst })}, the rest of the queue goes at full speed`, async () => {
      await reset();
      await limit("api", 10, 1000, burst);
      const A = new WorkItemStore(db.pool, db.tables, backoff);
      const B = new WorkItemStore(other, db.tables, backoff);
      const rows = [
        ...Array.from({ length: 200 }, () => keyed("api")),
        ...Array.from({ length: 100 }, () => keyed(null)),
        ...Array.from({ length: 50 }, () => keyed("unlimited")),
      ];
      await A.enqueueRows(WorkItemStore.rows("t", "e", rows, NOW - 1000, "test"));
      // Both agents claim at each instant, 25 ms apart, for 5 s: they race for every slot.
      for (let step = 0; step < 200; step++) {
        const at = NOW + step * 25;
        await Promise.all([claimAt(A, "a", at), claimAt(B, "b", at)]);
      }
      const times = await dispatchTimes("api");
      expect(busiestWindow(times, 1000)).toBeLessThanOrEqual(windowBound({ count: 10, intervalMs: 1000, burst }));
      // The limit is reached: the first `burst` at once, then one per 100 ms (and nothing more).
      expect(times.length).toBeGreaterThanOrEqual(49 + burst - 1);
      expect(times.slice(0, burst).every((t) => t === NOW)).toBe(true);
      // The 150 items without a limit go as fast as claims take them, though the limited backlog is
      // ahead of them in claim order: two claims of 8 per instant take them in 10 instants, less what
      // the limited key's slots and lost races cost (a few rounds now and then), so all within the
      // first 20 (half a second). Held behind the limited key, they would wait for its 200 items: 20 s.
      const unlimited = await db.raw<{ n: number }>(
        `SELECT count(*)::int AS n FROM ${table("work_item")} WHERE (rate_limit_key IS NULL OR rate_limit_key = 'unlimited') AND dispatched_at <= $1`,
        [String(msToNs(NOW + 19 * 25))],
      );
      expect(unlimited[0]!.n).toBe(150);
    });

  it("a prefix's limit holds each key under it, and a key's own limit stands over it", async () => {
    await reset();
    await limit("model:", 2, 1000, 1, true);
    await limit("model:big", 1, 1000, 1);
    const A = new WorkItemStore(db.pool, db.tables, backoff);
    await A.enqueueRows(
      WorkItemStore.rows(
        "t",
        "e",
        [...Array.from({ length: 10 }, () => keyed("model:small")), ...Array.from({ length: 10 }, () => keyed("model:big"))],
        NOW - 1000,
        "test",
      ),
    );
    for (let step = 0; step < 40; step++) await claimAt(A, "a", NOW + step * 50);
    // 2 s: the small key at 2 per second (one per 500 ms: 0, 500, 1000, 1500), the big one at 1 per second.
    expect(await dispatchTimes("model:small")).toEqual([NOW, NOW + 500, NOW + 1000, NOW + 1500]);
    expect(await dispatchTimes("model:big")).toEqual([NOW, NOW + 1000]);
  });
});

describe("a waiting claim and a closed key", () => {
  const clock = new FakeClock(NOW);
  const fx = useTestDb("rlwait");
  it("takes the held item when the key's next slot comes, with nothing else to wake it", async () => {
    const daemon = await fx.startDaemon({
      clock,
      config: { sweepInterval: 3_600_000, heartbeatInterval: 86_400_000, heartbeatFlush: 3_600_000, httpListen: { host: "127.0.0.1", port: 0 } },
    });
    await fx.db.raw(
      `INSERT INTO ${fx.db.tables.qualified("rate_limit")} (id, tenant_key, key, prefix, limit_count, interval_ns, burst, createdby, createdon) VALUES ('R1', 't', 'api', false, 1, $1, 1, 'test', now())`,
      [String(msToNs(200))],
    );
    const producer = fx.closers.add(new Producer(daemon.address));
    const agent = fx.closers.add(await TestAgent.register(daemon.address, "w1", { tenants: ["t"], engineKinds: ["dag"] }));
    await producer.enqueue("t", [
      { engineKind: "dag", workerParams: { rateLimitKey: "api" } },
      { engineKind: "dag", workerParams: { rateLimitKey: "api" } },
    ]);
    // One of the two goes; the claim statement that held the other back is counted.
    expect(await agent.claim(2)).toHaveLength(1);
    expect((await scrapeMetrics(daemon.httpUrl!)).series("aiflow_queue_rate_limited_claims_total")).toBe(1);
    const since = (await fx.db.raw<{ t: Date }>("SELECT clock_timestamp() AS t"))[0]!.t;
    const waiting = agent.claim(1, 20_000);
    // Its first look found the key closed; it now waits, and nothing will ring for this key.
    await untilStatementRan(fx.db, STATEMENT.claim, since);
    clock.advance(200);
    const got = await waiting;
    expect(got).toHaveLength(1);
  });
});
