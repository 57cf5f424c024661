/**
 * Fair share across daemons: two daemons on one schema, two agents on each (every agent on an
 * HTTP/2 session of its own), all serving every tenant of the case, claiming and completing as fast
 * as they can over real gRPC. Read back from the table in dispatch order, every window of 200
 * dispatches while all the tenants had a backlog gives each tenant its weight's share, within 6
 * items: the turns live in the table, so it does not matter which daemon or agent took them. The
 * weights come from the daemons' configuration in the first case and from operators' weights (the
 * tenants' rows) in the others.
 */
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { useTestCluster } from "./support/kit.js";
import { Producer, TestAgent, type WorkItem } from "./support/queue.js";

const fx = useTestCluster("fsharecl", {
  instances: ["fair-a", "fair-b"],
  config: {
    tenantWeights: new Map([
      ["a", 3],
      ["b", 1],
    ]),
    fairShareCredit: 0,
    claimMaxItems: 8,
    leaseTtl: 600_000,
  },
});
let A: Daemon;
let B: Daemon;

beforeAll(() => {
  [A, B] = fx.daemons;
});

interface Case {
  name: string;
  weights: Record<string, number>;
  backlog: Record<string, number>;
  /** The weights are operators' (written on the tenants' rows) rather than the daemons' configured ones. */
  operator: boolean;
}

const CASES: Case[] = [
  { name: "two tenants 3:1 (configured)", weights: { a: 3, b: 1 }, backlog: { a: 1500, b: 2000 }, operator: false },
  { name: "two tenants 1:1", weights: { c: 1, d: 1 }, backlog: { c: 3000, d: 1200 }, operator: true },
  { name: "three tenants 1:2:7", weights: { e: 1, f: 2, g: 7 }, backlog: { e: 400, f: 1000, g: 3000 }, operator: true },
  {
    name: "ten tenants, weights 1 to 10",
    weights: Object.fromEntries(Array.from({ length: 10 }, (_, i) => [`h${i}`, i + 1])),
    backlog: Object.fromEntries(Array.from({ length: 10 }, (_, i) => [`h${i}`, 200 + 150 * i])),
    operator: true,
  },
];

describe("fair share across two daemons", () => {
  for (const c of CASES)
    it(`${c.name}: every window of 200 dispatches while all wait gives each tenant its share, within 6 items`, async () => {
      const tenants = Object.keys(c.weights);
      const total = Object.values(c.weights).reduce((x, y) => x + y, 0);
      await fx.db.raw(`DELETE FROM ${fx.db.tables.qualified("work_item")}`);
      if (c.operator)
        for (const t of tenants)
          await fx.db.raw(
            `INSERT INTO ${fx.db.tables.qualified("tenant_share")} (id, tenant_key, weight, createdby, createdon) VALUES ($1, $2, $3, 'test', now())`,
            [`S-${t}`, t, c.weights[t]],
          );
      const producer = fx.closers.add(new Producer(A.address));
      for (const t of tenants)
        for (let left = c.backlog[t]!; left > 0; left -= 500)
          await producer.enqueue(
            t,
            Array.from({ length: Math.min(500, left) }, () => ({ engineKind: "dag" })),
          );
      const agents = await Promise.all(
        [A, A, B, B].map(async (d, i) => fx.closers.add(await TestAgent.register(d.address, `${tenants[0]}-${i}`, { tenants, engineKinds: ["dag"] }))),
      );
      const all = Object.values(c.backlog).reduce((x, y) => x + y, 0);
      let dispatched = 0;
      await Promise.all(
        agents.map(async (agent) => {
          let held: WorkItem[] = await agent.claim(8);
          dispatched += held.length;
          while (dispatched < all && held.length > 0) {
            held = (await agent.claimCompleting(8, held)).items;
            dispatched += held.length;
          }
          if (held.length > 0) await agent.complete(held);
        }),
      );
      // dispatched_at is the claiming daemon's clock in whole milliseconds, so claims of one
      // millisecond tie; they are put in turn order (share_tag) rather than id order, which is
      // enqueue order and would list one tenant's items of the tie before the other's and let a
      // window's edge cut a tie group by tenant.
      const rows = await fx.db.raw<{ tenant_key: string; leased_by: string }>(
        `SELECT tenant_key, leased_by FROM ${fx.db.tables.qualified("work_item")} WHERE dispatched_at IS NOT NULL ORDER BY dispatched_at, share_tag, id`,
      );
      const seen: Record<string, number> = {};
      let windows = 0;
      let worst = 0;
      for (let start = 0; start + 200 <= rows.length; start += 200) {
        const win = rows.slice(start, start + 200);
        for (const r of win) seen[r.tenant_key] = (seen[r.tenant_key] ?? 0) + 1;
        if (tenants.some((t) => seen[t]! >= c.backlog[t]!)) break;
        windows++;
        for (const t of tenants) worst = Math.max(worst, Math.abs(win.filter((r) => r.tenant_key === t).length - (200 * c.weights[t]!) / total));
      }
      expect(windows).toBeGreaterThanOrEqual(2);
      expect(worst, `over ${windows} windows`).toBeLessThanOrEqual(6);
      // Both daemons dispatched: the share held across them, not by one doing all the work.
      expect(new Set(rows.map((r) => r.leased_by))).toEqual(new Set(["fair-a", "fair-b"]));
      for (const a of agents) a.close();
    });
});
