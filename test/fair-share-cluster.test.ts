/**
 * Fair share across daemons: two daemons on one schema, two agents on each (every agent on an
 * HTTP/2 session of its own), all serving tenants "a" (weight 3) and "b" (weight 1), claiming and
 * completing as fast as they can over real gRPC. Read back from the table in dispatch order, every
 * window of 200 dispatches while both tenants had a backlog gives "a" three quarters, within 6 %:
 * the turns live in the table, so it does not matter which daemon or agent took them.
 */
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { useTestDb } from "./support/kit.js";
import { Producer, TestAgent, type WorkItem } from "./support/queue.js";

const fx = useTestDb("fsharecl");
let A: Daemon;
let B: Daemon;

const config = (instanceId: string) => ({
  instanceId,
  tenantWeights: new Map([
    ["a", 3],
    ["b", 1],
  ]),
  fairShareCredit: 0,
  claimMaxItems: 8,
  leaseTtl: 600_000,
});

beforeAll(async () => {
  [A, B] = await Promise.all([fx.startDaemon({ config: config("fair-a") }), fx.startDaemon({ config: config("fair-b") })]);
});

describe("fair share across two daemons", () => {
  it("every window of 200 dispatches while both tenants wait gives each its weight's share, within 6 %", async () => {
    const producer = fx.closers.add(new Producer(A.address));
    // a's backlog is the smaller: at 3:1 it runs out after about 2,000 dispatches.
    for (let i = 0; i < 3; i++) await producer.enqueue("a", Array.from({ length: 500 }, () => ({ engineKind: "dag" })));
    for (let i = 0; i < 4; i++) await producer.enqueue("b", Array.from({ length: 500 }, () => ({ engineKind: "dag" })));
    const agents = await Promise.all(
      [A, A, B, B].map(async (d, i) => fx.closers.add(await TestAgent.register(d.address, `fair-${i}`, { tenants: ["a", "b"], engineKinds: ["dag"] }))),
    );
    let dispatched = 0;
    await Promise.all(
      agents.map(async (agent) => {
        let held: WorkItem[] = await agent.claim(8);
        dispatched += held.length;
        while (dispatched < 2400 && held.length > 0) {
          const res = await agent.claimCompleting(8, held);
          held = res.items;
          dispatched += held.length;
        }
        if (held.length > 0) await agent.complete(held);
      }),
    );
    const rows = await fx.db.raw<{ tenant_key: string }>(
      `SELECT tenant_key FROM ${fx.db.tables.qualified("work_item")} WHERE dispatched_at IS NOT NULL ORDER BY dispatched_at, id`,
    );
    const aTotal = 1500;
    let aSeen = 0;
    let windows = 0;
    for (let start = 0; start + 200 <= rows.length; start += 200) {
      const win = rows.slice(start, start + 200);
      const a = win.filter((r) => r.tenant_key === "a").length;
      aSeen += a;
      if (aSeen >= aTotal) break;
      windows++;
      expect(Math.abs(a / 200 - 0.75), `window ${windows}: a took ${a} of 200`).toBeLessThanOrEqual(0.06);
    }
    expect(windows).toBeGreaterThanOrEqual(7);
    // Both daemons dispatched: the share held across them, not by one doing all the work.
    const by = await fx.db.raw<{ leased_by: string; n: number }>(`SELECT leased_by, count(*)::int AS n FROM ${fx.db.tables.qualified("work_item")} WHERE dispatched_at IS NOT NULL GROUP BY 1`);
    expect(by.map((r) => r.leased_by).sort()).toEqual(["fair-a", "fair-b"]);
  });
});
