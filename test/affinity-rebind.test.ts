/**
 * The rebind policy: a key whose agent left waits through the grace (since its last dispatch) and
 * then moves to the next agent that claims it; a key of an active agent never moves; and a draining
 * agent keeps its key while an item of the key is in flight.
 *
 * End to end over real HTTP/2 and a real Postgres, on the daemon of useAffinityDaemon
 * (support/affinity.ts): a fake clock that only a test moves, nothing on a timer. Every test uses
 * tenants, agents and keys of its own.
 */
import { describe, expect, it } from "vitest";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import { agent, at, bindingOf, deregister, enqueue, GRACE, ids, keyed, keysOf, plain, statuses, useAffinityDaemon } from "./support/affinity.js";
import { sorted } from "./support/ops.js";
import { itemRow } from "./support/queue.js";

const R = useAffinityDaemon("affr", "rebind");

describe("rebind policy", () => {
  it("a key whose agent left waits through the grace (since its last dispatch), then moves to the next agent that claims it", async () => {
    const { clock } = R;
    const t = "rb";
    const K = "rb/run-1";
    const a = await agent(R, "rb-a", { tenants: [t] });
    const b = await agent(R, "rb-b", { tenants: [t] });
    const items = await enqueue(R, t, [keyed("k", K), keyed("k", K), keyed("k", K)]);
    const t0 = clock.nowMs();

    const first = await a.claimResponse(1);
    expect(ids(first.items)).toEqual([items[0]]);
    expect(first.affinityKeys).toEqual([K]);
    expect(await bindingOf(R.db, K)).toMatchObject({ agent_id: a.name, createdon: at(t0), updatedon: at(t0) });
    expect(await keysOf(R, a.name)).toEqual([K]);

    await deregister(a);
    // Its item went back at once (an attempt spent, due after the backoff).
    expect(await itemRow(R.db, items[0]!)).toMatchObject({ status: "pending", agent_id: null, retry_count: 0, redelivery_count: 1 });

    // B claims fine, but nothing of the key.
    const [other] = await enqueue(R, t, [plain("k")]);
    expect(ids(await b.claim(10))).toEqual([other]);
    clock.set(t0 + GRACE);
    await R.daemon.maintenance.runOnce();
    expect(await b.claim(10)).toEqual([]);
    expect(await bindingOf(R.db, K)).toMatchObject({ agent_id: a.name, updatedon: at(t0) });
    expect(await statuses(R, items)).toEqual(["pending", "pending", "pending"]);

    // Past the grace: the policy never dead-letters them, and B's claim moves the key and takes them.
    clock.set(t0 + GRACE + 1);
    await R.daemon.maintenance.runOnce();
    expect(await statuses(R, items)).toEqual(["pending", "pending", "pending"]);
    const moved = await b.claimResponse(10);
    expect(ids(moved.items)).toEqual(sorted(items));
    expect(moved.affinityKeys).toEqual([K]);
    expect(await bindingOf(R.db, K)).toMatchObject({ agent_id: b.name, createdon: at(t0), updatedon: at(t0 + GRACE + 1), updatedby: b.name });
    expect(await keysOf(R, b.name)).toEqual([K]);
    expect(await keysOf(R, a.name)).toEqual([]);

    // A comes back: the key stays with B.
    await a.register();
    const [late] = await enqueue(R, t, [keyed("k", K)]);
    expect(await a.claim(10)).toEqual([]);
    expect(ids(await b.claim(10))).toEqual([late]);
  });

  it("a key of an active agent never moves, however long it has been idle", async () => {
    const { clock } = R;
    const t = "rb-active";
    const K = "rb-active/1";
    const a = await agent(R, "rba-a", { tenants: [t] });
    const b = await agent(R, "rba-b", { tenants: [t] });
    const [first] = await enqueue(R, t, [keyed("k", K)]);
    const held = await a.claim(1);
    expect(ids(held)).toEqual([first]);
    await a.complete(held);

    clock.advance(GRACE * 5);
    const [next] = await enqueue(R, t, [keyed("k", K)]);
    expect(await b.claim(10)).toEqual([]);
    expect(ids(await a.claim(10))).toEqual([next]);
    expect((await bindingOf(R.db, K))!.agent_id).toBe(a.name);
  });
});

describe("drains", () => {
  it("a draining agent keeps its key while an item of the key is in flight, even past the grace; the key moves once that item is done and the grace since its last dispatch has passed", async () => {
    const { clock } = R;
    const t = "dr";
    const K1 = "dr/long";
    const K2 = "dr/short";
    const a = await agent(R, "dr-a", { tenants: [t] });
    const b = await agent(R, "dr-b", { tenants: [t] });
    const [k1a, k2a, k1b, k1c, k2b] = await enqueue(R, t, [keyed("k", K1), keyed("k", K2), keyed("k", K1), keyed("k", K1), keyed("k", K2)]);
    const k1 = [k1a!, k1b!, k1c!];
    const k2 = [k2a!, k2b!];
    // A holds the first item of each key.
    const claimed = await a.claimResponse(2);
    expect(ids(claimed.items)).toEqual(sorted([k1a!, k2a!]));
    expect(sorted(claimed.affinityKeys)).toEqual(sorted([K1, K2]));
    const held = claimed.items.filter((i) => i.id === k1a);
    const held2 = claimed.items.filter((i) => i.id === k2a);
    const tHeld = clock.nowMs();

    const drained = await R.ops.client.drainAgent({ name: a.name, reason: "deploy" }, R.ops.call);
    expect(drained.agents[0]!.status).toBe(AgentStatus.DRAINING);
    expect(await a.claim(10)).toEqual([]);

    // A finishes K2's item well within the grace: K2 still waits for the grace since that dispatch.
    clock.set(tHeld + GRACE / 2);
    expect((await a.complete(held2)).every((o) => o.ok)).toBe(true);
    const [other] = await enqueue(R, t, [plain("k")]);
    expect(ids(await b.claim(10))).toEqual([other]);
    expect((await bindingOf(R.db, K2))!.agent_id).toBe(a.name);

    // Past the grace: K2 moves to B; K1 stays with A while A's item of it is in flight.
    clock.set(tHeld + GRACE + 1);
    await R.daemon.maintenance.runOnce();
    const got = await b.claimResponse(10);
    expect(ids(got.items)).toEqual([k2[1]]);
    expect(got.affinityKeys).toEqual([K2]);
    expect(await bindingOf(R.db, K2)).toMatchObject({ agent_id: b.name, updatedon: at(clock.nowMs()) });
    expect((await bindingOf(R.db, K1))!.agent_id).toBe(a.name);
    expect(await statuses(R, k1)).toEqual(["dispatched", "pending", "pending"]);
    expect(await keysOf(R, a.name)).toEqual([K1]);

    // Once A's item is done, the key moves.
    expect((await a.complete(held)).every((o) => o.ok)).toBe(true);
    const rest = await b.claimResponse(10);
    expect(ids(rest.items)).toEqual(sorted(k1.slice(1)));
    expect(rest.affinityKeys).toEqual([K1]);
    expect((await bindingOf(R.db, K1))!.agent_id).toBe(b.name);
    expect(await keysOf(R, a.name)).toEqual([]);
  });
});
