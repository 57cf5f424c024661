/**
 * Tenant limits hold on every agent and ops call, lease tokens stay with their holder, and absurd
 * durations are refused as input errors: the hostile callers of issue 27, over real HTTP/2 with a
 * stock @grpc/grpc-js client. The matrix (authz-matrix.test.ts) checks the codes of every RPC; these
 * check that a refused call changed nothing and that a limited read shows only its tenants.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { parseTokenSpec } from "../src/domain/tokens.js";
import { WorkItemStore } from "../src/store/work-items.js";
import type { TestDb } from "./support/db.js";
import { useTestDaemon } from "./support/kit.js";
import { grpc, loadService, unary } from "./support/grpc-js.js";

const T = {
  agent: "t-agent-all",
  agentTA: "t-agent-ta",
  engine: "t-engine-all",
  ops: "t-ops-all-1",
  opsTA: "t-ops-ta-1",
  opsTATC: "t-ops-ta-tc",
} as const;

const fx = useTestDaemon({
  label: "authz_t",
  config: {
    tokens: [
      parseTokenSpec(`agent:${T.agent}`, "t"),
      parseTokenSpec(`agent:${T.agentTA}:tA`, "t"),
      parseTokenSpec(`engine:${T.engine}`, "t"),
      parseTokenSpec(`ops:${T.ops}`, "t"),
      parseTokenSpec(`ops:${T.opsTA}:tA`, "t"),
      parseTokenSpec(`ops:${T.opsTATC}:tA,tC`, "t"),
    ],
  },
});
let db: TestDb;
let daemon: Daemon;
let agents: grpc.Client;
let queue: grpc.Client;
let ops: grpc.Client;

type Item = { id: string; leaseToken: string; status: string; tenantKey: string };

async function must<Res = Record<string, unknown>>(client: grpc.Client, method: string, req: object, token: string): Promise<Res> {
  const [err, res] = await unary<Res>(client, method, req, token);
  if (err) throw new Error(`${method}: ${err.details}`);
  return res!;
}
const register = (name: string, tenants: string[], kinds = ["dag"]) => must(agents, "Register", { name, metadata: { tenants, engineKinds: kinds } }, T.agent);
const enqueue = async (tenant: string, kind = "dag", extra: object = {}) =>
  (await must<{ results: { id: string }[] }>(queue, "Enqueue", { tenantKey: tenant, items: [{ engineKind: kind, ...extra }] }, T.engine)).results[0]!.id;
const claim = async (name: string, token: string = T.agent) => (await must<{ items: Item[] }>(agents, "Claim", { name, maxItems: 10 }, token)).items;
const row = async (id: string) =>
  (
    await db.raw<{ status: string; agent_id: string | null; lease_token: string | null }>(
      `SELECT status, agent_id, lease_token FROM ${db.schema}.aiflow_work_item WHERE id = $1`,
      [id],
    )
  )[0]!;

beforeAll(() => {
  ({ db, daemon } = fx);
  const client = (proto: string, service: string) => new (loadService(proto, service))(daemon.address, grpc.credentials.createInsecure());
  agents = client("aiflow/cluster/v1/agent.proto", "aiflow.cluster.v1.AgentService");
  queue = client("aiflow/cluster/v1/queue.proto", "aiflow.cluster.v1.QueueService");
  ops = client("aiflow/cluster/v1/ops.proto", "aiflow.cluster.v1.OpsService");
});

afterAll(() => {
  for (const c of [agents, queue, ops]) c?.close();
});

describe("an agent token limited to tenant tA", () => {
  it("may not claim, complete, re-register, heartbeat or deregister as an agent of tB; nothing changes", async () => {
    await register("f1-b", ["tB"], ["f1"]);
    const held = await enqueue("tB", "f1");
    const [item] = await claim("f1-b");
    expect(item!.id).toBe(held);
    const waiting = await enqueue("tB", "f1");

    const [claimErr] = await unary(agents, "Claim", { name: "f1-b", maxItems: 10 }, T.agentTA);
    expect(claimErr?.code).toBe(grpc.status.PERMISSION_DENIED);
    expect(claimErr?.details).toContain("'tB'");
    expect(claimErr?.details).not.toContain(T.agentTA);
    const lease = [{ workItemId: held, leaseToken: item!.leaseToken }];
    for (const [method, req] of [
      ["Complete", { name: "f1-b", items: lease }],
      ["Fail", { name: "f1-b", items: lease }],
      ["Release", { name: "f1-b", leases: lease }],
      ["ExtendLease", { name: "f1-b", leases: lease }],
      ["Heartbeat", { name: "f1-b" }],
      ["Deregister", { name: "f1-b" }],
      // A take-over: the same name, registered for the token's own tenant.
      ["Register", { name: "f1-b", metadata: { tenants: ["tA"], engineKinds: ["f1"] } }],
    ] as const) {
      const [err] = await unary(agents, method, req, T.agentTA);
      expect(err?.code, method).toBe(grpc.status.PERMISSION_DENIED);
      expect(err?.details, method).toContain("'tB'");
    }
    expect(await row(held)).toMatchObject({ status: "dispatched", agent_id: "f1-b", lease_token: item!.leaseToken });
    expect(await row(waiting)).toMatchObject({ status: "pending", agent_id: null });
    const [agent] = await db.raw<{ status: string; tenants: string[] }>(
      `SELECT status, metadata -> 'tenants' AS tenants FROM ${db.schema}.aiflow_agent WHERE name = 'f1-b'`,
    );
    expect(agent).toEqual({ status: "active", tenants: ["tB"] });
  });

  it("works as an agent of its own tenant", async () => {
    await must(agents, "Register", { name: "f1-a", metadata: { tenants: ["tA"], engineKinds: ["f1a"] } }, T.agentTA);
    const id = await enqueue("tA", "f1a");
    const [item] = await claim("f1-a", T.agentTA);
    expect(item!.id).toBe(id);
    const done = await must<{ outcomes: { ok: boolean }[] }>(
      agents,
      "Complete",
      { name: "f1-a", items: [{ workItemId: id, leaseToken: item!.leaseToken }] },
      T.agentTA,
    );
    expect(done.outcomes.map((o) => o.ok)).toEqual([true]);
  });

  it("completes nothing of another tenant even if the agent check were passed (the store's own filter)", async () => {
    await register("f1-store", ["tB"], ["f1s"]);
    const id = await enqueue("tB", "f1s");
    const [item] = await claim("f1-store");
    const store = new WorkItemStore(db.pool, db.tables, { baseMs: 1000, capMs: 1000, jitter: false });
    const lease = [{ id, token: item!.leaseToken }];
    expect(await store.extend("f1-store", lease, Date.now(), 30_000, ["tA"])).toEqual([]);
    expect(
      await store.fail(
        "f1-store",
        lease.map((l) => ({ ...l, error: "x", retryable: true, delayMs: null })),
        Date.now(),
        ["tA"],
      ),
    ).toEqual([]);
    expect(await store.release("f1-store", lease, Date.now(), ["tA"])).toEqual([]);
    expect(await store.complete("f1-store", [{ ...lease[0]!, resultJson: null }], Date.now(), ["tA"])).toEqual([]);
    expect(await row(id)).toMatchObject({ status: "dispatched", agent_id: "f1-store" });
    expect(await store.complete("f1-store", [{ ...lease[0]!, resultJson: null }], Date.now(), ["tB"])).toMatchObject([{ id, engine_kind: "f1s" }]);
  });
});

describe("an agent's scope cached on one daemon", () => {
  it("never lets a claim answer a limited token with an item outside its tenants, even while the cache is stale", async () => {
    await must(agents, "Register", { name: "f1-stale", metadata: { tenants: ["tA"], engineKinds: ["f1st"] } }, T.agentTA);
    expect(await claim("f1-stale", T.agentTA)).toEqual([]);
    // Behind the daemon's back (no registration, no directive): its cached scope still says tA.
    await db.raw(`UPDATE ${db.schema}.aiflow_agent SET metadata = jsonb_set(metadata, '{tenants}', '["tB"]') WHERE name = 'f1-stale'`);
    const id = await enqueue("tB", "f1st");
    expect(await claim("f1-stale", T.agentTA)).toEqual([]);
    expect(await row(id)).toMatchObject({ status: "pending", agent_id: null, lease_token: null });
  });

  it("is dropped when the agent registers for other tenants through another daemon", async () => {
    const other = await fx.startDaemon({ config: { tokens: [parseTokenSpec(`agent:${T.agent}`, "t")] } });
    const otherAgents = new (loadService("aiflow/cluster/v1/agent.proto", "aiflow.cluster.v1.AgentService"))(other.address, grpc.credentials.createInsecure());
    try {
      await must(agents, "Register", { name: "f1-moved", metadata: { tenants: ["tA"], engineKinds: ["f1m"] } }, T.agentTA);
      // This daemon now holds the agent's scope (tA) in its cache.
      expect(await claim("f1-moved", T.agentTA)).toEqual([]);
      await must(otherAgents, "Register", { name: "f1-moved", metadata: { tenants: ["tB"], engineKinds: ["f1m"] } }, T.agent);
      const id = await enqueue("tB", "f1m");
      // The registration's status directive reaches this daemon over NOTIFY; until it has, a claim
      // may still pass the check, but its reply never carries a tB item to the tA token.
      for (;;) {
        const [err, res] = await unary<{ items: Item[] }>(agents, "Claim", { name: "f1-moved", maxItems: 10 }, T.agentTA);
        expect(res?.items ?? []).toEqual([]);
        if (err) {
          expect(err.code).toBe(grpc.status.PERMISSION_DENIED);
          expect(err.details).toContain("'tB'");
          break;
        }
      }
      expect(await row(id)).toMatchObject({ status: "pending", agent_id: null });
    } finally {
      otherAgents.close();
      await other.stop();
    }
  });
});

describe("an ops token limited to tenant tA", () => {
  it("sees only tA's agents, items and queue stats", async () => {
    await register("f2-a", ["tA"], ["f2"]);
    await register("f2-b", ["tB"], ["f2"]);
    await register("f2-ab", ["tA", "tB"], ["f2"]);
    const a = await enqueue("tA", "f2");
    const b = await enqueue("tB", "f2");

    const listed = await must<{ agents: { name: string }[] }>(ops, "ListAgents", {}, T.opsTA);
    const names = listed.agents.map((x) => x.name).filter((n) => n.startsWith("f2-"));
    expect(names).toEqual(["f2-a"]);

    const items = await must<{ items: Item[] }>(ops, "ListItems", { engineKind: "f2" }, T.opsTA);
    expect(items.items.map((i) => i.id)).toEqual([a]);
    const all = await must<{ items: Item[] }>(ops, "ListItems", { engineKind: "f2" }, T.ops);
    expect(all.items.map((i) => i.id).sort()).toEqual([a, b].sort());

    const stats = await must<{ depth: { tenantKey: string }[] }>(ops, "QueueStats", {}, T.opsTA);
    expect(new Set(stats.depth.map((d) => d.tenantKey))).toEqual(new Set(["tA"]));

    const [getErr] = await unary(ops, "GetItem", { id: b }, T.opsTA);
    expect(getErr?.code).toBe(grpc.status.NOT_FOUND);
    expect((await must<{ item: Item }>(ops, "GetItem", { id: a }, T.opsTA)).item.id).toBe(a);

    for (const name of ["f2-b", "f2-ab"]) {
      const [err] = await unary(ops, "GetAgent", { name }, T.opsTA);
      expect(err?.code, name).toBe(grpc.status.PERMISSION_DENIED);
      expect(err?.details, name).toContain("'tB'");
    }
  });

  it("may not cancel, redrive or drain another tenant's rows; a selector drain and a tenant-less redrive stay within tA", async () => {
    await register("f2d-a", ["tA"], ["f2d"]);
    await register("f2d-b", ["tB"], ["f2d"]);
    const b = await enqueue("tB", "f2d-none");
    const [cancelErr] = await unary(ops, "CancelItems", { tenantKey: "tB", ids: [b] }, T.opsTA);
    expect(cancelErr?.code).toBe(grpc.status.PERMISSION_DENIED);
    expect((await row(b)).status).toBe("pending");

    for (const method of ["DrainAgent", "UndrainAgent", "RemoveAgent"]) {
      const [err] = await unary(ops, method, { name: "f2d-b", force: true }, T.opsTA);
      expect(err?.code, method).toBe(grpc.status.PERMISSION_DENIED);
    }
    const drained = await must<{ agents: { name: string }[] }>(ops, "DrainAgent", { selector: { versionBelow: "999" } }, T.opsTA);
    expect(drained.agents.map((x) => x.name).filter((n) => n.startsWith("f2d-"))).toEqual([]);
    // Agents registered without a version are not "below" one; drain by tag instead.
    await must(agents, "Register", { name: "f2d-a", agentVersion: "1.0.0", metadata: { tenants: ["tA"], engineKinds: ["f2d"] } }, T.agent);
    await must(agents, "Register", { name: "f2d-b", agentVersion: "1.0.0", metadata: { tenants: ["tB"], engineKinds: ["f2d"] } }, T.agent);
    const byVersion = await must<{ agents: { name: string }[] }>(ops, "DrainAgent", { selector: { versionBelow: "2.0.0" } }, T.opsTA);
    expect(byVersion.agents.map((x) => x.name).filter((n) => n.startsWith("f2d-"))).toEqual(["f2d-a"]);
    const [agentRows] = [
      await db.raw<{ name: string; status: string }>(`SELECT name, status FROM ${db.schema}.aiflow_agent WHERE name LIKE 'f2d-%' ORDER BY name`),
    ];
    expect(agentRows).toEqual([
      { name: "f2d-a", status: "draining" },
      { name: "f2d-b", status: "active" },
    ]);

    // Dead letters in both tenants; a redrive without a tenant by the tA token takes only tA's.
    const deadA = await enqueue("tA", "f2r");
    const deadB = await enqueue("tB", "f2r");
    await db.raw(`UPDATE ${db.schema}.aiflow_work_item SET status = 'failed', error = 'x' WHERE id = ANY($1)`, [[deadA, deadB]]);
    const [redriveErr] = await unary(ops, "RedriveItems", { tenantKey: "tB", ids: [deadB] }, T.opsTA);
    expect(redriveErr?.code).toBe(grpc.status.PERMISSION_DENIED);
    const redriven = await must<{ redrivenIds: string[] }>(ops, "RedriveItems", { ids: [deadA, deadB] }, T.opsTA);
    expect(redriven.redrivenIds).toEqual([deadA]);
    expect((await row(deadB)).status).toBe("failed");
  });

  it("reaches the affinity bindings of its tenants only (a binding belongs to a tenant)", async () => {
    // The key f2-key bound in tA and in tB, each to an agent of its own tenant.
    await register("f2k-a", ["tA"], ["f2k"]);
    await register("f2k-b", ["tB"], ["f2k"]);
    for (const [tenant, agent] of [
      ["tA", "f2k-a"],
      ["tB", "f2k-b"],
    ] as const) {
      await enqueue(tenant, "f2k", { workerParams: { affinityKey: "f2-key" } });
      const [item] = await claim(agent);
      await must(agents, "Complete", { name: agent, items: [{ workItemId: item!.id, leaseToken: item!.leaseToken }] }, T.agent);
    }
    const listed = async (req: object, token: string) =>
      (await must<{ bindings: { tenantKey: string }[] }>(ops, "ListBindings", { keyPrefix: "f2-", ...req }, token)).bindings.map((b) => b.tenantKey);
    expect(await listed({}, T.ops)).toEqual(["tA", "tB"]);
    expect(await listed({}, T.opsTA)).toEqual(["tA"]);
    for (const [method, req] of [
      ["ListBindings", { tenantKey: "tB" }],
      ["Unbind", { tenantKey: "tB", affinityKey: "f2-key" }],
      ["Rebind", { tenantKey: "tB", affinityKey: "f2-key", agentId: "f2k-b" }],
    ] as const) {
      const [err] = await unary(ops, method, req, T.opsTA);
      expect(err?.code, method).toBe(grpc.status.PERMISSION_DENIED);
    }
    // Without a tenant, the tA token's Unbind means its own binding of the key, and leaves tB's.
    await must(ops, "Unbind", { affinityKey: "f2-key" }, T.opsTA);
    expect(await listed({}, T.ops)).toEqual(["tB"]);
    const [gone] = await unary(ops, "Unbind", { affinityKey: "f2-key" }, T.opsTA);
    expect(gone?.code).toBe(grpc.status.NOT_FOUND);
  });
});

describe("an ops token limited to several tenants", () => {
  it("lists the items of all its tenants and no others when it names none, and refuses one outside them", async () => {
    const mine = [await enqueue("tA"), await enqueue("tC")];
    const other = await enqueue("tB");
    const listed = await must<{ items: Item[] }>(ops, "ListItems", { pageSize: 1000 }, T.opsTATC);
    const ids = listed.items.map((i) => i.id);
    for (const id of mine) expect(ids).toContain(id);
    expect(ids).not.toContain(other);
    expect(new Set(listed.items.map((i) => i.tenantKey))).toEqual(new Set(["tA", "tC"]));
    const [err] = await unary(ops, "ListItems", { tenantKey: "tB" }, T.opsTATC);
    expect(err?.code).toBe(grpc.status.PERMISSION_DENIED);
  });
});

describe("a lease token", () => {
  it("is in the Claim reply only: GetItem, ListItems, Wait and GetAgent show it empty", async () => {
    await register("f4-holder", ["tL"], ["f4"]);
    const id = await enqueue("tL", "f4");
    const [item] = await claim("f4-holder");
    expect(item!.leaseToken).not.toBe("");
    const reads: [string, Item[]][] = [
      ["engine GetItem", [(await must<{ item: Item }>(queue, "GetItem", { tenantKey: "tL", id }, T.engine)).item]],
      ["engine ListItems", (await must<{ items: Item[] }>(queue, "ListItems", { tenantKey: "tL" }, T.engine)).items],
      ["engine Wait", (await must<{ items: Item[] }>(queue, "Wait", { tenantKey: "tL", ids: [id] }, T.engine)).items],
      ["ops GetItem", [(await must<{ item: Item }>(ops, "GetItem", { id }, T.ops)).item]],
      ["ops ListItems", (await must<{ items: Item[] }>(ops, "ListItems", { tenantKey: "tL" }, T.ops)).items],
      ["ops GetAgent", (await must<{ dispatched: Item[] }>(ops, "GetAgent", { name: "f4-holder" }, T.ops)).dispatched],
    ];
    for (const [where, items] of reads) {
      expect(
        items.map((i) => [i.id, i.status]),
        where,
      ).toEqual([[id, "WORK_ITEM_STATUS_DISPATCHED"]]);
      expect(items[0]!.leaseToken, where).toBe("");
    }
  });
});

describe("absurd durations", () => {
  it("a Fail's retry_delay beyond a year is INVALID_ARGUMENT naming the field, and the item is untouched", async () => {
    await register("f3-agent", ["tD"], ["f3"]);
    const id = await enqueue("tD", "f3", { maxRetries: 3 });
    const [item] = await claim("f3-agent");
    for (const seconds of ["9223372036854775807", String(366 * 24 * 3600)]) {
      const [err] = await unary(
        agents,
        "Fail",
        { name: "f3-agent", items: [{ workItemId: id, leaseToken: item!.leaseToken, retryable: true, retryDelay: { seconds } }] },
        T.agent,
      );
      expect(err?.code, seconds).toBe(grpc.status.INVALID_ARGUMENT);
      expect(err?.details, seconds).toContain("items[0].retry_delay");
    }
    expect(await row(id)).toMatchObject({ status: "dispatched", lease_token: item!.leaseToken });
    const ok = await must<{ outcomes: { ok: boolean }[] }>(
      agents,
      "Fail",
      { name: "f3-agent", items: [{ workItemId: id, leaseToken: item!.leaseToken, retryable: true, retryDelay: { seconds: String(364 * 24 * 3600) } }] },
      T.agent,
    );
    expect(ok.outcomes.map((o) => o.ok)).toEqual([true]);
  });

  it("a drain deadline beyond a year is INVALID_ARGUMENT naming the field, and the agent is not drained", async () => {
    await register("f3-drain", ["tD"], ["f3"]);
    for (const seconds of ["9223372036854775807", String(366 * 24 * 3600)]) {
      const [err] = await unary(ops, "DrainAgent", { name: "f3-drain", deadline: { seconds } }, T.ops);
      expect(err?.code, seconds).toBe(grpc.status.INVALID_ARGUMENT);
      expect(err?.details, seconds).toContain("deadline");
    }
    const [agent] = await db.raw<{ status: string }>(`SELECT status FROM ${db.schema}.aiflow_agent WHERE name = 'f3-drain'`);
    expect(agent!.status).toBe("active");
  });
});
