/**
 * Cancellation: of pending items and runs, of a dispatched item (its agent told on its stream and
 * in its heartbeat, its late completion refused), and of a parent with its unfinished children.
 *
 * On the daemon of test/support/queue-daemon.ts: one daemon, a fake clock, sweeps run by the tests.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import type { Daemon } from "../src/daemon.js";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { agentClient, ok, registerRequest, watchDirectives, type DirectiveWire, type HeartbeatReply } from "./support/agents.js";
import type { TestDb } from "./support/db.js";
import type { grpc } from "./support/grpc-js.js";
import { itemRow, nsText, type Producer } from "./support/queue.js";
import { ids, oks, useQueueDaemon } from "./support/queue-daemon.js";

const fx = useQueueDaemon("qcancel");
const { clock, agent, closers } = fx;
// The file's schema, daemon and producer, once the fixture's beforeAll has made them.
let db: TestDb, daemon: Daemon, p: Producer;
beforeAll(() => void ({ db, daemon, p } = fx));

describe("cancel", () => {
  it("a pending item is cancelled at once and never dispatched", async () => {
    const t = "cancel-pending";
    const a = await agent("cxp-1", { tenants: [t] });
    const [doomed, kept] = ids(await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }]));
    const res = await p.q.cancel({ tenantKey: t, ids: [doomed!], reason: "not needed" }, p.call);
    expect(res.cancelledIds).toEqual([doomed]);
    expect(await itemRow(db, doomed!)).toMatchObject({ status: "cancelled", error: "not needed", completed_at: nsText(clock.nowMs()) });
    expect((await p.item(t, doomed!)).status).toBe(WorkItemStatus.CANCELLED);
    expect(ids(await a.claim(5))).toEqual([kept]);
    // Cancelling again, or from another tenant, cancels nothing.
    expect((await p.q.cancel({ tenantKey: t, ids: [doomed!] }, p.call)).cancelledIds).toEqual([]);
    expect((await p.q.cancel({ tenantKey: "cancel-elsewhere", ids: [kept!] }, p.call)).cancelledIds).toEqual([]);
    expect((await itemRow(db, kept!)).status).toBe("dispatched");

    // A run's unfinished items, at once.
    const run = ids(
      await p.enqueue(
        t,
        [0, 1, 2].map(() => ({ engineKind: "dag", runId: "run-c" })),
      ),
    );
    const other = await p.one(t, { engineKind: "dag", runId: "run-keep" });
    expect(new Set((await p.q.cancel({ tenantKey: t, runId: "run-c" }, p.call)).cancelledIds)).toEqual(new Set(run));
    expect((await itemRow(db, other)).status).toBe("pending");
  });

  it("a dispatched item is cancelled and its agent told so (stream and heartbeat); its late completion is refused (stock grpc-js agent)", async () => {
    const t = "cancel-dispatched";
    const name = "cxd-grpc";
    const client: grpc.Client = agentClient(daemon.address);
    closers.add(client);
    await ok(client, "register", registerRequest(name, { metadata: { tenants: [t], engineKinds: ["dag"], tags: {}, slots: 1 } }));
    const stream = watchDirectives(client, name);
    closers.add(stream);
    expect((await stream.next()).status?.status).toBe("AGENT_STATUS_ACTIVE");

    const id = await p.one(t, { engineKind: "dag" });
    const claimed = await ok<{ items: { id: string; leaseToken: string; status: string }[] }>(client, "claim", { name, maxItems: 1 });
    expect(claimed.items.map((i) => [i.id, i.status])).toEqual([[id, "WORK_ITEM_STATUS_DISPATCHED"]]);
    const token = claimed.items[0]!.leaseToken;

    const res = await p.q.cancel({ tenantKey: t, ids: [id], reason: "user changed their mind" }, p.call);
    expect(res.cancelledIds).toEqual([id]);
    expect(await itemRow(db, id)).toMatchObject({ status: "cancelled", lease_token: null, error: "user changed their mind" });
    const pushed = await stream.next();
    expect(pushed).toMatchObject({ kind: "cancel", cancel: { workItemId: id, leaseToken: token, reason: "user changed their mind" } });
    const hb = await ok<HeartbeatReply>(client, "heartbeat", { name });
    expect(hb.directives.filter((d: DirectiveWire) => d.kind === "cancel").map((d) => d.cancel)).toEqual([
      { workItemId: id, leaseToken: token, reason: "user changed their mind" },
    ]);

    const late = await ok<{ outcomes: { workItemId: string; ok: boolean; code: number; message: string }[] }>(client, "complete", {
      name,
      items: [{ workItemId: id, leaseToken: token, resultJson: '{"too":"late"}' }],
    });
    expect(late.outcomes).toMatchObject([{ workItemId: id, ok: false, code: Code.FailedPrecondition }]);
    expect(late.outcomes[0]!.message).toContain("lease lost");
    expect(await itemRow(db, id)).toMatchObject({ status: "cancelled", result: null });
  });

  it("cancelling a parent cancels its unfinished children and leaves finished ones; the parent shows its children's counts", async () => {
    const t = "fanout";
    const a = await agent("fanout-1", { tenants: [t] });
    const parent = await p.one(t, { engineKind: "orchestrate", taskName: "parent" });
    const [c1, c2, c3, c4] = ids(
      await p.enqueue(
        t,
        [0, 1, 2, 2].map((priority, i) => ({ engineKind: "dag", priority, parentWorkItemId: parent, taskName: `child-${i + 1}` })),
      ),
    ) as [string, string, string, string];
    const [first] = await a.claim(1);
    expect(first!.id).toBe(c1);
    await a.complete([first!], { ok: 1 });
    const [second] = await a.claim(1);
    expect(second!.id).toBe(c2);

    const before = await p.get(t, parent);
    expect(before.children).toMatchObject({ pending: 2, dispatched: 1, completed: 1, failed: 0, cancelled: 0 });
    const listed = await p.q.listItems({ tenantKey: t, parentWorkItemId: parent }, p.call);
    expect(ids(listed.items)).toEqual([c1, c2, c3, c4]);
    const c1Before = await itemRow(db, c1);

    clock.advance(10);
    const res = await p.q.cancel({ tenantKey: t, parentIds: [parent] }, p.call);
    expect(new Set(res.cancelledIds)).toEqual(new Set([parent, c2, c3, c4]));
    expect(await itemRow(db, c1)).toEqual(c1Before);
    for (const id of [c2, c3, c4]) expect((await itemRow(db, id)).status).toBe("cancelled");
    const after = await p.get(t, parent);
    expect(after.item?.status).toBe(WorkItemStatus.CANCELLED);
    expect(after.children).toMatchObject({ pending: 0, dispatched: 0, completed: 1, failed: 0, cancelled: 3 });
    expect(oks(await a.complete([second!]))).toEqual([false]);
    // An item without children has no counts.
    expect((await p.get(t, c1)).children).toBeUndefined();
  });
});
