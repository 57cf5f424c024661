/**
 * Fair share between tenants and aging inside a tenant (src/domain/fair-share.ts), at the store:
 * claims of an agent that serves several tenants hand out items in proportion to the tenants'
 * weights, whatever their backlogs; an idle tenant banks at most the credit; priority stays strict
 * inside a tenant without spending the tenant's turns; and with aging, a low-priority item is taken
 * ahead of every item enqueued more than its priority's worth of steps after it.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WorkItemStore, type ClaimedRow, type Sharing } from "../src/store/work-items.js";
import { createTestDb, type TestDb } from "./support/db.js";
import { newItem } from "./support/queue.js";

const NOW = Date.UTC(2026, 0, 1);
let db: TestDb;
beforeAll(async () => {
  db = await createTestDb({ label: "fshare" });
});
afterAll(async () => {
  await db?.drop();
});

const table = (name: "agent" | "work_item" | "tenant_share" | "fair_share_turn") => db.tables.qualified(name);
const storeWith = (sharing: Partial<Sharing> = {}) =>
  new WorkItemStore(db.pool, db.tables, { baseMs: 1000, capMs: 1000, jitter: false }, undefined, { weights: new Map(), credit: 100, agingMs: 0, ...sharing });

async function reset(tenants: string[]): Promise<void> {
  // The pools' current turns go too (the floor row, pool '', stays: migration 0015).
  await db.raw(
    `DELETE FROM ${table("work_item")}; DELETE FROM ${table("tenant_share")}; DELETE FROM ${table("agent")}; DELETE FROM ${table("fair_share_turn")} WHERE pool <> ''`,
  );
  await db.raw(`INSERT INTO ${table("agent")} (id, name, status, metadata, createdby, createdon) VALUES ('A1', 'a', 'active', $1, 'test', now())`, [
    JSON.stringify({ tenants, engineKinds: ["dag"] }),
  ]);
}

async function enqueue(store: WorkItemStore, tenant: string, n: number, atMs = NOW, over: Parameters<typeof newItem>[0] = {}): Promise<string[]> {
  const rows = WorkItemStore.rows(
    tenant,
    "e",
    Array.from({ length: n }, () => newItem(over)),
    atMs,
    "test",
  );
  return (await store.enqueueRows(rows)).map((r) => r.id);
}

let seq = 0;
async function claimOnce(store: WorkItemStore, max: number, tenants: number, nowMs = NOW, agent = "a"): Promise<ClaimedRow[]> {
  const { claimed } = await store.claim({
    agent,
    instance: "test",
    max,
    nowMs,
    leaseTtlMs: 60_000,
    affinity: { policy: "rebind", graceMs: 60_000 },
    bindingSeed: `01KB${String(++seq).padStart(22, "0")}`,
    liveEdgeMs: 0,
    leaseToken: `tok-${seq}`,
    tenants,
  });
  return claimed;
}

/**
 * Claims of `max` by the agent until `n` items are dispatched (or nothing is left): the tenants of
 * the dispatched items in dispatch order (within one claim, by turn: share_tag read back after).
 */
async function drain(store: WorkItemStore, n: number, opts: { max?: number; tenants: number; nowMs?: number; agent?: string }): Promise<ClaimedRow[]> {
  const out: ClaimedRow[] = [];
  while (out.length < n) {
    const got = await claimOnce(store, Math.min(opts.max ?? 10, n - out.length), opts.tenants, opts.nowMs, opts.agent);
    if (got.length === 0) break;
    out.push(...got);
  }
  return out;
}

const countOf = (rows: readonly ClaimedRow[], tenant: string) => rows.filter((r) => r.tenant_key === tenant).length;

/**
 * Cuts `rows` into windows of `size` dispatches while every tenant in `weights` still had a
 * backlog, and returns each window's largest distance between a tenant's count and its weight's
 * share of the window.
 */
function worstDeviation(rows: readonly ClaimedRow[], weights: Record<string, number>, backlog: Record<string, number>, size: number): number {
  const total = Object.values(weights).reduce((a, b) => a + b, 0);
  const seen: Record<string, number> = {};
  let worst = 0;
  for (let start = 0; start + size <= rows.length; start += size) {
    const win = rows.slice(start, start + size);
    for (const r of win) seen[r.tenant_key] = (seen[r.tenant_key] ?? 0) + 1;
    // A window in which some tenant ran out is past the stretch where all compete.
    if (Object.keys(weights).some((t) => (seen[t] ?? 0) >= backlog[t]!)) break;
    for (const [t, w] of Object.entries(weights)) worst = Math.max(worst, Math.abs(countOf(win, t) - (size * w) / total));
  }
  return worst;
}

