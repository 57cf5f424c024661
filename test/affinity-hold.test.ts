/**
 * The hold policy: a key's items wait for their agent through the grace, go back to it when it
 * returns, and become dead letters naming the key and the agent after the grace.
 *
 * End to end over real HTTP/2 and a real Postgres, on the daemon of useAffinityDaemon
 * (support/affinity.ts): a fake clock that only a test moves, nothing on a timer. Every test uses
 * tenants, agents and keys of its own.
 */
import { describe, expect, it } from "vitest";
import { agent, at, BACKOFF, bindingOf, deregister, enqueue, GRACE, ids, keyed, plain, statuses, useAffinityDaemon } from "./support/affinity.js";
import { sorted } from "./support/ops.js";
import { itemRows } from "./support/queue.js";

const H = useAffinityDaemon("affh", "hold");

describe("hold policy", () => {
  it("items wait for their agent: it gets them back when it returns within the grace; after the grace they become dead letters naming the key and the agent", async () => {
    const { clock } = H;
    const t = "hd";
    const K = "hd/run-1";
    const a = await agent(H, "hd-a", { tenants: [t] });
    const b = await agent(H, "hd-b", { tenants: [t] });
    const items = await enqueue(H, t, [keyed("k", K), keyed("k", K), keyed("k", K)]);
    const t0 = clock.nowMs();
    expect(ids(await a.claim(1))).toEqual([items[0]]);

    await deregister(a);
    const [other] = await enqueue(H, t, [plain("k")]);
    expect(ids(await b.claim(10))).toEqual([other]);

    // A returns within the grace and finds its key's items waiting for it.
    clock.set(t0 + GRACE / 2);
    await H.daemon.maintenance.runOnce();
    expect(await b.claim(10)).toEqual([]);
    await a.register();
    const back = await a.claimResponse(10);
    expect(ids(back.items)).toEqual(sorted(items));
    expect(back.affinityKeys).toEqual([K]);
    const t1 = clock.nowMs();
    expect(await bindingOf(H.db, K)).toMatchObject({ agent_id: a.name, updatedon: at(t1) });

    // A leaves again and does not return.
    await deregister(a);
    expect(await statuses(H, items)).toEqual(["pending", "pending", "pending"]);
    clock.set(t1 + GRACE);
    await H.daemon.maintenance.runOnce();
    expect(await b.claim(10)).toEqual([]);
    expect(await statuses(H, items)).toEqual(["pending", "pending", "pending"]);

    // Past the grace (and past the backoff of the items A gave back): still never B's; the sweep
    // turns them into dead letters.
    clock.set(t1 + GRACE + 2 * BACKOFF + 1);
    expect(await b.claim(10)).toEqual([]);
    await H.daemon.maintenance.runOnce();
    const rows = await itemRows(H.db, "id = ANY($1)", [items]);
    expect(rows.map((r) => r.status)).toEqual(["failed", "failed", "failed"]);
    for (const r of rows) {
      expect(r.agent_id).toBeNull();
      expect(r.error).toBe(`affinity key ${K} is bound to agent ${a.name}, which cannot take work (policy hold); unbind or rebind the key, then redrive`);
    }
    expect(await b.claim(10)).toEqual([]);
    expect((await bindingOf(H.db, K))!.agent_id).toBe(a.name);
  });
});
