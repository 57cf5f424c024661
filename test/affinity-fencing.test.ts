/**
 * A claim that waited on the binding row past the grace: a move of the key that raced with its
 * dispatch is refused, so the key's items never sit on two agents.
 *
 * End to end over real HTTP/2 and a real Postgres, on the daemon of useAffinityDaemon
 * (support/affinity.ts): a fake clock that only a test moves, nothing on a timer. Every test uses
 * tenants, agents and keys of its own.
 */
import { describe, expect, it } from "vitest";
import { agent, bindingOf, enqueue, GRACE, ids, keyed, lockBinding, useAffinityDaemon } from "./support/affinity.js";
import type { WorkItem } from "./support/ops.js";
import { itemRows, STATEMENT, untilLockWait } from "./support/queue.js";

const R = useAffinityDaemon("afffence", "rebind");

describe("a claim that waited on the binding row", () => {
  it("past the grace: a move of the key that raced with its dispatch is refused, so the key's items never sit on two agents", async () => {
    const { clock, db } = R;
    const t = "fence";
    const K = "fence/1";
    const a = await agent(R, "fence-a", { tenants: [t] });
    const b = await agent(R, "fence-b", { tenants: [t] });
    const items = await enqueue(R, t, [keyed("k", K), keyed("k", K), keyed("k", K)]);
    const first = await a.claim(1);
    expect(ids(first)).toEqual([items[0]]);
    await a.complete(first);

    // A's claim takes its snapshot (A active, key bound to A) and queues on the binding row, which
    // the test holds; the clock then moves past the grace while it waits, A is drained, and B's claim
    // takes its snapshot (A draining, no item of the key in flight, last dispatch beyond the grace)
    // and queues behind A's.
    const lock = await lockBinding(db, K);
    let claimA: Promise<WorkItem[]> | undefined;
    let claimB: Promise<WorkItem[]> | undefined;
    try {
      clock.advance(1);
      claimA = a.claim(1);
      await untilLockWait(db, STATEMENT.claim, 1);
      await R.ops.client.drainAgent({ name: a.name }, R.ops.call);
      clock.advance(GRACE + 1_000);
      claimB = b.claim(1);
      await untilLockWait(db, STATEMENT.claim, 2);
    } finally {
      await lock.release();
    }
    const [gotA, gotB] = await Promise.all([claimA!, claimB!]);

    const holders = new Set((await itemRows(db, "affinity_key = $1 AND status = 'dispatched'", [K])).map((r) => r.agent_id));
    expect([...holders]).toHaveLength(1);
    // A's dispatch went first (it queued first); B's move was fenced by it.
    expect(ids(gotA)).toEqual([items[1]]);
    expect(gotB).toEqual([]);
    expect((await bindingOf(db, K))!.agent_id).toBe(a.name);

    // Once A's item is done and the grace since that dispatch has passed, B takes the key.
    await a.complete(gotA);
    clock.advance(GRACE + 1);
    expect(ids(await b.claim(10))).toEqual([items[2]]);
    expect((await bindingOf(db, K))!.agent_id).toBe(b.name);
  });
});
