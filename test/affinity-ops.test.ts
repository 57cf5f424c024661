/**
 * The affinity RPCs for operators: ListBindings by key prefix and agent with pages, GetAgent's keys,
 * Unbind and Rebind with their refusals, ClaimResponse.affinity_keys, and the bindings' ULIDs.
 *
 * End to end over real HTTP/2 and a real Postgres, on the daemon of useAffinityDaemon
 * (support/affinity.ts): a fake clock that only a test moves, nothing on a timer. Every test uses
 * tenants, agents and keys of its own.
 */
import { describe, expect, it } from "vitest";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { decodeTime } from "ulid";
import { agent, at, bindingOf, bindingRows, deregister, enqueue, ids, keyed, keysOf, plain, useAffinityDaemon } from "./support/affinity.js";
import { TOKENS } from "./support/daemon.js";
import { codeOf, refusal, Session } from "./support/kit.js";
import { type OpsTestAgent, sorted } from "./support/ops.js";

const R = useAffinityDaemon("affops", "rebind");

describe("ops", () => {
  it("lists bindings by key prefix and by agent in createdon order, with pages; GetAgent lists an agent's keys", async () => {
    const { clock, ops } = R;
    const t = "opl";
    const a = await agent(R, "opl-a", { tenants: [t] });
    const b = await agent(R, "opl-b", { tenants: [t] });
    // Bound one at a time, in an order that is not the keys' order.
    const bind = async (who: OpsTestAgent, key: string) => {
      clock.advance(1_000);
      await enqueue(R, t, [keyed("k", key)]);
      const got = await who.claim(1);
      expect(got.map((i) => i.workerParams?.affinityKey)).toEqual([key]);
      await who.complete(got);
      return clock.nowMs();
    };
    const t2 = await bind(a, "opl-x/2");
    const t1 = await bind(b, "opl-x/1");
    const ty = await bind(a, "opl-y/1");
    const t3 = await bind(a, "opl-x/3");

    const list = async (req: { keyPrefix?: string; agentId?: string; pageSize?: number; pageToken?: string }) => {
      const res = await ops.client.listBindings(req, ops.call);
      return { keys: res.bindings.map((x) => `${x.affinityKey}@${x.agentId}`), res };
    };
    const byPrefix = await list({ keyPrefix: "opl-x/" });
    expect(byPrefix.keys).toEqual(["opl-x/2@opl-a", "opl-x/1@opl-b", "opl-x/3@opl-a"]);
    expect(byPrefix.res.bindings.map((x) => timestampMs(x.createdOn!))).toEqual([t2, t1, t3]);
    expect(byPrefix.res.bindings.map((x) => timestampMs(x.updatedOn!))).toEqual([t2, t1, t3]);
    expect(byPrefix.res.nextPageToken).toBe("");
    expect((await list({ keyPrefix: "opl-" })).keys).toEqual(["opl-x/2@opl-a", "opl-x/1@opl-b", "opl-y/1@opl-a", "opl-x/3@opl-a"]);
    const byAgent = await list({ agentId: a.name });
    expect(byAgent.keys).toEqual(["opl-x/2@opl-a", "opl-y/1@opl-a", "opl-x/3@opl-a"]);
    expect(byAgent.res.bindings.map((x) => timestampMs(x.createdOn!))).toEqual([t2, ty, t3]);
    expect((await list({ agentId: a.name, keyPrefix: "opl-x/" })).keys).toEqual(["opl-x/2@opl-a", "opl-x/3@opl-a"]);
    expect((await list({ keyPrefix: "opl-z" })).keys).toEqual([]);

    const p1 = await list({ keyPrefix: "opl-", pageSize: 3 });
    expect(p1.keys).toEqual(["opl-x/2@opl-a", "opl-x/1@opl-b", "opl-y/1@opl-a"]);
    expect(p1.res.nextPageToken).not.toBe("");
    const p2 = await list({ keyPrefix: "opl-", pageSize: 3, pageToken: p1.res.nextPageToken });
    expect(p2.keys).toEqual(["opl-x/3@opl-a"]);
    expect(p2.res.nextPageToken).toBe("");

    expect(await keysOf(R, a.name)).toEqual(["opl-x/2", "opl-y/1", "opl-x/3"]);
    expect(await keysOf(R, b.name)).toEqual(["opl-x/1"]);
    // Only operators see and change bindings.
    const asEngine = R.closers.add(new Session(R.daemon.address, OpsService, TOKENS.engine));
    expect(await codeOf(asEngine.client.listBindings({}, asEngine.call))).toBe(Code.PermissionDenied);
    expect(await codeOf(asEngine.client.unbind({ affinityKey: "opl-x/2" }, asEngine.call))).toBe(Code.PermissionDenied);
  });

  it("Unbind is refused while an item of the key is dispatched and allowed after; the next claim binds the key anew", async () => {
    const { ops } = R;
    const t = "opu";
    const K = "opu/1";
    const a = await agent(R, "opu-a", { tenants: [t] });
    const c = await agent(R, "opu-c", { tenants: [t] });
    const [first, second] = await enqueue(R, t, [keyed("k", K), keyed("k", K)]);
    const held = await a.claim(1);
    expect(ids(held)).toEqual([first]);
    const before = (await bindingOf(R.db, K))!;

    const refused = await refusal(ops.client.unbind({ affinityKey: K }, ops.call));
    expect(refused.code).toBe(Code.FailedPrecondition);
    expect(refused.rawMessage).toContain(`'${a.name}'`);
    expect(await bindingOf(R.db, K)).toEqual(before);
    expect(await c.claim(10)).toEqual([]);

    await a.complete(held);
    await ops.client.unbind({ affinityKey: K }, ops.call);
    expect(await bindingOf(R.db, K)).toBeUndefined();
    expect((await ops.client.listBindings({ keyPrefix: K }, ops.call)).bindings).toEqual([]);
    expect(await keysOf(R, a.name)).toEqual([]);
    expect(await codeOf(ops.client.unbind({ affinityKey: K }, ops.call))).toBe(Code.NotFound);
    expect(await codeOf(ops.client.unbind({ affinityKey: "" }, ops.call))).toBe(Code.InvalidArgument);

    // The next claim binds it anew, to whoever claims.
    const got = await c.claimResponse(10);
    expect(ids(got.items)).toEqual([second]);
    expect(got.affinityKeys).toEqual([K]);
    const after = (await bindingOf(R.db, K))!;
    expect(after.agent_id).toBe(c.name);
    expect(after.id).not.toBe(before.id);
  });

  it("Rebind moves a key to a named active agent; refused while items of the key are dispatched elsewhere, and for an inactive or unknown agent", async () => {
    const { ops, clock } = R;
    const t = "opr";
    const K = "opr/1";
    const a = await agent(R, "opr-a", { tenants: [t] });
    const b = await agent(R, "opr-b", { tenants: [t] });
    const gone = await agent(R, "opr-gone", { tenants: [t] });
    await deregister(gone);
    const [first, second] = await enqueue(R, t, [keyed("k", K), keyed("k", K)]);
    const held = await a.claim(1);
    expect(ids(held)).toEqual([first]);
    const before = (await bindingOf(R.db, K))!;

    const busy = await refusal(ops.client.rebind({ affinityKey: K, agentId: b.name }, ops.call));
    expect(busy.code).toBe(Code.FailedPrecondition);
    expect(busy.rawMessage).toContain(`'${a.name}'`);
    expect(await bindingOf(R.db, K)).toEqual(before);
    await a.complete(held);

    for (const who of [gone.name, "opr-nobody"]) {
      const r = await refusal(ops.client.rebind({ affinityKey: K, agentId: who }, ops.call));
      expect(r.code).toBe(Code.FailedPrecondition);
      expect(r.rawMessage).toContain(`'${who}' is not an active agent`);
    }
    expect(await bindingOf(R.db, K)).toEqual(before);
    expect(await codeOf(ops.client.rebind({ affinityKey: "opr/none", agentId: b.name }, ops.call))).toBe(Code.NotFound);

    clock.advance(5);
    const res = await ops.client.rebind({ affinityKey: K, agentId: b.name }, ops.call);
    expect(res.binding).toMatchObject({ id: before.id, affinityKey: K, agentId: b.name });
    expect(timestampMs(res.binding!.updatedOn!)).toBe(clock.nowMs());
    expect(await bindingOf(R.db, K)).toMatchObject({ agent_id: b.name, updatedon: at(clock.nowMs()) });
    expect(await keysOf(R, b.name)).toEqual([K]);
    expect(await keysOf(R, a.name)).toEqual([]);

    // Its items now go to B only.
    expect(await a.claim(10)).toEqual([]);
    const got = await b.claim(10);
    expect(ids(got)).toEqual([second]);
    // A rebind to the agent that holds the key's in-flight items is allowed (nothing moves elsewhere).
    expect((await ops.client.rebind({ affinityKey: K, agentId: b.name }, ops.call)).binding?.agentId).toBe(b.name);
  });

  it("ClaimResponse.affinity_keys lists the distinct keys of the returned items, and nothing for items without a key", async () => {
    const t = "opk";
    const a = await agent(R, "opk-a", { tenants: [t] });
    await enqueue(R, t, [keyed("k", "opk/1"), plain("k"), keyed("k", "opk/2"), keyed("k", "opk/1")]);
    const res = await a.claimResponse(10);
    expect(res.items).toHaveLength(4);
    expect(sorted(res.affinityKeys)).toEqual(["opk/1", "opk/2"]);
    expect(res.items.map((i) => i.workerParams?.affinityKey ?? "")).toEqual(["opk/1", "", "opk/2", "opk/1"]);
    await enqueue(R, t, [plain("k")]);
    const none = await a.claimResponse(10);
    expect(none.items).toHaveLength(1);
    expect(none.affinityKeys).toEqual([]);
    expect(sorted(await keysOf(R, a.name))).toEqual(["opk/1", "opk/2"]);
  });

  it("the bindings one claim creates, and those of claims in the same millisecond, get distinct ULIDs of the claim's time", async () => {
    const t = "bid";
    const a = await agent(R, "bid-a", { tenants: [t] });
    const b = await agent(R, "bid-b", { tenants: [t] });
    // 40 keys in one claim: the binding's number within the claim crosses a base-32 digit.
    const keys = Array.from({ length: 40 }, (_, i) => `bid/${i}`);
    await enqueue(
      R,
      t,
      keys.map((k) => keyed("k", k)),
    );
    expect(await a.claim(40)).toHaveLength(40);
    // The fake clock stands still: b's claim draws its ULID in the same millisecond as a's.
    await enqueue(R, t, [keyed("k", "bid/x"), keyed("k", "bid/y")]);
    expect(await b.claim(10)).toHaveLength(2);
    const rows = await bindingRows(R.db, "affinity_key LIKE 'bid/%'");
    expect(rows).toHaveLength(42);
    expect(new Set(rows.map((r) => r.id)).size).toBe(42);
    for (const r of rows) {
      expect(r.id).toMatch(/^[0-7][0-9A-HJKMNP-TV-Z]{25}$/);
      expect(decodeTime(r.id)).toBe(R.clock.nowMs());
    }
  });
});
