/**
 * What the affinity sweeps do: remove a binding once its key has been idle for the idle time, and
 * make a dead letter of an item of a bound key that the key's agent may not run, once the grace passed
 * (the key bound in the item's own tenant: another tenant's binding of it holds nothing).
 *
 * End to end over real HTTP/2 and a real Postgres, on the daemon of useAffinityDaemon
 * (support/affinity.ts): a fake clock that only a test moves, nothing on a timer. Every test uses
 * tenants, agents and keys of its own.
 */
import { describe, expect, it } from "vitest";
import { agent, bindingOf, bindingRows, enqueue, GRACE, IDLE, ids, keyed, plain, statuses, useAffinityDaemon } from "./support/affinity.js";
import { sorted } from "./support/ops.js";
import { itemRow } from "./support/queue.js";

const R = useAffinityDaemon("affsweep", "rebind");

describe("cleanup", () => {
  it("removes a binding once its key has had no unfinished item and no activity for the idle time; keeps one with a pending item", async () => {
    const { clock } = R;
    const t = "cl";
    const a = await agent(R, "cl-a", { tenants: [t] });
    const b = await agent(R, "cl-b", { tenants: [t] });
    const [done, pend1, slow, pend2] = await enqueue(R, t, [keyed("k", "cl/done"), keyed("k", "cl/pending"), keyed("k", "cl/slow"), keyed("k", "cl/pending")]);
    const t0 = clock.nowMs();
    const got = await a.claim(3);
    expect(ids(got)).toEqual(sorted([done!, pend1!, slow!]));
    await a.complete(got.filter((i) => i.id !== slow));
    // cl/slow's item runs long and finishes late: its binding was last touched at t0.
    clock.set(t0 + IDLE - 1_000);
    await a.complete(got.filter((i) => i.id === slow));
    // Bound by one claim, so in one createdon: compare as sets.
    const keys = async () => sorted((await bindingRows(R.db, "affinity_key LIKE 'cl/%'")).map((r) => r.affinity_key));

    clock.set(t0 + IDLE);
    await R.daemon.maintenance.runOnce();
    expect(await keys()).toEqual(["cl/done", "cl/pending", "cl/slow"]);

    clock.set(t0 + IDLE + 1);
    await R.daemon.maintenance.runOnce();
    expect(await keys()).toEqual(["cl/pending", "cl/slow"]);

    clock.set(t0 + 2 * IDLE);
    await R.daemon.maintenance.runOnce();
    expect(await keys()).toEqual(["cl/pending"]);
    expect(await itemRow(R.db, pend2!)).toMatchObject({ status: "pending" });

    // A removed key binds anew on its next claim.
    await enqueue(R, t, [keyed("k", "cl/done")]);
    const again = await b.claimResponse(1);
    expect(again.affinityKeys).toEqual(["cl/done"]);
    expect((await bindingOf(R.db, "cl/done"))!.agent_id).toBe(b.name);
    // The pending item of the kept binding still belongs to A.
    expect(await b.claim(10)).toEqual([]);
    expect(ids(await a.claim(10))).toEqual([pend2]);
  });
});

describe("tenant, engine-kind and selector limits", () => {
  it("an item of a bound key that the key's agent may not run is dispatched to nobody, and after the grace becomes a dead letter saying so", async () => {
    const { clock } = R;
    const K = "lim/1";
    const a = await agent(R, "lim-a", { tenants: ["lim1"], engineKinds: ["k1"] });
    // B could run every one of them, were the key not bound to A.
    const b = await agent(R, "lim-b", { tenants: ["lim1", "lim2"], engineKinds: ["k1", "k2"], tags: { gpu: "yes" } });
    const [own] = await enqueue(R, "lim1", [keyed("k1", K)]);
    const first = await a.claim(10);
    expect(ids(first)).toEqual([own]);
    await a.complete(first);

    const t0 = clock.nowMs();
    // Another tenant's item of the same key is not held by lim1's binding: the key is bound per
    // tenant, and B binds it for lim2.
    const [otherTenant] = await enqueue(R, "lim2", [keyed("k1", K)]);
    const [otherKind, needsGpu] = await enqueue(R, "lim1", [keyed("k2", K), keyed("k1", K, { selector: { gpu: "yes" } })]);
    const stranded = [otherKind!, needsGpu!];
    const [plainB] = await enqueue(R, "lim2", [plain("k2")]);
    expect(await a.claim(10)).toEqual([]);
    expect(ids(await b.claim(10))).toEqual(sorted([otherTenant!, plainB!]));

    clock.set(t0 + GRACE);
    await R.daemon.maintenance.runOnce();
    expect(await statuses(R, stranded)).toEqual(["pending", "pending"]);

    clock.set(t0 + GRACE + 1);
    expect(await a.claim(10)).toEqual([]);
    expect(await b.claim(10)).toEqual([]);
    await R.daemon.maintenance.runOnce();
    for (const id of stranded) {
      const r = await itemRow(R.db, id);
      expect(r).toMatchObject({ status: "failed", agent_id: null, dispatched_at: null });
      expect(r.error).toBe(
        `affinity key ${K} is bound to agent ${a.name}, which may not run it (tenant, engine kind or selector); rebind the key, then redrive`,
      );
    }
    expect((await bindingRows(R.db, "affinity_key = $1", [K])).map((r) => [r.tenant_key, r.agent_id])).toEqual([
      ["lim1", a.name],
      ["lim2", b.name],
    ]);
  });

  it("counts the grace from an item's creation when its row says it was due at 0 (an engine's item queued before issue 52)", async () => {
    const { clock } = R;
    const K = "lim/0";
    const a = await agent(R, "lim0-a", { tenants: ["lim0"], engineKinds: ["k1"] });
    const [own] = await enqueue(R, "lim0", [keyed("k1", K)]);
    await a.complete(await a.claim(10));
    expect(await statuses(R, [own!])).toEqual(["completed"]);

    const t0 = clock.nowMs();
    const [stranded] = await enqueue(R, "lim0", [keyed("k2", K)]);
    await R.db.raw(`UPDATE ${R.db.tables.qualified("work_item")} SET next_attempt_at = 0 WHERE id = $1`, [stranded]);
    clock.set(t0 + GRACE);
    await R.daemon.maintenance.runOnce();
    expect(await statuses(R, [stranded!])).toEqual(["pending"]);

    clock.set(t0 + GRACE + 1);
    await R.daemon.maintenance.runOnce();
    expect(await statuses(R, [stranded!])).toEqual(["failed"]);
  });
});
