/**
 * Affinity bindings end to end, over real HTTP/2 and a real Postgres: the hold and rebind policies
 * with their grace, drains keeping keys while work of the key is in flight, the ops RPCs, cleanup of
 * idle bindings, tenant / engine-kind / selector limits on bound items, and a claim that waited on the
 * binding row past the grace.
 *
 * Two daemons, each on a schema of its own: R runs the rebind policy, H the hold policy. Each has a
 * fake clock that only moves when a test moves it; nothing runs on a timer (the tests call
 * maintenance.runOnce()), agents never miss a heartbeat and leases never run out while the clocks
 * move. Every test uses tenants, agents and keys of its own.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import { FakeClock } from "../src/clock.js";
import type { Config } from "../src/config.js";
import type { Daemon } from "../src/daemon.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { decodeTime } from "ulid";
import { bindingOf, bindingRows, keyed, lockBinding, plain, untilLockWaiters } from "./support/affinity.js";
import { startTestDaemon, TOKENS } from "./support/daemon.js";
import { createTestDb, type TestDb } from "./support/db.js";
import { Closers, codeOf, opsSession, OpsProducer, OpsTestAgent, refusal, Session, sorted, type AgentOptions, type ItemInit, type WorkItem } from "./support/ops.js";
import { itemRow, itemRows, STATEMENT } from "./support/queue.js";

const GRACE = 60_000;
const IDLE = 600_000;
/** Backoff of an item an agent gave back by leaving: exactly base × 2^retries (no jitter). */
const BACKOFF = 1_000;

const config = (instanceId: string, policy: "hold" | "rebind"): Partial<Config> => ({
  instanceId,
  sweepInterval: 3_600_000,
  heartbeatFlush: 3_600_000,
  heartbeatInterval: 86_400_000,
  leaseTtl: 86_400_000,
  affinityPolicy: policy,
  affinityGrace: GRACE,
  affinityIdle: IDLE,
  backoffJitter: "none",
  backoffBase: BACKOFF,
});

interface Env {
  db: TestDb;
  daemon: Daemon;
  clock: FakeClock;
  ops: Session<typeof OpsService>;
  producer: OpsProducer;
}

const closers = new Closers();
let R: Env;
let H: Env;

async function env(label: string, policy: "hold" | "rebind"): Promise<Env> {
  const db = await createTestDb({ label });
  const clock = new FakeClock(Date.UTC(2026, 4, 1));
  const daemon = await startTestDaemon({ schema: db.schema, clock, config: config(`aff-${policy}`, policy) });
  return { db, daemon, clock, ops: closers.add(opsSession(daemon.address)), producer: closers.add(new OpsProducer(daemon.address)) };
}

beforeAll(async () => {
  [R, H] = await Promise.all([env("affr", "rebind"), env("affh", "hold")]);
});
afterAll(async () => {
  await closers.closeAll();
  for (const e of [R, H]) {
    await e?.daemon.stop();
    await e?.db.drop();
  }
});

const agent = async (e: Env, name: string, opts: Partial<AgentOptions> & { tenants: string[] }) =>
  closers.add(await OpsTestAgent.register(e.daemon.address, name, { engineKinds: ["k"], ...opts }));
const deregister = (a: OpsTestAgent) => a.s.client.deregister({ name: a.name }, a.s.call);
const enqueue = (e: Env, tenant: string, items: ItemInit[]) => e.producer.enqueue(tenant, items);
const ids = (items: readonly WorkItem[]) => sorted(items.map((i) => i.id));
const keysOf = async (e: Env, name: string) => (await e.ops.client.getAgent({ name }, e.ops.call)).affinityKeys;
const statuses = async (e: Env, itemIds: readonly string[]) => Promise.all(itemIds.map(async (id) => (await itemRow(e.db, id)).status));
const at = (ms: number) => new Date(ms);

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
    expect(await itemRow(R.db, items[0]!)).toMatchObject({ status: "pending", agent_id: null, retry_count: 1 });

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
    const asEngine = closers.add(new Session(R.daemon.address, OpsService, TOKENS.engine));
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
    await enqueue(R, t, keys.map((k) => keyed("k", k)));
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
    const [otherTenant] = await enqueue(R, "lim2", [keyed("k1", K)]);
    const [otherKind, needsGpu] = await enqueue(R, "lim1", [keyed("k2", K), keyed("k1", K, { selector: { gpu: "yes" } })]);
    const stranded = [otherTenant!, otherKind!, needsGpu!];
    const [plainB] = await enqueue(R, "lim2", [plain("k2")]);
    expect(await a.claim(10)).toEqual([]);
    expect(ids(await b.claim(10))).toEqual([plainB]);

    clock.set(t0 + GRACE);
    await R.daemon.maintenance.runOnce();
    expect(await statuses(R, stranded)).toEqual(["pending", "pending", "pending"]);

    clock.set(t0 + GRACE + 1);
    expect(await a.claim(10)).toEqual([]);
    expect(await b.claim(10)).toEqual([]);
    await R.daemon.maintenance.runOnce();
    for (const id of stranded) {
      const r = await itemRow(R.db, id);
      expect(r).toMatchObject({ status: "failed", agent_id: null, dispatched_at: null });
      expect(r.error).toBe(`affinity key ${K} is bound to agent ${a.name}, which may not run it (tenant, engine kind or selector); rebind the key, then redrive`);
    }
    expect((await bindingOf(R.db, K))!.agent_id).toBe(a.name);
  });
});

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
      await untilLockWaiters(db, STATEMENT.claim, 1);
      await R.ops.client.drainAgent({ name: a.name }, R.ops.call);
      clock.advance(GRACE + 1_000);
      claimB = b.claim(1);
      await untilLockWaiters(db, STATEMENT.claim, 2);
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
