/**
 * The concurrency-key RPCs for operators: ListConcurrencyKeys (limit and its source, in flight and
 * pending, prefix rules, pages) and SetConcurrencyLimit (a key's limit, a prefix rule, clearing),
 * with the claims they govern, the refusals at the edge and the role they need.
 *
 * On the daemon of test/support/queue-daemon.ts: one daemon, a fake clock. Every test uses tenants
 * and agents of its own.
 */
import { Code } from "@connectrpc/connect";
import { sql } from "slonik";
import { beforeAll, describe, expect, it } from "vitest";
import { OpsService, type ConcurrencyKey } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { TOKENS } from "./support/daemon.js";
import { codeOf, Session } from "./support/kit.js";
import { opsSession } from "./support/ops.js";
import type { Producer } from "./support/queue.js";
import { CLAIM_MAX_WAIT, ids, useQueueDaemon } from "./support/queue-daemon.js";

const fx = useQueueDaemon("concops");
let p: Producer;
let ops: Session<typeof OpsService>;
beforeAll(() => {
  p = fx.p;
  ops = fx.closers.add(opsSession(fx.daemon.address));
});

const keyed = (key: string, maxInFlight?: number) => ({ engineKind: "dag", workerParams: { concurrencyKey: key, ...(maxInFlight ? { maxInFlight } : {}) } });
const many = (n: number, key: string, maxInFlight?: number) => Array.from({ length: n }, () => keyed(key, maxInFlight));

/** A key as the tests compare it. */
const shown = (k: ConcurrencyKey | undefined) => k && { key: k.key, limit: k.limit, source: k.limitSource, inFlight: k.inFlight, pending: Number(k.pending) };

const list = async (req: { tenantKey?: string; keyPrefix?: string; pageSize?: number; pageToken?: string }) => ops.client.listConcurrencyKeys(req, ops.call);
const keysOf = async (tenant: string) => (await list({ tenantKey: tenant })).keys.map(shown);
const set = (tenant: string, key: string, maxInFlight: number, prefix = false) =>
  ops.client.setConcurrencyLimit({ tenantKey: tenant, key, maxInFlight, prefix }, ops.call);

describe("ListConcurrencyKeys", () => {
  it("shows the items' limit, and in flight and pending as an agent claims", async () => {
    const t = "cko-list";
    const a = await fx.agent("cko-list-a", { tenants: [t], slots: 8 });
    await p.enqueue(t, many(4, "k", 2));
    expect(await keysOf(t)).toEqual([{ key: "k", limit: 2, source: "items", inFlight: 0, pending: 4 }]);
    expect(await a.claim(5)).toHaveLength(2);
    expect(await keysOf(t)).toEqual([{ key: "k", limit: 2, source: "items", inFlight: 2, pending: 2 }]);
    const res = await list({ tenantKey: t });
    expect([res.keys[0]!.tenantKey, res.nextPageToken, res.rules]).toEqual([t, "", []]);
  });

  it("pages with page_size 1 through every key once, a key with only an operator's limit and a key longer than a token's strings among them", async () => {
    const t = "cko-page";
    const long = `p2${"x".repeat(298)}`;
    await p.enqueue(t, [keyed("p1"), keyed("p2"), keyed(long), keyed("p3")]);
    await set(t, "p0", 5);
    const walk = async (req: { tenantKey?: string }) => {
      const seen: string[] = [];
      let token = "";
      for (let pages = 0; pages < 1000; pages++) {
        const res = await list({ ...req, pageSize: 1, pageToken: token });
        expect(res.keys.length).toBeLessThanOrEqual(1);
        seen.push(...res.keys.map((k) => `${k.tenantKey}/${k.key}`));
        token = res.nextPageToken;
        if (!token) return seen;
      }
      throw new Error("no last page");
    };
    expect(await walk({ tenantKey: t })).toEqual(["p0", "p1", "p2", long, "p3"].map((k) => `${t}/${k}`));
    // Every tenant: the walk sees what one large page holds, each key once.
    const all = await walk({});
    expect(new Set(all).size).toBe(all.length);
    expect(all).toEqual((await list({ pageSize: 1000 })).keys.map((k) => `${k.tenantKey}/${k.key}`));
    expect(await codeOf(list({ pageToken: "not-a-token" }))).toBe(Code.InvalidArgument);
  });
});

