/**
 * The fair-share and rate-limit RPCs for operators: ListTenants and SetTenantWeight (weights and
 * where they come from, the pending backlog's turns respaced by a change), ListRateLimits and
 * SetRateLimit (limits on keys and prefixes, the keys' state, clearing, and the claims they govern),
 * worker_params.rate_limit_key at enqueue, the refusals at the edge and the tenants a token may act
 * for.
 *
 * One daemon, a fake clock, configured weights for one tenant. Every test uses tenants and agents
 * of its own.
 */
import { durationFromMs, timestampMs, type Duration } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import { beforeAll, describe, expect, it } from "vitest";
import { FakeClock, msToNs } from "../src/clock.js";
import { OpsService, type RateLimitKey, type RateLimitRule, type Tenant } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { parseTokenSpec } from "../src/domain/tokens.js";
import { testTokens, TOKENS } from "./support/daemon.js";
import { codeOf, refusal, Session, useTestDaemon } from "./support/kit.js";
import { Producer, TestAgent, type AgentSpec } from "./support/queue.js";

const NOW = Date.UTC(2026, 3, 1);
const clock = new FakeClock(NOW);
/** An ops token limited to tenant fs-lim. */
const OPS_LIMITED = "ops-fs-limited-1";
const fx = useTestDaemon({
  label: "fsops",
  clock,
  config: {
    instanceId: "fsops",
    sweepInterval: 3_600_000,
    heartbeatFlush: 3_600_000,
    heartbeatInterval: 86_400_000,
    claimMaxItems: 16,
    tokens: [...testTokens(), parseTokenSpec(`ops:${OPS_LIMITED}:fs-lim`, "test")],
    tenantWeights: new Map([["fs-cfg", 3]]),
  },
});
let p: Producer;
let ops: Session<typeof OpsService>;
beforeAll(() => {
  p = fx.closers.add(new Producer(fx.address));
  ops = fx.closers.add(new Session(fx.address, OpsService, TOKENS.ops));
});

const agent = async (name: string, spec: Partial<AgentSpec> & { tenants: string[] }) =>
  fx.closers.add(await TestAgent.register(fx.address, name, { engineKinds: ["dag"], slots: 16, ...spec }));
const plain = (n: number) => Array.from({ length: n }, () => ({ engineKind: "dag" }));
const keyed = (n: number, rateLimitKey: string) => Array.from({ length: n }, () => ({ engineKind: "dag", workerParams: { rateLimitKey } }));

const table = (name: "work_item" | "tenant_share" | "rate_limit") => fx.db.tables.qualified(name);

/** A tenant as the tests compare it. */
const shown = (t: Tenant | undefined) =>
  t && { tenant: t.tenantKey, weight: t.weight, source: t.weightSource, pending: Number(t.pending), dispatched: Number(t.dispatched) };
const tenantsOf = async (tenantKey = "") => (await ops.client.listTenants({ tenantKey }, ops.call)).tenants.map(shown);
const setWeight = (tenantKey: string, weight: number) => ops.client.setTenantWeight({ tenantKey, weight }, ops.call);
const clearWeight = (tenantKey: string) => ops.client.setTenantWeight({ tenantKey, clear: true }, ops.call);

const ms = (d: Duration | undefined) => (d ? Number(d.seconds) * 1000 + d.nanos / 1e6 : undefined);
const ruleShown = (r: RateLimitRule | undefined) => r && { key: r.key, prefix: r.prefix, count: r.count, intervalMs: ms(r.interval), burst: r.burst };
/** A key's next slot as ms after NOW (rounded: the state is float8 nanoseconds). */
const keyShown = (k: RateLimitKey | undefined) =>
  k && { key: k.key, nextSlot: k.nextSlotAt ? Math.round(timestampMs(k.nextSlotAt)) - NOW : null, limit: ruleShown(k.limit) ?? null };
const listLimits = (req: { tenantKey?: string; keyPrefix?: string; pageSize?: number; pageToken?: string }) => ops.client.listRateLimits(req, ops.call);
const setLimit = (tenantKey: string, key: string, count: number, intervalMs: number, opts: { burst?: number; prefix?: boolean } = {}) =>
  ops.client.setRateLimit({ tenantKey, key, count, interval: durationFromMs(intervalMs), burst: opts.burst ?? 0, prefix: opts.prefix ?? false }, ops.call);
