/**
 * New items handed straight to a waiting claim by the insert that writes them (src/queue/waiting-claims.ts),
 * end to end on one daemon over real HTTP/2 and a real Postgres, and the offer rules on their own.
 *
 * A handed item is told apart from a claimed one by its row version: an Enqueue of two items to a
 * claim that takes one leaves both rows as the insert wrote them (one xmin) when the first was handed
 * over, while a claim statement would have rewritten the first one (a newer xmin).
 */
import { beforeAll, describe, expect, it } from "vitest";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import pg from "pg";
import { FakeClock, msToNs } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { WaitingClaims } from "../src/queue/waiting-claims.js";
import type { Armed } from "../src/queue/wakeups.js";
import { workKey } from "../src/queue/work-keys.js";
import type { EnqueueRow, NewItem } from "../src/store/work-items.js";
import { bearer, TOKENS } from "./support/daemon.js";
import type { TestDb } from "./support/db.js";
import { until, useTestDaemon } from "./support/kit.js";
import {
  itemRow,
  newItem,
  notBefore,
  nsText,
  Producer,
  serverNow,
  statusCounts,
  STATEMENT,
  TestAgent,
  track,
  untilLockWait,
  untilStatementRan,
} from "./support/queue.js";

const LEASE = 30_000;
const clock = new FakeClock(Date.UTC(2026, 5, 1));
const fx = useTestDaemon({ label: "handoff", clock, config: { instanceId: "handoff", sweepInterval: 3_600_000, heartbeatFlush: 3_600_000, leaseTtl: LEASE } });
const closers = fx.closers;
let db: TestDb;
let daemon: Daemon;
let p: Producer;

beforeAll(() => {
  ({ db, daemon } = fx);
  p = closers.add(new Producer(daemon.address));
});

const agent = async (name: string, tenant: string) => closers.add(await TestAgent.register(daemon.address, name, { tenants: [tenant], engineKinds: ["dag"] }));

/** A claim of one item that waits up to `waitMs`, resolved once it looked at the table and waits. */
const waitingClaim = async (a: TestAgent, waitMs = 10_000) => {
  const since = await serverNow(db);
  const claim = track(a.claim(1, waitMs));
  await untilStatementRan(db, STATEMENT.claim, since);
  return claim;
};

/** Another connection with a transaction open (closed after the file's tests). */
const otherTransaction = async () => {
  const other = new pg.Client({ connectionString: db.url });
  await other.connect();
  closers.defer(() => other.end());
  await other.query("BEGIN");
  return other;
};

const xmin = async (id: string) => (await db.raw<{ v: string }>(`SELECT xmin::text AS v FROM ${db.tables.qualified("work_item")} WHERE id = $1`, [id]))[0]!.v;

