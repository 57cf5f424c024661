/**
 * Affinity bindings belong to a tenant (issue 52 item 3): one tenant's choice of key binds that key
 * for its own items only, so it can neither route another tenant's work to an agent that does not
 * serve it nor make that work a dead letter. The ops RPCs name a binding by tenant and key, and a
 * token limited to some tenants reaches their bindings only.
 *
 * On the daemon of useAffinityDaemon (support/affinity.ts): a fake clock only a test moves, the
 * sweeps run when a test runs them.
 */
import { describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { agent, bindingRows, enqueue, GRACE, keyed, useAffinityDaemon } from "./support/affinity.js";
import { refusal } from "./support/kit.js";
import { itemRow } from "./support/queue.js";

const R = useAffinityDaemon("afftenants", "rebind");
const KEY = "model:llama-70b";

describe("an affinity key", () => {
  it("binds per tenant: acme's binding to an acme-only agent neither strands nor dead-letters globex's item of the same key", async () => {
    const { clock, db } = R;
    const acmeAgent = await agent(R, "acme-only", { tenants: ["acme"] });
    const globexAgent = await agent(R, "globex-only", { tenants: ["globex"] });
    await enqueue(R, "acme", [keyed("k", KEY)]);
    const [acmeItem] = await acmeAgent.claim(1);
    expect(acmeItem?.workerParams?.affinityKey).toBe(KEY);

    const [globexId] = await enqueue(R, "globex", [keyed("k", KEY)]);
    const [globexItem] = await globexAgent.claim(1);
    expect(globexItem?.id).toBe(globexId);
    // Past the grace, the stranded sweep finds nothing of globex's to fail.
    clock.advance(GRACE + 1_000);
    await R.daemon.maintenance.runOnce();
    expect((await itemRow(db, globexId!)).status).toBe("dispatched");

    const rows = await bindingRows(db, "affinity_key = $1", [KEY]);
    expect(rows.map((r) => [r.tenant_key, r.agent_id])).toEqual([
      ["acme", "acme-only"],
      ["globex", "globex-only"],
    ]);
    await acmeAgent.complete([acmeItem!]);
    await globexAgent.complete([globexItem!]);
  });
});

describe("the ops RPCs", () => {
  it("list, unbind and rebind a binding by tenant and key; without a tenant, a key bound in two tenants is ambiguous", async () => {
    const { ops } = R;
    const key = "ops-tenant-key";
    const a1 = await agent(R, "opt-a1", { tenants: ["t-a"] });
    const a2 = await agent(R, "opt-a2", { tenants: ["t-a"] });
    const b1 = await agent(R, "opt-b1", { tenants: ["t-b"] });
    for (const [t, who] of [
      ["t-a", a1],
      ["t-b", b1],
    ] as const) {
      await enqueue(R, t, [keyed("k", key)]);
      await who.complete(await who.claim(1));
    }
    const listed = await ops.client.listBindings({ keyPrefix: key }, ops.call);
    expect(listed.bindings.map((b) => [b.tenantKey, b.affinityKey, b.agentId])).toEqual([
      ["t-a", key, "opt-a1"],
      ["t-b", key, "opt-b1"],
    ]);
    expect((await ops.client.listBindings({ keyPrefix: key, tenantKey: "t-b" }, ops.call)).bindings.map((b) => b.agentId)).toEqual(["opt-b1"]);

    const ambiguous = await refusal(ops.client.unbind({ affinityKey: key }, ops.call));
    expect(ambiguous.code).toBe(Code.InvalidArgument);
    expect(ambiguous.rawMessage).toContain("t-a, t-b");
    // An agent that does not serve the binding's tenant cannot take its key.
    expect((await refusal(ops.client.rebind({ tenantKey: "t-a", affinityKey: key, agentId: "opt-b1" }, ops.call))).code).toBe(Code.FailedPrecondition);
    const moved = await ops.client.rebind({ tenantKey: "t-a", affinityKey: key, agentId: "opt-a2" }, ops.call);
    expect(moved.binding).toMatchObject({ tenantKey: "t-a", affinityKey: key, agentId: a2.name });
    await ops.client.unbind({ tenantKey: "t-b", affinityKey: key }, ops.call);
    expect((await ops.client.listBindings({ keyPrefix: key }, ops.call)).bindings.map((b) => [b.tenantKey, b.agentId])).toEqual([["t-a", "opt-a2"]]);
    // One binding left: a request without a tenant (a client from before tenants) names it.
    await ops.client.unbind({ affinityKey: key }, ops.call);
    expect((await refusal(ops.client.unbind({ affinityKey: key }, ops.call))).code).toBe(Code.NotFound);
  });
});