const clearLimit = (tenantKey: string, key: string, prefix = false) => ops.client.setRateLimit({ tenantKey, key, prefix, clear: true }, ops.call);

describe("ListTenants and SetTenantWeight", () => {
  it("lists configured tenants and tenants that enqueued, each weight with its source; an operator's weight stands over them until cleared", async () => {
    // Configured, with no row yet (nothing enqueued).
    expect(await tenantsOf("fs-cfg")).toEqual([{ tenant: "fs-cfg", weight: 3, source: "config", pending: 0, dispatched: 0 }]);
    await p.enqueue("fs-a", plain(3));
    const a = await agent("fs-a-agent", { tenants: ["fs-a"] });
    expect(await a.claim(1)).toHaveLength(1);
    expect(await tenantsOf("fs-a")).toEqual([{ tenant: "fs-a", weight: 1, source: "default", pending: 2, dispatched: 1 }]);
    const all = await tenantsOf();
    expect(all.map((t) => t!.tenant)).toEqual(["fs-a", "fs-cfg"]);

    expect(shown((await setWeight("fs-a", 2.5)).tenant)).toEqual({ tenant: "fs-a", weight: 2.5, source: "operator", pending: 2, dispatched: 1 });
    expect(shown((await setWeight("fs-cfg", 0.5)).tenant)).toEqual({ tenant: "fs-cfg", weight: 0.5, source: "operator", pending: 0, dispatched: 0 });
    expect(shown((await clearWeight("fs-cfg")).tenant)).toEqual({ tenant: "fs-cfg", weight: 3, source: "config", pending: 0, dispatched: 0 });
    expect(shown((await clearWeight("fs-a")).tenant)).toEqual({ tenant: "fs-a", weight: 1, source: "default", pending: 2, dispatched: 1 });
    // A tenant that never enqueued gets its row, with the operator's weight.
    expect(shown((await setWeight("fs-new", 1000)).tenant)).toEqual({ tenant: "fs-new", weight: 1000, source: "operator", pending: 0, dispatched: 0 });
    // The operator's weight is on the row (NULL once cleared), written by the ops token's principal.
    const rows = await fx.db.raw<{ tenant_key: string; weight: number | null; by_ops: boolean }>(
      `SELECT tenant_key, weight, updatedby LIKE 'ops-%' AS by_ops FROM ${table("tenant_share")} WHERE tenant_key IN ('fs-a', 'fs-cfg', 'fs-new') ORDER BY tenant_key`,
    );
    expect(rows).toEqual([
      { tenant_key: "fs-a", weight: null, by_ops: true },
      { tenant_key: "fs-cfg", weight: null, by_ops: true },
      { tenant_key: "fs-new", weight: 1000, by_ops: true },
    ]);
  });

  it("respaces the tenant's pending backlog past the queue's current turn V: tags V+1..V+10 at weight 1 become V+0.5..V+5 at weight 2, and back", async () => {
    const t = "fs-rs";
    const V = -1_000_000;
    const [anchor] = await p.enqueue("fs-rs-anchor", plain(1));
    const items = await p.enqueue(t, plain(11));
    // The queue's current turn: the earliest turn of a due pending item, the anchor's. The tenant's
    // backlog holds the next ten turns after it, and one more item not yet due.
    await fx.db.raw(`UPDATE ${table("work_item")} SET share_tag = $1 WHERE id = $2`, [V, anchor!.id]);
    for (const [i, it] of items.slice(0, 10).entries()) await fx.db.raw(`UPDATE ${table("work_item")} SET share_tag = $1 WHERE id = $2`, [V + i + 1, it.id]);
    await fx.db.raw(`UPDATE ${table("work_item")} SET share_tag = $1, next_attempt_at = $2 WHERE id = $3`, [
      V + 12,
      String(msToNs(NOW + 3_600_000)),
      items[10]!.id,
    ]);
    await fx.db.raw(`UPDATE ${table("tenant_share")} SET last_tag = $1 WHERE tenant_key = $2`, [V + 12, t]);
    const tags = async () => {
      const rows = await fx.db.raw<{ id: string; share_tag: number }>(`SELECT id, share_tag FROM ${table("work_item")} WHERE tenant_key = $1`, [t]);
      const by = new Map(rows.map((r) => [r.id, r.share_tag - V]));
      const [share] = await fx.db.raw<{ last_tag: number }>(`SELECT last_tag FROM ${table("tenant_share")} WHERE tenant_key = $1`, [t]);
      return { items: items.map((i) => by.get(i.id)), last: share!.last_tag - V };
    };
    const step = (k: number) => Array.from({ length: 10 }, (_, i) => (i + 1) * k);

    await setWeight(t, 2);
    expect(await tags()).toEqual({ items: [...step(0.5), 6], last: 6 });
    // The same effective weight again: nothing moves.
    await setWeight(t, 2);
    expect(await tags()).toEqual({ items: [...step(0.5), 6], last: 6 });
    // Cleared: back to 1 (the default), and the backlog with it.
    await clearWeight(t);
    expect(await tags()).toEqual({ items: [...step(1), 12], last: 12 });
    // The anchor (another tenant's, at V) never moved.
    expect((await fx.db.raw<{ share_tag: number }>(`SELECT share_tag FROM ${table("work_item")} WHERE id = $1`, [anchor!.id]))[0]!.share_tag).toBe(V);
    await fx.db.raw(`UPDATE ${table("work_item")} SET status = 'cancelled' WHERE tenant_key IN ($1, 'fs-rs-anchor')`, [t]);
  });

  it("refuses a weight out of bounds, a weight with clear and a bad tenant, naming the field and changing nothing", async () => {
    const t = "fs-bad";
    for (const weight of [0, 0.0001, 1000.5, -1, Number.NaN, Number.POSITIVE_INFINITY]) {
      const err = await refusal(setWeight(t, weight));
      expect([err.code, err.rawMessage.split(":")[0]]).toEqual([Code.InvalidArgument, "weight"]);
    }
    const both = await refusal(ops.client.setTenantWeight({ tenantKey: t, weight: 2, clear: true }, ops.call));
    expect([both.code, both.rawMessage]).toEqual([Code.InvalidArgument, "weight: is set with clear (clear drops the operator's weight)"]);
    const tenant = await refusal(setWeight("bad tenant", 2));
    expect([tenant.code, tenant.rawMessage.split(":")[0]]).toEqual([Code.InvalidArgument, "tenant_key"]);
    expect(await codeOf(ops.client.listTenants({ tenantKey: "bad tenant" }, ops.call))).toBe(Code.InvalidArgument);
    expect(await tenantsOf(t)).toEqual([]);
  });
});