describe("fair share between tenants", () => {
  const cases: { name: string; weights: Record<string, number>; backlog: Record<string, number> }[] = [
    { name: "two tenants 1:1, backlogs 2,000 and 200", weights: { big: 1, small: 1 }, backlog: { big: 2000, small: 200 } },
    { name: "two tenants 3:1, the heavier with the smaller backlog", weights: { heavy: 3, light: 1 }, backlog: { heavy: 600, light: 3000 } },
    { name: "three tenants 1:2:7", weights: { one: 1, two: 2, seven: 7 }, backlog: { one: 300, two: 2500, seven: 4000 } },
    {
      name: "ten tenants, weights 1 to 10, backlogs from 100 to 5,000",
      weights: Object.fromEntries(Array.from({ length: 10 }, (_, i) => [`t${i}`, i + 1])),
      backlog: Object.fromEntries(Array.from({ length: 10 }, (_, i) => [`t${i}`, [5000, 100, 3000, 400, 2000, 800, 1500, 600, 1200, 900][i]!])),
    },
  ];
  for (const c of cases)
    it(`${c.name}: each window of 100 dispatches is within 2 items of the weights`, async () => {
      const tenants = Object.keys(c.weights);
      const store = storeWith({ weights: new Map(Object.entries(c.weights)), credit: 0 });
      await reset(tenants);
      // Enqueued one after another, the largest first: the first tenant's backlog is all ahead in time.
      for (const t of [...tenants].sort((x, y) => c.backlog[y]! - c.backlog[x]!)) await enqueue(store, t, c.backlog[t]!);
      const rows = await drain(store, 2000, { tenants: tenants.length });
      expect(rows.length).toBe(2000);
      const worst = worstDeviation(rows, c.weights, c.backlog, 100);
      expect(worst).toBeLessThanOrEqual(2);
    });

  it("a tenant whose weight is an operator's (on its row) is shared by that weight over the configured one", async () => {
    const store = storeWith({
      weights: new Map([
        ["a", 1],
        ["b", 1],
      ]),
      credit: 0,
    });
    await reset(["a", "b"]);
    await db.raw(`INSERT INTO ${table("tenant_share")} (id, tenant_key, weight, createdby, createdon) VALUES ('S1', 'a', 4, 'test', now())`);
    await enqueue(store, "a", 1000);
    await enqueue(store, "b", 1000);
    const rows = await drain(store, 500, { tenants: 2 });
    expect(countOf(rows, "a")).toBeGreaterThanOrEqual(398);
    expect(countOf(rows, "a")).toBeLessThanOrEqual(402);
  });

  it("an idle tenant banks at most the credit: back after a long idle spell it is ahead by the credit, then shares", async () => {
    for (const credit of [0, 20]) {
      const store = storeWith({ credit });
      await reset(["a", "b"]);
      // b was busy once, then idle while a's long backlog went by.
      await enqueue(store, "b", 10);
      await enqueue(store, "a", 3000);
      await drain(store, 1000, { tenants: 2 });
      await enqueue(store, "b", 300, NOW + 1000);
      const rows = await drain(store, 100, { tenants: 2 });
      const b = countOf(rows, "b");
      // Its first `credit` items go first, the rest alternate with a's.
      expect(b).toBeGreaterThanOrEqual(credit + (100 - credit) / 2 - 2);
      expect(b).toBeLessThanOrEqual(credit + (100 - credit) / 2 + 2);
    }
  });

  // The queue's current turn is the turn claims hand out, not the earliest pending one: an item no
  // agent can take (an engine kind nobody serves) sits at an old turn forever, and a tenant that
  // becomes busy must still start at most the credit ahead of the tenant being served.
  it("one stale item of an engine kind nobody serves does not give a newly busy tenant more than the credit", async () => {
    const store = storeWith({ credit: 100 });
    await reset(["a", "b"]);
    await enqueue(store, "x", 1, NOW - 60_000, { engineKind: "nobody-serves-this" });
    await enqueue(store, "a", 3000);
    await drain(store, 1000, { tenants: 2 });
    await enqueue(store, "b", 2000, NOW + 1000);
    const rows = await drain(store, 600, { tenants: 2 });
    const b = countOf(rows, "b");
    // Expected: b's 100 items of credit, then half of the other 500: 350 (58 %). Before the fix b
    // started 1,000 turns back, at the stale item's turn, and took all 600.
    expect(b, `b took ${b} of 600`).toBeGreaterThanOrEqual(340);
    expect(b, `b took ${b} of 600`).toBeLessThanOrEqual(360);
    expect(countOf(rows, "a")).toBeGreaterThanOrEqual(240);
  });

  it("tenants that become busy one after another start at the same turn, not each ahead of the one before (no LIFO)", async () => {
    const tenants = ["n1", "n2", "n3", "n4", "n5"];
    const store = storeWith({ credit: 100 });
    await reset(tenants);
    for (const [i, t] of tenants.entries()) await enqueue(store, t, 300, NOW + i);
    const rows = await drain(store, 100, { tenants: tenants.length });
    const counts = tenants.map((t) => countOf(rows, t));
    // Each idle tenant banks the same credit from the same current turn, so the first 100 go 20
    // apiece. Before the fix each arrival started 100 turns before the last: n5 took all 100.
    for (const c of counts) {
      expect(c, `counts n1..n5: ${counts.join(", ")}`).toBeGreaterThanOrEqual(19);
      expect(c, `counts n1..n5: ${counts.join(", ")}`).toBeLessThanOrEqual(21);
    }
  });

  it("agents of other tenants that hand out later turns do not set back a tenant that becomes busy beside a slower agent", async () => {
    const store = storeWith({ credit: 100 });
    await reset(["a", "b"]);
    await db.raw(`INSERT INTO ${table("agent")} (id, name, status, metadata, createdby, createdon) VALUES ('A2', 'a2', 'active', $1, 'test', now())`, [
      JSON.stringify({ tenants: ["c", "d"], engineKinds: ["dag"] }),
    ]);
    await enqueue(store, "a", 3000);
    await enqueue(store, "c", 3000);
    // Agent a (tenants a, b) gets through 2,000 of a's turns, agent a2 (c, d) through 200 of c's.
    await drain(store, 2000, { tenants: 2, max: 50 });
    await drain(store, 200, { tenants: 2, agent: "a2" });
    await enqueue(store, "d", 1000, NOW + 1000);
    const rows = await drain(store, 600, { tenants: 2, agent: "a2" });
    // d starts at a2's turn less the credit, not at a's: 100 first, then half the rest.
    const d = countOf(rows, "d");
    expect(d, `d took ${d} of 600`).toBeGreaterThanOrEqual(340);
    expect(d, `d took ${d} of 600`).toBeLessThanOrEqual(360);
  });

  it("a tenant's turns go to its best items by priority, and those items do not cost its neighbours extra turns", async () => {
    const store = storeWith({ credit: 0 });
    await reset(["a", "b"]);
    await enqueue(store, "a", 300, NOW, { priority: 5 });
    await enqueue(store, "b", 300, NOW, { priority: 5 });
    await drain(store, 20, { tenants: 2 });
    const urgent = await enqueue(store, "a", 10, NOW + 1000, { priority: 0 });
    const rows = await drain(store, 200, { tenants: 2 });
    // a's next ten turns go to its urgent items, at once (priority is strict inside the tenant)...
    const firstA = rows.filter((r) => r.tenant_key === "a").slice(0, 10);
    expect(new Set(firstA.map((r) => r.id))).toEqual(new Set(urgent));
    // ...and they take a's turns: it still gets half (an urgent item that spent no turn would give a ten more).
    expect(countOf(rows, "a")).toBeGreaterThanOrEqual(98);
    expect(countOf(rows, "a")).toBeLessThanOrEqual(102);
  });

  it("an agent of one tenant takes that tenant's items by priority, whatever other tenants hold", async () => {
    const store = storeWith();
    await reset(["a"]);
    await enqueue(store, "b", 50, NOW - 5000, { priority: 0 });
    const low = await enqueue(store, "a", 5, NOW - 5000, { priority: 3 });
    const high = await enqueue(store, "a", 5, NOW, { priority: 1 });
    const rows = await drain(store, 20, { tenants: 1 });
    expect(rows.map((r) => r.id)).toEqual([...high, ...low]);
  });
});

