/**
 * What a claim does: the fields a claimed item carries, claims that carry completions (fenced by their
 * tokens, with or without waiting for work), and what a claim takes and in what order: not-before,
 * priority then arrival, tenant / engine-kind / selector matching, and the daemon's cap on max_items.
 *
 * On the daemon of test/support/queue-daemon.ts: one daemon, a fake clock, sweeps run by the tests.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import type { Daemon } from "../src/daemon.js";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { TOKENS } from "./support/daemon.js";
import type { TestDb } from "./support/db.js";
import { codeOf, until } from "./support/kit.js";
import { itemRow, notBefore, nsText, type Producer, serverNow, STATEMENT, statusCounts, track, untilStatementRan } from "./support/queue.js";
import { CLAIM_MAX_WAIT, ids, oks, useQueueDaemon } from "./support/queue-daemon.js";

const fx = useQueueDaemon("qclaim");
const { clock, agent } = fx;
// The file's schema, daemon and producer, once the fixture's beforeAll has made them.
let db: TestDb, daemon: Daemon, p: Producer;
beforeAll(() => void ({ db, daemon, p } = fx));

describe("a claimed item", () => {
  it("carries every field as the stored item reads back, with the dispatch's holder, lease and times", async () => {
    const t = "claimed-fields";
    const a = await agent("claimed-fields-a", { tenants: [t], tags: { gpu: "h100", zone: "eu" } });
    const [parent] = await p.enqueue(t, [{ engineKind: "dag" }]);
    const [c1] = await a.claim(1);
    await a.complete([c1!]);
    const id = await p.one(t, {
      engineKind: "dag",
      runId: "run-7",
      taskId: "task-7",
      parentWorkItemId: parent!.id,
      priority: 4,
      maxRetries: 2,
      idempotencyKey: "idem-7",
      payloadJson: '{"job":"render ✓ é 日本 🎬","frames":[1,2],"opts":{"hq":true}}',
      taskName: "render-日本",
      workerParams: { selector: { gpu: "h100" }, affinityKey: "scene-7" },
    });
    const [claimed] = await a.claim(1);
    const stored = await p.item(t, id);
    expect(stored.status).toBe(WorkItemStatus.DISPATCHED);
    // The payload is the same JSON (the claim sends the stored text as it is, GetItem re-serialises).
    expect(JSON.parse(claimed!.payloadJson)).toEqual(JSON.parse(stored.payloadJson));
    expect(JSON.parse(claimed!.payloadJson)).toEqual({ job: "render ✓ é 日本 🎬", frames: [1, 2], opts: { hq: true } });
    // The lease token is the holder's alone: the claim carries it, GetItem never does.
    expect(claimed!.leaseToken).not.toBe("");
    expect(stored.leaseToken).toBe("");
    expect({ ...claimed, payloadJson: "", leaseToken: "" }).toEqual({ ...stored, payloadJson: "" });
    expect(claimed).toMatchObject({
      agentId: a.name,
      leasedBy: "queue-sem",
      runId: "run-7",
      taskName: "render-日本",
      parentWorkItemId: parent!.id,
      priority: 4,
      maxRetries: 2,
    });
  });
});

describe("claims that carry completions", () => {
  it("complete them fenced by their tokens, then claim, in one call", async () => {
    const t = "claim-completes";
    const a = await agent("claim-completes-a", { tenants: [t] });
    await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }]);
    const [x, y] = await a.claim(2);
    const next = await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }]);
    const res = await a.claimCompleting(5, [x!, { id: y!.id, leaseToken: "not-the-token" }], { result: { frames: 3 } });
    expect(res.completionOutcomes.map((o) => [o.workItemId, o.ok, o.code])).toEqual([
      [x!.id, true, 0],
      [y!.id, false, Code.FailedPrecondition],
    ]);
    expect(ids(res.items).sort()).toEqual(next.map((n) => n.id).sort());
    expect(await itemRow(db, x!.id)).toMatchObject({ status: "completed", result: { frames: 3 }, lease_token: x!.leaseToken });
    // The refused one is untouched: still held under its real token.
    expect(await itemRow(db, y!.id)).toMatchObject({ status: "dispatched", lease_token: y!.leaseToken });
    expect(oks(await a.complete([y!]))).toEqual([true]);
  });

  it("answer at once even when nothing is left to claim and a wait was asked for", async () => {
    const t = "claim-completes-nowait";
    const a = await agent("claim-completes-nowait-a", { tenants: [t] });
    await p.enqueue(t, [{ engineKind: "dag" }]);
    const [x] = await a.claim(1);
    // Without the completion this claim would hold the call for the whole minute.
    const res = await a.claimCompleting(5, [x!], { waitMs: 60_000 });
    expect(res.items).toEqual([]);
    expect(oks(res.completionOutcomes)).toEqual([true]);
    expect((await itemRow(db, x!.id)).status).toBe("completed");
  });

  it("with wait_with_completions, apply them at once, wait for work, and bring their outcomes back with it", async () => {
    const t = "claim-completes-wait";
    const a = await agent("claim-completes-wait-a", { tenants: [t] });
    await p.enqueue(t, [{ engineKind: "dag" }]);
    const [x] = await a.claim(1);
    const pending = a.claimCompleting(5, [x!], { waitMs: 60_000, waitWithCompletions: true });
    // Completed before any work came: the wait does not hold the completion back.
    await until("the carried completion is applied", async () => (await itemRow(db, x!.id)).status === "completed");
    const [next] = await p.enqueue(t, [{ engineKind: "dag" }]);
    const res = await pending;
    expect(ids(res.items)).toEqual([next!.id]);
    expect(oks(res.completionOutcomes)).toEqual([true]);
  });

  it("answer ok for a completion carried again after it was applied (a claim cut short after its commit)", async () => {
    const t = "claim-completes-again";
    const a = await agent("claim-completes-again-a", { tenants: [t] });
    await p.enqueue(t, [{ engineKind: "dag" }]);
    const [x] = await a.claim(1);
    expect(oks((await a.claimCompleting(5, [x!], { result: { n: 1 } })).completionOutcomes)).toEqual([true]);
    const row = await itemRow(db, x!.id);
    const again = await a.claimCompleting(5, [x!], { result: { n: 2 } });
    expect(oks(again.completionOutcomes)).toEqual([true]);
    expect(await itemRow(db, x!.id)).toEqual(row);
    // Another agent with the same token is not the one that completed it.
    const other = await agent("claim-completes-again-b", { tenants: [t] });
    expect(oks((await other.claimCompleting(5, [x!])).completionOutcomes)).toEqual([false]);
  });

  it("refuse a completion with bad JSON as INVALID_ARGUMENT, changing nothing and claiming nothing", async () => {
    const t = "claim-completes-bad";
    const a = await agent("claim-completes-bad-a", { tenants: [t] });
    await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }]);
    const [x] = await a.claim(1);
    const bad = a.conn.agent.claim(
      { name: a.name, maxItems: 5, completions: [{ workItemId: x!.id, leaseToken: x!.leaseToken, resultJson: "{nope" }] },
      { headers: { authorization: `Bearer ${TOKENS.agent}` } },
    );
    expect(await codeOf(bad)).toBe(Code.InvalidArgument);
    expect((await itemRow(db, x!.id)).status).toBe("dispatched");
    expect(await statusCounts(db, t)).toEqual({ dispatched: 1, pending: 1 });
  });
});

describe("what a claim takes, and in what order", () => {
  it("an item is not claimable before its not-before time; a waiting claim wakes when the clock passes it", async () => {
    const t = "notbefore";
    const a = await agent("notbefore-1", { tenants: [t] });
    const id = await p.one(t, { engineKind: "dag", notBefore: notBefore(clock.nowMs() + 5_000) });
    expect((await itemRow(db, id)).next_attempt_at).toBe(nsText(clock.nowMs() + 5_000));
    expect(await a.claim(1)).toEqual([]);
    clock.advance(4_999);
    expect(await a.claim(1)).toEqual([]);

    const t0 = await serverNow(db);
    // The claim may wait longer than the test may run, and nothing but the due-wake run below (once
    // the clock has passed the not-before) rings it: its answer with the item is that wake-up.
    const claim = track(a.claim(1, CLAIM_MAX_WAIT));
    await untilStatementRan(db, STATEMENT.claim, t0);
    expect(claim.settled()).toBe(false);
    clock.advance(1);
    await daemon.maintenance.runOnce();
    expect(ids(await claim.promise)).toEqual([id]);
  });

  it("takes lower priority first, and first-in-first-out within a priority", async () => {
    const t = "order";
    const a = await agent("order-1", { tenants: [t] });
    // One Enqueue call per item with the clock standing still: only the order of arrival orders them.
    const specs: [string, number][] = [
      ["a", 3],
      ["b", 1],
      ["c", 3],
      ["d", 0],
      ["e", 1],
      ["f", 3],
      ["g", 1],
    ];
    for (const [name, priority] of specs) await p.one(t, { engineKind: "dag", priority, taskName: name });
    const taken: string[] = [];
    for (;;) {
      const [item] = await a.claim(1);
      if (!item) break;
      taken.push(item.taskName);
      await a.complete([item]);
    }
    expect(taken).toEqual(["d", "b", "e", "g", "a", "c", "f"]);

    // Within one batch too, and a batch claim takes the first ones in that order.
    const batch = "abcdefghij".split("");
    await p.enqueue(
      t,
      batch.map((name) => ({ engineKind: "dag", priority: 2, taskName: name })),
    );
    // (Which items a batch claim takes is the dispatch order; the order inside a reply is not specified.)
    const first = await a.claim(5);
    expect(new Set(first.map((i) => i.taskName))).toEqual(new Set(batch.slice(0, 5)));
    expect(new Set((await a.claim(5)).map((i) => i.taskName))).toEqual(new Set(batch.slice(5)));
  });

  it("an agent only gets work of the tenants it serves and the engine kinds it runs", async () => {
    const [t1, t2] = ["iso-1", "iso-2"];
    const only1 = await agent("iso-t1", { tenants: [t1] });
    const only2 = await agent("iso-t2", { tenants: [t2] });
    const graph1 = await agent("iso-graph", { tenants: [t1], engineKinds: ["graph"] });
    const both = await agent("iso-both", { tenants: [t1, t2], engineKinds: ["dag", "graph"] });
    // The other tenant's work is older and more urgent: it must still not be taken.
    const t2Items = ids(
      await p.enqueue(t2, [
        { engineKind: "dag", priority: 0 },
        { engineKind: "dag", priority: 0 },
      ]),
    );
    const [t1Dag, t1Graph, t1Other] = ids(
      await p.enqueue(t1, [
        { engineKind: "dag", priority: 5 },
        { engineKind: "graph", priority: 5 },
        { engineKind: "statemachine", priority: 0 },
      ]),
    );
    expect(ids(await only1.claim(5))).toEqual([t1Dag]);
    expect(ids(await graph1.claim(5))).toEqual([t1Graph]);
    expect(new Set(ids(await only2.claim(5)))).toEqual(new Set(t2Items));
    expect(await both.claim(5)).toEqual([]);
    expect((await itemRow(db, t1Other!)).status).toBe("pending");
  });

  it("an item's selector must be contained in the agent's tags", async () => {
    const t = "selector";
    const h100eu = await agent("sel-h100-eu", { tenants: [t], tags: { gpu: "h100", zone: "eu", rack: "7" } });
    const a100eu = await agent("sel-a100-eu", { tenants: [t], tags: { gpu: "a100", zone: "eu" } });
    const untagged = await agent("sel-plain", { tenants: [t] });
    const [h100, h100us, eu, anyone] = ids(
      await p.enqueue(t, [
        { engineKind: "dag", priority: 0, workerParams: { selector: { gpu: "h100" } } },
        { engineKind: "dag", priority: 0, workerParams: { selector: { gpu: "h100", zone: "us" } } },
        { engineKind: "dag", priority: 0, workerParams: { selector: { zone: "eu" } } },
        { engineKind: "dag", priority: 1 },
      ]),
    );
    expect(ids(await untagged.claim(5))).toEqual([anyone]);
    expect(ids(await a100eu.claim(5))).toEqual([eu]);
    expect(ids(await h100eu.claim(5))).toEqual([h100]);
    expect(await itemRow(db, h100us!)).toMatchObject({ status: "pending" });
    expect((await p.item(t, h100us!)).workerParams?.selector).toEqual({ gpu: "h100", zone: "us" });
  });

  it("max_items over the daemon's cap is clamped to it", async () => {
    const t = "clamp";
    const a = await agent("clamp-1", { tenants: [t] });
    await p.enqueue(
      t,
      Array.from({ length: 8 }, () => ({ engineKind: "dag" })),
    );
    expect(await a.claim(1_000)).toHaveLength(5);
    expect(await a.claim(1_000)).toHaveLength(3);
    expect(await statusCounts(db, t)).toEqual({ dispatched: 8 });
  });
});