describe("ListRateLimits and SetRateLimit", () => {
  it("sets, lists and clears a key's limit and a prefix's; keys show their next slot and the limit that applies; claims follow each change at once", async () => {
    const t = "rl-a";
    const a = await agent("rl-a-agent", { tenants: [t] });
    const set = await setLimit(t, "api", 2, 1000);
    expect(ruleShown(set.rule)).toEqual({ key: "api", prefix: false, count: 2, intervalMs: 1000, burst: 1 });
    expect(keyShown(set.key)).toEqual({ key: "api", nextSlot: null, limit: { key: "api", prefix: false, count: 2, intervalMs: 1000, burst: 1 } });
    const prefix = await setLimit(t, "model:", 1, 1000, { burst: 3, prefix: true });
    expect([ruleShown(prefix.rule), prefix.key]).toEqual([{ key: "model:", prefix: true, count: 1, intervalMs: 1000, burst: 3 }, undefined]);

    await p.enqueue(t, [...keyed(4, "api"), ...keyed(2, "model:x"), ...plain(1)]);
    // api: one now (2 per second, no burst); model:x: both (a burst of 3); the plain item.
    const first = await a.claim(16);
    expect(first.map((i) => i.workerParams?.rateLimitKey ?? "").sort()).toEqual(["", "api", "model:x", "model:x"]);
    const listed = await listLimits({ tenantKey: t });
    expect(listed.rules.map(ruleShown)).toEqual([
      { key: "api", prefix: false, count: 2, intervalMs: 1000, burst: 1 },
      { key: "model:", prefix: true, count: 1, intervalMs: 1000, burst: 3 },
    ]);
    expect(listed.keys.map(keyShown)).toEqual([
      { key: "api", nextSlot: 500, limit: { key: "api", prefix: false, count: 2, intervalMs: 1000, burst: 1 } },
      // Two slots spent of a burst of three: the next conforms now.
      { key: "model:x", nextSlot: 0, limit: { key: "model:", prefix: true, count: 1, intervalMs: 1000, burst: 3 } },
    ]);
    expect(listed.nextPageToken).toBe("");
    const filtered = await listLimits({ tenantKey: t, keyPrefix: "mod" });
    expect([filtered.rules.map((r) => r.key), filtered.keys.map((k) => k.key)]).toEqual([["model:"], ["model:x"]]);
    const paged = await listLimits({ tenantKey: t, pageSize: 1 });
    expect(paged.keys.map((k) => k.key)).toEqual(["api"]);
    expect((await listLimits({ tenantKey: t, pageSize: 1, pageToken: paged.nextPageToken })).keys.map((k) => k.key)).toEqual(["model:x"]);
    expect(await a.claim(16)).toEqual([]);

    // Raised to 10 per second: the slot api spent counts a tenth of a second now, not half.
    const raised = await setLimit(t, "api", 10, 1000);
    expect(keyShown(raised.key)).toEqual({ key: "api", nextSlot: 100, limit: { key: "api", prefix: false, count: 10, intervalMs: 1000, burst: 1 } });
    clock.advance(100);
    expect((await a.claim(16)).map((i) => i.workerParams?.rateLimitKey)).toEqual(["api"]);

    // Cleared: the key keeps its row (claims write its state) without a limit, and nothing holds it.
    const cleared = await clearLimit(t, "api");
    expect([cleared.rule, keyShown(cleared.key)]).toEqual([undefined, { key: "api", nextSlot: null, limit: null }]);
    const rows = () =>
      fx.db.raw<{ key: string; prefix: boolean; limit_count: number | null; spent: boolean; open: boolean }>(
        `SELECT key, prefix, limit_count, tat_ns IS NOT NULL AS spent, open_ns IS NOT NULL AS open FROM ${table("rate_limit")} WHERE tenant_key = $1 ORDER BY key, prefix`,
        [t],
      );
    expect(await rows()).toEqual([
      { key: "api", prefix: false, limit_count: null, spent: true, open: false },
      { key: "model:", prefix: true, limit_count: 1, spent: false, open: false },
      { key: "model:x", prefix: false, limit_count: null, spent: true, open: true },
    ]);
    expect((await a.claim(16)).map((i) => i.workerParams?.rateLimitKey)).toEqual(["api", "api"]);

    // A key's own limit on a key with state from its prefix: the state stays, and the key's limit applies.
    const own = await setLimit(t, "model:x", 5, 1000);
    expect(keyShown(own.key)).toMatchObject({ key: "model:x", limit: { key: "model:x", prefix: false, count: 5 } });
    expect((await rows()).find((r) => r.key === "model:x")).toEqual({ key: "model:x", prefix: false, limit_count: 5, spent: true, open: true });
    // Its own cleared, the prefix's applies again.
    expect(keyShown((await clearLimit(t, "model:x")).key)?.limit).toEqual({ key: "model:", prefix: true, count: 1, intervalMs: 1000, burst: 3 });
    // The prefix rule cleared: its row goes; the key is not limited.
    await clearLimit(t, "model:", true);
    const after = await listLimits({ tenantKey: t });
    expect([after.rules, after.keys.map(keyShown)]).toEqual([
      [],
      [
        { key: "api", nextSlot: null, limit: null },
        { key: "model:x", nextSlot: null, limit: null },
      ],
    ]);
    // Clearing what has no limit changes nothing, and leaves no row.
    expect(keyShown((await clearLimit(t, "nothing")).key)).toEqual({ key: "nothing", nextSlot: null, limit: null });
    expect((await rows()).map((r) => r.key)).toEqual(["api", "model:x"]);
  });

  it("refuses counts, intervals, bursts and keys out of bounds, limits with clear and a bad tenant, naming the field and changing nothing", async () => {
    const t = "rl-bad";
    const fieldOf = async (call: Promise<unknown>) => {
      const err = await refusal(call);
      return [err.code, err.rawMessage.split(":")[0]];
    };
    const bad = Code.InvalidArgument;
    expect(await fieldOf(setLimit(t, "k", 0, 1000))).toEqual([bad, "count"]);
    expect(await fieldOf(setLimit(t, "k", 1_000_001, 1000))).toEqual([bad, "count"]);
    expect(await fieldOf(setLimit(t, "k", -1, 1000))).toEqual([bad, "count"]);
    expect(await fieldOf(ops.client.setRateLimit({ tenantKey: t, key: "k", count: 1 }, ops.call))).toEqual([bad, "interval"]);
    expect(await fieldOf(ops.client.setRateLimit({ tenantKey: t, key: "k", count: 1, interval: { seconds: 0n, nanos: 500_000 } }, ops.call))).toEqual([
      bad,
      "interval",
    ]);
    expect(await fieldOf(setLimit(t, "k", 1, 7 * 24 * 3600 * 1000 + 1))).toEqual([bad, "interval"]);
    expect(await fieldOf(setLimit(t, "k", 1, 1000, { burst: -1 }))).toEqual([bad, "burst"]);
    expect(await fieldOf(setLimit(t, "k", 1, 1000, { burst: 100_001 }))).toEqual([bad, "burst"]);
    expect(await fieldOf(setLimit(t, "", 1, 1000))).toEqual([bad, "key"]);
    expect(await fieldOf(setLimit(t, "  ", 1, 1000, { prefix: true }))).toEqual([bad, "key"]);
    expect(await fieldOf(setLimit(t, "k".repeat(513), 1, 1000))).toEqual([bad, "key"]);
    expect(await fieldOf(ops.client.setRateLimit({ tenantKey: t, key: "k", clear: true, count: 5 }, ops.call))).toEqual([bad, "count"]);
    expect(await fieldOf(ops.client.setRateLimit({ tenantKey: t, key: "k", clear: true, interval: durationFromMs(1000) }, ops.call))).toEqual([
      bad,
      "interval",
    ]);
    expect(await fieldOf(setLimit("bad tenant", "k", 1, 1000))).toEqual([bad, "tenant_key"]);
    expect(await fieldOf(listLimits({ tenantKey: "bad tenant" }))).toEqual([bad, "tenant_key"]);
    expect(await fieldOf(listLimits({ pageToken: "not-a-token" }))).toEqual([bad, "page_token"]);
    expect(await listLimits({ tenantKey: t })).toMatchObject({ rules: [], keys: [] });
    // The bounds themselves are taken.
    expect(ruleShown((await setLimit(t, "k", 1_000_000, 7 * 24 * 3600 * 1000, { burst: 100_000 })).rule)).toEqual({
      key: "k",
      prefix: false,
      count: 1_000_000,
      intervalMs: 7 * 24 * 3600 * 1000,
      burst: 100_000,
    });
    expect(ruleShown((await setLimit(t, "k", 1, 1)).rule)).toEqual({ key: "k", prefix: false, count: 1, intervalMs: 1, burst: 1 });
  });
});