describe("aging inside a tenant", () => {
  // With a 10 s step, a priority-3 item enqueued at NOW ranks with priority-0 items enqueued at NOW + 30 s.
  const STEP = 10_000;
  for (const tenants of [1, 2])
    it(`a low-priority item goes ahead of every item enqueued more than its priority's worth of steps after it (agent of ${tenants} tenant${tenants > 1 ? "s" : ""})`, async () => {
      for (const agingMs of [STEP, 0]) {
        const store = storeWith({ agingMs, credit: 0 });
        await reset(tenants === 1 ? ["a"] : ["a", "b"]);
        const [low] = await enqueue(store, "a", 1, NOW, { priority: 3 });
        const stream: string[] = [];
        for (let s = 1; s <= 50; s++) stream.push(...(await enqueue(store, "a", 1, NOW + s * 1000, { priority: 0 })));
        const order = (await drain(store, 51, { tenants, max: 1, nowMs: NOW + 60_000 })).map((r) => r.id);
        if (agingMs > 0) {
          // Enqueued at NOW + 1 s … NOW + 29 s, 29 items rank ahead of it; the one of NOW + 30 s ties, and
          // ties go by id, the older first.
          expect(order.indexOf(low!)).toBe(29);
          expect(order.slice(0, 29)).toEqual(stream.slice(0, 29));
        } else expect(order.indexOf(low!)).toBe(50);
      }
    });
});