describe("a claim already waiting", () => {
  it("is handed a new plain item by the insert that writes it, dispatched under a lease of its own", async () => {
    const t = "hand";
    const a = await agent("hand-1", t);
    const claim = await waitingClaim(a);
    const [first, second] = await p.enqueue(t, [
      { engineKind: "dag", taskName: "first", payloadJson: '{"n":1}', priority: 2, maxRetries: 4 },
      { engineKind: "dag", taskName: "second", priority: 3 },
    ]);
    const [item] = await claim.promise;
    expect(item!.id).toBe(first!.id);
    // Every field as the stored item reads back, with the dispatch's holder and lease (a claimed
    // item's payload is the stored JSON text and a plain item has no worker params, as claimed ones).
    const stored = await p.item(t, first!.id);
    expect(JSON.parse(item!.payloadJson)).toEqual(JSON.parse(stored.payloadJson));
    expect(stored.leaseToken).toBe("");
    expect({ ...item!, payloadJson: "", workerParams: undefined, leaseToken: "" }).toEqual({ ...stored, payloadJson: "", workerParams: undefined });
    expect(item).toMatchObject({ taskName: "first", payloadJson: '{"n": 1}', priority: 2, maxRetries: 4, tenantKey: t, engineKind: "dag", agentId: "hand-1" });

    const row = await itemRow(db, first!.id);
    expect(row).toMatchObject({ status: "dispatched", agent_id: "hand-1", leased_by: "handoff", lease_token: item!.leaseToken, updatedby: "hand-1" });
    expect(row.dispatched_at).toBe(nsText(clock.nowMs()));
    expect(row.lease_expires_at).toBe(nsText(clock.nowMs() + LEASE));
    expect(item!.leaseExpiresAtNs).toBe(msToNs(clock.nowMs() + LEASE));
    // Written once, by the insert: the same row version as the item that stayed pending.
    expect(await xmin(first!.id)).toBe(await xmin(second!.id));
    expect(await statusCounts(db, t)).toEqual({ dispatched: 1, pending: 1 });

    // The handed item's lease is an ordinary one: it completes, and the other item is claimed as before.
    expect((await a.complete([item!])).map((o) => o.ok)).toEqual([true]);
    expect((await a.claim(1)).map((i) => i.id)).toEqual([second!.id]);
  });

  it("is not handed a new item while an older one it could take is due; it claims that one first", async () => {
    const t = "hand-order";
    const a = await agent("hand-order-1", t);
    // Not due when the claim looks; due (by the clock, no wake-up) when the new item arrives.
    const older = await p.one(t, { engineKind: "dag", taskName: "older", notBefore: notBefore(clock.nowMs() + 1_000) });
    const claim = await waitingClaim(a);
    clock.advance(1_000);
    const newer = await p.one(t, { engineKind: "dag", taskName: "newer" });
    expect((await claim.promise).map((i) => i.id)).toEqual([older]);
    expect((await itemRow(db, newer)).status).toBe("pending");
  });

  it("is handed a new item that comes before the due one in claim order (a higher priority)", async () => {
    const t = "hand-urgent";
    const a = await agent("hand-urgent-1", t);
    const older = await p.one(t, { engineKind: "dag", priority: 5, notBefore: notBefore(clock.nowMs() + 1_000) });
    const claim = await waitingClaim(a);
    clock.advance(1_000);
    const [urgent, marker] = await p.enqueue(t, [
      { engineKind: "dag", priority: 1 },
      { engineKind: "dag", priority: 9 },
    ]);
    expect((await claim.promise).map((i) => i.id)).toEqual([urgent!.id]);
    expect(await xmin(urgent!.id)).toBe(await xmin(marker!.id));
    expect((await itemRow(db, older)).status).toBe("pending");
  });

  // Behind the daemon's back: its cached status still says active, so only the statements see it.
  // A row removed by another writer of the shared table may keep its status; deletedon alone rules it out.
  it.each([
    ["draining", "status = 'draining'"],
    ["removed", "deletedon = now()"],
  ])("of an agent no longer able to take work (%s) is not handed anything, nor claims it (the statements read the agent's row)", async (label, change) => {
    const t = `hand-gone-${label}`;
    const a = await agent(`hand-gone-${label}-1`, t);
    const claim = await waitingClaim(a, 500);
    await db.raw(`UPDATE ${db.tables.qualified("agent")} SET ${change} WHERE name = $1`, [a.name]);
    const id = await p.one(t, { engineKind: "dag" });
    expect(await claim.promise).toEqual([]);
    expect(await a.claim(1)).toEqual([]);
    expect((await itemRow(db, id)).status).toBe("pending");
  });

  it("is not handed work of a tenant its agent no longer serves (the insert reads the agent's registration)", async () => {
    const t = "hand-scope";
    const a = await agent("hand-scope-1", t);
    const claim = await waitingClaim(a, 500);
    // Registered again for another tenant; the waiting claim still listens for the old one.
    await a.conn.agent.register(
      { name: a.name, metadata: { tenants: ["hand-scope-other"], engineKinds: ["dag"], slots: 4 } },
      { headers: bearer(TOKENS.agent) },
    );
    const id = await p.one(t, { engineKind: "dag" });
    expect(await claim.promise).toEqual([]);
    expect((await itemRow(db, id)).status).toBe("pending");
  });

  it("is handed items while its statement runs too, and gives back the handed ones past its max_items", async () => {
    const t = "hand-during";
    const a = await agent("hand-during-1", t);
    const x = await p.one(t, { engineKind: "dag", taskName: "x" });
    const [held] = await a.claim(1);
    expect(held!.id).toBe(x);
    const older = await p.one(t, { engineKind: "dag", taskName: "older", priority: 5 });

    // Another transaction locks the item the claim completes, so the claim's statement waits mid-way.
    const other = await otherTransaction();
    await other.query(`SELECT 1 FROM ${db.tables.qualified("work_item")} WHERE id = $1 FOR UPDATE`, [x]);
    const claim = a.claimCompleting(1, [held!]);
    await untilLockWait(db, "WITH completing");
    // Ahead of the older item in claim order, so the insert hands it over to the claim's open slot.
    const urgent = await p.one(t, { engineKind: "dag", taskName: "urgent", priority: 1 });
    expect((await itemRow(db, urgent)).status).toBe("dispatched");
    await other.query("ROLLBACK");

    const reply = await claim;
    expect(reply.completionOutcomes.map((o) => o.ok)).toEqual([true]);
    // The statement took the older item (its snapshot predates the urgent one): one item, as asked.
    expect(reply.items.map((i) => i.id)).toEqual([older]);
    expect(await itemRow(db, urgent)).toMatchObject({ status: "pending", agent_id: null, lease_token: null, updatedby: "hand-during-1" });
  });

  it("whose call is gone by the time the insert commits gives the item back at once", async () => {
    const t = "hand-gone";
    const a = await agent("hand-gone-1", t);
    const since = await serverNow(db);
    const abort = new AbortController();
    const claim = a.conn.agent.claim({ name: a.name, maxItems: 1, wait: durationFromMs(10_000) }, { headers: bearer(TOKENS.agent), signal: abort.signal }).then(
      () => "answered",
      () => "cancelled",
    );
    await untilStatementRan(db, STATEMENT.claim, since);

    // Another transaction holds the new item's idempotency key, so the insert (holding its offer) waits.
    const other = await otherTransaction();
    await other.query(
      `INSERT INTO ${db.tables.qualified("work_item")} (id, tenant_key, engine_id, engine_kind, status, priority, next_attempt_at, retry_count, max_retries, idempotency_key, createdby, createdon)
       VALUES ('OTHER-GONE', $1, 'other', 'dag', 'pending', 0, 0, 0, 0, 'gone-key', 'other', now())`,
      [t],
    );
    const enqueued = p.one(t, { engineKind: "dag", idempotencyKey: "gone-key" });
    await untilLockWait(db, STATEMENT.insert);
    abort.abort();
    expect(await claim).toBe("cancelled");
    // A call after the cancel on the same connection: the daemon has read the cancel by its answer.
    await a.heartbeat();
    await other.query("ROLLBACK");
    const id = await enqueued;

    await until("the item handed to the cancelled claim is given back", async () => (await itemRow(db, id)).status === "pending");
    const row = await itemRow(db, id);
    expect(row).toMatchObject({ status: "pending", agent_id: null, lease_token: null, retry_count: 0 });
    expect(row.updatedby).toBe("hand-gone-1");
  });
});