describe("worker_params.rate_limit_key", () => {
  it("is stored in its column and in worker_params, and comes back in GetItem and the claim; over 512 characters is refused", async () => {
    const t = "rl-enq";
    const [item] = await p.enqueue(t, [{ engineKind: "dag", workerParams: { rateLimitKey: " api:v1 ", concurrencyKey: "c" } }]);
    const [row] = await fx.db.raw<{ rate_limit_key: string | null; params: string | null }>(
      `SELECT rate_limit_key, worker_params ->> 'rateLimitKey' AS params FROM ${table("work_item")} WHERE id = $1`,
      [item!.id],
    );
    expect(row).toEqual({ rate_limit_key: "api:v1", params: "api:v1" });
    expect((await p.item(t, item!.id)).workerParams).toMatchObject({ rateLimitKey: "api:v1", concurrencyKey: "c", maxInFlight: 1 });
    const a = await agent("rl-enq-agent", { tenants: [t] });
    expect((await a.claim(1)).map((i) => i.workerParams?.rateLimitKey)).toEqual(["api:v1"]);

    const [plainItem] = await p.enqueue(t, plain(1));
    expect((await fx.db.raw<{ k: string | null }>(`SELECT rate_limit_key AS k FROM ${table("work_item")} WHERE id = $1`, [plainItem!.id]))[0]!.k).toBeNull();
    expect((await p.item(t, plainItem!.id)).workerParams?.rateLimitKey ?? "").toBe("");

    const long = await refusal(p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag", workerParams: { rateLimitKey: "k".repeat(513) } }]));
    expect([long.code, long.rawMessage]).toEqual([Code.InvalidArgument, "items[1].worker_params.rate_limit_key: is 513 characters; the limit is 512"]);
    expect((await p.enqueue(t, [{ engineKind: "dag", workerParams: { rateLimitKey: "k".repeat(512) } }])).length).toBe(1);
  });
});

describe("who may call them", () => {
  it("a token limited to a tenant lists and sets within it only; another tenant is PERMISSION_DENIED; an engine token is refused", async () => {
    await p.enqueue("fs-lim", plain(1));
    await p.enqueue("fs-other", plain(1));
    await setLimit("fs-other", "api", 1, 1000);
    const limited = fx.closers.add(new Session(fx.address, OpsService, OPS_LIMITED));
    const c = limited.client;
    const call = limited.call;
    expect((await c.listTenants({}, call)).tenants.map((x) => x.tenantKey)).toEqual(["fs-lim"]);
    expect(await codeOf(c.listTenants({ tenantKey: "fs-other" }, call))).toBe(Code.PermissionDenied);
    expect(await codeOf(c.setTenantWeight({ tenantKey: "fs-other", weight: 2 }, call))).toBe(Code.PermissionDenied);
    expect(await codeOf(c.setTenantWeight({ tenantKey: "fs-other", clear: true }, call))).toBe(Code.PermissionDenied);
    expect((await c.setTenantWeight({ tenantKey: "fs-lim", weight: 2 }, call)).tenant?.weightSource).toBe("operator");
    expect(await codeOf(c.listRateLimits({ tenantKey: "fs-other" }, call))).toBe(Code.PermissionDenied);
    expect(await codeOf(c.setRateLimit({ tenantKey: "fs-other", key: "api", count: 5, interval: durationFromMs(1000) }, call))).toBe(Code.PermissionDenied);
    expect(await codeOf(c.setRateLimit({ tenantKey: "fs-other", key: "api", clear: true }, call))).toBe(Code.PermissionDenied);
    await c.setRateLimit({ tenantKey: "fs-lim", key: "api", count: 5, interval: durationFromMs(1000) }, call);
    expect((await c.listRateLimits({}, call)).rules.map((r) => [r.tenantKey, r.key, r.count])).toEqual([["fs-lim", "api", 5]]);
    // The other tenant's weight and limit are as they were.
    expect((await tenantsOf("fs-other"))[0]?.source).toBe("default");
    expect((await listLimits({ tenantKey: "fs-other" })).rules.map((r) => r.count)).toEqual([1]);

    for (const token of [TOKENS.engine, TOKENS.engineT1]) {
      const s = fx.closers.add(new Session(fx.address, OpsService, token));
      expect(await codeOf(s.client.listTenants({}, s.call))).toBe(Code.PermissionDenied);
      expect(await codeOf(s.client.setTenantWeight({ tenantKey: "t1", weight: 2 }, s.call))).toBe(Code.PermissionDenied);
      expect(await codeOf(s.client.listRateLimits({}, s.call))).toBe(Code.PermissionDenied);
      expect(await codeOf(s.client.setRateLimit({ tenantKey: "t1", key: "k", count: 1, interval: durationFromMs(1000) }, s.call))).toBe(Code.PermissionDenied);
    }
  });
});