describe("SetConcurrencyLimit", () => {
  it("an operator's limit on the key stands over the items': source ops, and a waiting claim takes one more at once", async () => {
    const t = "cko-set";
    const a = await fx.agent("cko-set-a", { tenants: [t], slots: 8 });
    const b = await fx.agent("cko-set-b", { tenants: [t], slots: 8 });
    const items = await p.enqueue(t, many(5, "k", 2));
    expect(ids(await a.claim(5))).toEqual([items[0]!.id, items[1]!.id]);
    // Nothing more of the key may start: b waits.
    const waiting = b.claim(5, CLAIM_MAX_WAIT);
    const res = await set(t, "k", 3);
    expect([res.key?.limit, res.key?.limitSource]).toEqual([3, "ops"]);
    expect(ids(await waiting)).toEqual([items[2]!.id]);
    expect(await keysOf(t)).toEqual([{ key: "k", limit: 3, source: "ops", inFlight: 3, pending: 2 }]);
    expect(await b.claim(5)).toEqual([]);

    // Cleared: the items' own limit again, and the key's row stays (claims compare-and-set on it).
    const cleared = await set(t, "k", 0);
    expect(shown(cleared.key)).toEqual({ key: "k", limit: 2, source: "items", inFlight: 3, pending: 2 });
    const rows = await fx.db.pool.any(sql.unsafe`SELECT key, prefix, max_in_flight FROM ${fx.db.tables.id("concurrency_key")} WHERE tenant_key = ${t}`);
    expect(rows).toEqual([{ key: "k", prefix: false, max_in_flight: null }]);
  });

  it("a prefix rule is listed as a rule and is the source for keys without a limit of their own; clearing it restores the items'", async () => {
    const t = "cko-prefix";
    const a = await fx.agent("cko-prefix-a", { tenants: [t], slots: 8 });
    // % and _ are plain characters in keys and prefixes.
    await p.enqueue(t, [...many(2, "k", 2), ...many(3, "k%_1", 2), ...many(2, "other", 2)]);
    await set(t, "k", 3);
    const rule = await set(t, "k", 1, true);
    expect(rule.key).toBeUndefined();
    const res = await list({ tenantKey: t });
    expect(res.rules.map((r) => [r.tenantKey, r.keyPrefix, r.maxInFlight])).toEqual([[t, "k", 1]]);
    expect(res.keys.map(shown)).toEqual([
      { key: "k", limit: 3, source: "ops", inFlight: 0, pending: 2 },
      { key: "k%_1", limit: 1, source: "ops prefix k", inFlight: 0, pending: 3 },
      { key: "other", limit: 2, source: "items", inFlight: 0, pending: 2 },
    ]);
    expect((await list({ tenantKey: t, keyPrefix: "k%" })).keys.map((k) => k.key)).toEqual(["k%_1"]);
    expect((await list({ tenantKey: t, keyPrefix: "k_" })).keys).toEqual([]);
    // Claims hold the keys to those limits: 2 of k (all there are), 1 of k%_1, 2 of other.
    const took = [...(await a.claim(5)), ...(await a.claim(5))];
    expect(took.map((i) => i.workerParams?.concurrencyKey).sort()).toEqual(["k", "k", "k%_1", "other", "other"]);
    expect(await a.claim(5)).toEqual([]);

    // The key's own limit cleared: the prefix's applies to it too.
    await set(t, "k", 0);
    expect((await keysOf(t))[0]).toEqual({ key: "k", limit: 1, source: "ops prefix k", inFlight: 2, pending: 0 });
    await set(t, "k", 0, true);
    const after = await list({ tenantKey: t });
    expect(after.rules).toEqual([]);
    expect(after.keys.map(shown)).toEqual([
      // Nothing of k or other is pending and no operator limits them: no limit is known.
      { key: "k", limit: 0, source: "", inFlight: 2, pending: 0 },
      { key: "k%_1", limit: 2, source: "items", inFlight: 1, pending: 2 },
      { key: "other", limit: 0, source: "", inFlight: 2, pending: 0 },
    ]);
  });

  it("refuses an empty key, a limit over 100000 and a bad tenant, changing nothing", async () => {
    const t = "cko-bad";
    expect(await codeOf(set(t, "", 2))).toBe(Code.InvalidArgument);
    expect(await codeOf(set(t, "  ", 2, true))).toBe(Code.InvalidArgument);
    expect(await codeOf(set(t, "k", 100_001))).toBe(Code.InvalidArgument);
    expect(await codeOf(set("bad tenant", "k", 2))).toBe(Code.InvalidArgument);
    expect(await codeOf(set(t, "k".repeat(513), 2))).toBe(Code.InvalidArgument);
    expect(await codeOf(list({ tenantKey: "bad tenant" }))).toBe(Code.InvalidArgument);
    expect(await keysOf(t)).toEqual([]);
    expect(shown((await set(t, "k", 100_000)).key)).toEqual({ key: "k", limit: 100_000, source: "ops", inFlight: 0, pending: 0 });
  });

  it("needs the ops role: an engine token, one limited to a tenant too, is PERMISSION_DENIED", async () => {
    const t = "t1";
    for (const token of [TOKENS.engineT1, TOKENS.engine]) {
      const s = fx.closers.add(new Session(fx.daemon.address, OpsService, token));
      expect(await codeOf(s.client.listConcurrencyKeys({ tenantKey: t }, s.call))).toBe(Code.PermissionDenied);
      expect(await codeOf(s.client.setConcurrencyLimit({ tenantKey: t, key: "k", maxInFlight: 2 }, s.call))).toBe(Code.PermissionDenied);
    }
    expect(await keysOf(t)).toEqual([]);
  });
});