describe("offers", () => {
  const open: Armed = { wait: async () => false, disarm: () => {}, setCapacity: () => {} };
  const rows = (...items: NewItem[]): EnqueueRow[] => items.map((it, i) => ({ id: `R${i}`, tenant: "t", engineId: "e", by: "p", nowMs: 0, item: it }));
  const handoff = () => new WaitingClaims("inst", 1_000, () => 5_000);

  it("go to open slots of the row's key, longest waiting first, each up to its capacity, in claim order", () => {
    const h = handoff();
    h.open("other-kind", new Set([workKey("t", "etl")]), 4, open);
    h.open("a", new Set([workKey("t", "dag")]), 2, open);
    h.open("b", null, 1, open);
    const r = h.reserve(rows(newItem({ priority: 3 }), newItem({ priority: 1 }), newItem({ priority: 3 }), newItem({ priority: 2 })))!;
    // Claim order: R1 (1), R3 (2), R0 (3), R2 (3).
    expect(r.input.agents).toEqual(["b", "a", null, "a"]);
    expect(new Set(r.input.tokens.filter(Boolean)).size).toBe(2);
    expect(r.input).toMatchObject({ instance: "inst", nowMs: 5_000, leaseTtlMs: 1_000 });
    expect(h.waiting).toBe(1);
  });

  it("skip rows that are not due, and stop at a row only a full claim may take (a selector or an affinity key)", () => {
    const h = handoff();
    h.open("a", null, 10, open);
    const r = h.reserve(
      rows(
        newItem({ priority: 1 }),
        newItem({ notBeforeNs: msToNs(6_000) }),
        newItem({ priority: 5, affinityKey: "k" }),
        newItem({ priority: 5 }),
        newItem({ priority: 7, workerParams: { selector: { gpu: "a100" } } }),
      ),
    )!;
    expect(r.input.agents).toEqual(["a", null, null, null, null]);
  });

  it("are none without an open slot, and a closed slot is offered nothing", async () => {
    const h = handoff();
    expect(h.reserve(rows(newItem()))).toBeUndefined();
    const slot = h.open("a", null, 1, open);
    expect(await h.close(slot)).toBeUndefined();
    expect(h.reserve(rows(newItem()))).toBeUndefined();
  });

  it("settle: a slot's claim gets the rows that went in dispatched, or nothing when the insert failed", async () => {
    const h = handoff();
    let disarmed = 0;
    const s1 = h.open("a", null, 5, { ...open, disarm: () => disarmed++ });
    const r = h.reserve(rows(newItem(), newItem()))!;
    expect(disarmed).toBe(1);
    const closing = h.close(s1);
    const claimed = { id: "R0" } as never;
    r.settle([
      { id: "R0", existing: false, claimed },
      { id: "R1", existing: false },
    ]);
    const got = await closing;
    expect(got!.rows).toEqual([claimed]);
    expect(got!.dispatch).toMatchObject({
      agent: "a",
      instance: "inst",
      leaseToken: r.input.tokens[0],
      dispatchedAtNs: msToNs(5_000),
      leaseExpiresAtNs: msToNs(6_000),
    });

    const s2 = h.open("a", null, 5, open);
    const failed = h.reserve(rows(newItem()))!;
    failed.settle(undefined);
    expect(await h.close(s2)).toBeUndefined();
  });
});
