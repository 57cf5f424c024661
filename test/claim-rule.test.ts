/**
 * The claim rule (src/store/work-items/claim-rule.ts) as the claim and the insert's direct dispatch
 * each apply it. For every case the same new item meets the same agent and queue three times: offered
 * by the insert straight to a claim of the agent, offered through a waiting claim's slot
 * (WaitingClaims), and inserted pending and then claimed. A row handed over either way must be one
 * the claim takes; and where neither the insert nor the offer simplifies (the row has no affinity key,
 * and no item of its tenant and kind that this agent cannot take is ahead of it), a row is handed
 * over exactly when the claim takes it. The offer also leaves rows with worker params to the claim.
 */
import pg from "pg";
import { afterAll, beforeAll, expect, it } from "vitest";
import { msToNs } from "../src/clock.js";
import { PreparedQueries } from "../src/db/prepared.js";
import { WaitingClaims } from "../src/queue/waiting-claims.js";
import type { Armed } from "../src/queue/wakeups.js";
import { workKey } from "../src/queue/work-keys.js";
import { WorkItemStore, type HandoffInput, type NewItem } from "../src/store/work-items.js";
import { createTestDb, type TestDb } from "./support/db.js";
import { newItem } from "./support/queue.js";

const NOW = Date.UTC(2026, 0, 1);
const LEASE = 30_000;
const GRACE = 60_000;
const TAGS = { gpu: "a100" };

type AgentState = "active" | "draining" | "inactive" | "deleted";
type Scope = "serves" | "other tenant" | "other kind" | "no lists";
type Params = "none" | "params only" | "selector matched" | "selector unmatched";
type Key = "none" | "unbound" | "bound to it" | "bound to a working agent" | "movable";
type Ahead = "none" | "higher priority" | "same priority" | "lower priority" | "another tenant" | "one it cannot take";

interface Case {
  state: AgentState;
  scope: Scope;
  params: Params;
  due: boolean;
  key: Key;
  ahead: Ahead;
}

const METADATA: Record<Scope, object> = {
  serves: { tenants: ["t"], engineKinds: ["k"], tags: TAGS },
  "other tenant": { tenants: ["u"], engineKinds: ["k"], tags: TAGS },
  "other kind": { tenants: ["t"], engineKinds: ["j"], tags: TAGS },
  "no lists": { tags: TAGS },
};
const WORKER_PARAMS: Record<Params, Record<string, unknown> | null> = {
  none: null,
  "params only": { retries: 1 },
  "selector matched": { selector: { gpu: "a100" } },
  "selector unmatched": { selector: { gpu: "h100" } },
};

let db: TestDb;
let hot: PreparedQueries;
let store: WorkItemStore;
let client: pg.Client;
beforeAll(async () => {
  db = await createTestDb({ label: "crule" });
  hot = new PreparedQueries(db.url, 2);
  store = new WorkItemStore(db.pool, db.tables, { baseMs: 1000, capMs: 60_000, jitter: false }, hot);
  client = new pg.Client({ connectionString: db.url });
  await client.connect();
});
afterAll(async () => {
  await client?.end();
  await hot?.end();
  await db?.drop();
});

const table = (name: "agent" | "work_item" | "affinity_binding") => db.tables.qualified(name);

/** The case's agent "a", its key's binding and the item ahead of the new one; the queue empty otherwise. */
async function arrange(c: Case): Promise<void> {
  await client.query(`DELETE FROM ${table("work_item")}; DELETE FROM ${table("affinity_binding")}; DELETE FROM ${table("agent")}`);
  const status = c.state === "deleted" ? "active" : c.state;
  await client.query(
    `INSERT INTO ${table("agent")} (id, name, status, metadata, createdby, createdon, deletedon)
     VALUES ('A1', 'a', $1, $2, 'test', now(), CASE WHEN $3 THEN now() END),
            ('B1', 'b', $4, '{"tenants":["t"],"engineKinds":["k"]}', 'test', now(), NULL)`,
    [status, JSON.stringify(METADATA[c.scope]), c.state === "deleted", c.key === "movable" ? "inactive" : "active"],
  );
  if (c.key === "bound to it" || c.key === "bound to a working agent" || c.key === "movable") {
    await client.query(
      `INSERT INTO ${table("affinity_binding")} (id, tenant_key, affinity_key, agent_id, createdby, createdon, updatedby, updatedon)
       VALUES ('K1', 't', 'key', $1, 'test', $2, 'test', $2)`,
      [c.key === "bound to it" ? "a" : "b", new Date(NOW - 2 * GRACE)],
    );
  }
  const ahead: Partial<NewItem> | undefined = {
    none: undefined,
    "higher priority": { priority: -1 },
    "same priority": { priority: 0 },
    "lower priority": { priority: 1 },
    "another tenant": { priority: -1 },
    "one it cannot take": { priority: -1, workerParams: { selector: { gpu: "h100" } } },
  }[c.ahead];
  if (ahead)
    await store.enqueueRows(WorkItemStore.rows(c.ahead === "another tenant" ? "u" : "t", "e", [newItem({ engineKind: "k", ...ahead })], NOW - 1000, "test"));
}

/** The case's new item. */
const item = (c: Case): NewItem =>
  newItem({
    engineKind: "k",
    workerParams: WORKER_PARAMS[c.params],
    notBeforeNs: msToNs(c.due ? NOW : NOW + 60_000),
    affinityKey: c.key === "none" ? null : "key",
  });

/** Inserted pending, then claimed by "a" (one item): whether the claim took it. */
async function claimed(c: Case): Promise<boolean> {
  await arrange(c);
  const [row] = WorkItemStore.rows("t", "e", [item(c)], NOW, "test");
  await store.enqueueRows([row!]);
  const { claimed } = await store.claim({
    agent: "a",
    instance: "test",
    max: 1,
    nowMs: NOW,
    leaseTtlMs: LEASE,
    affinity: { policy: "rebind", graceMs: GRACE },
    bindingSeed: "01KB0000000000000000000000",
    liveEdgeMs: 0,
    leaseToken: "claim-token",
  });
  return claimed.some((r) => r.id === row!.id);
}

/** Offered by the insert to a claim of "a", directly or (`viaSlot`) by a waiting claim's slot: whether it went in handed over. */
async function handed(c: Case, viaSlot: boolean): Promise<boolean> {
  await arrange(c);
  const rows = WorkItemStore.rows("t", "e", [item(c)], NOW, "test");
  let input: HandoffInput | undefined = { agents: ["a"], tokens: ["hand-token"], instance: "test", nowMs: NOW, leaseTtlMs: LEASE };
  if (viaSlot) {
    // The slot's keys as a claim of "a" would wait on them: its tenants × engine kinds.
    const m = METADATA[c.scope] as { tenants?: string[]; engineKinds?: string[] };
    const keys = new Set((m.tenants ?? []).flatMap((t) => (m.engineKinds ?? []).map((k) => workKey(t, k))));
    const waiting = new WaitingClaims("test", LEASE, () => NOW);
    waiting.open("a", keys, 1, { disarm: () => {}, wait: async () => false, setCapacity: () => {} } satisfies Armed);
    input = waiting.reserve(rows)?.input;
    if (!input) return false;
  }
  const [result] = await store.enqueueRows(rows, input);
  return result!.claimed !== undefined;
}

/** Cases where the insert refuses what the claim may take: a key (binding writes), or an item ahead the agent would pass over. */
const insertSimplifies = (c: Case) => c.key !== "none" || c.ahead === "one it cannot take";
/** Cases the offer leaves to the claim besides: rows with worker params. */
const offerSimplifies = (c: Case) => insertSimplifies(c) || c.params !== "none";

const cases: Case[] = [];
for (const state of ["active", "draining", "inactive", "deleted"] as const)
  for (const scope of ["serves", "other tenant", "other kind", "no lists"] as const)
    for (const params of ["none", "params only", "selector matched", "selector unmatched"] as const)
      for (const due of [true, false]) cases.push({ state, scope, params, due, key: "none", ahead: "none" });
for (const key of ["none", "unbound", "bound to it", "bound to a working agent", "movable"] as const)
  for (const ahead of ["none", "higher priority", "same priority", "lower priority", "another tenant", "one it cannot take"] as const)
    for (const params of ["none", "selector matched"] as const)
      if (key !== "none" || ahead !== "none") cases.push({ state: "active", scope: "serves", params, due: true, key, ahead });

const label = (c: Case) => `${c.state}, ${c.scope}, params ${c.params}, ${c.due ? "due" : "not due"}, key ${c.key}, ahead ${c.ahead}`;

it("hands a new row to a waiting claim only when the claim would take it, and exactly then where the insert does not simplify", {
  timeout: 120_000,
}, async () => {
  const wrong: string[] = [];
  let takes = 0;
  for (const c of cases) {
    const [claim, insert, offer] = [await claimed(c), await handed(c, false), await handed(c, true)];
    if (claim) takes++;
    if (insert && !claim) wrong.push(`insert hands over what the claim does not take: ${label(c)}`);
    if (offer && !claim) wrong.push(`offer hands over what the claim does not take: ${label(c)}`);
    if (!insertSimplifies(c) && insert !== claim)
      wrong.push(`insert ${insert ? "hands over" : "refuses"}, claim ${claim ? "takes" : "does not take"}: ${label(c)}`);
    if (!offerSimplifies(c) && offer !== claim)
      wrong.push(`offer ${offer ? "hands over" : "refuses"}, claim ${claim ? "takes" : "does not take"}: ${label(c)}`);
  }
  expect(wrong).toEqual([]);
  // The cases reach both answers of every term, so a term one side dropped shows above.
  expect(takes).toBeGreaterThan(10);
  expect(takes).toBeLessThan(cases.length - 10);
});

it("keeps back a row of an offered batch that another row of the batch, left to the claim, comes first for", async () => {
  const base: Case = { state: "active", scope: "serves", params: "none", due: true, key: "none", ahead: "none" };
  const wrong: string[] = [];
  for (const other of [{ params: "selector matched" as const }, { key: "unbound" as const }, { due: false }])
    for (const priority of [-1, 0, 1])
      for (const otherFirst of [true, false]) {
        const left = { ...item({ ...base, ...other }), priority };
        const batch = (nowMs: number) => {
          const rows = WorkItemStore.rows("t", "e", otherFirst ? [left, item(base)] : [item(base), left], nowMs, "test");
          return { rows, plain: rows[otherFirst ? 1 : 0]! };
        };
        await arrange(base);
        const { rows, plain } = batch(NOW);
        const waiting = new WaitingClaims("test", LEASE, () => NOW);
        waiting.open("a", new Set([workKey("t", "k")]), 1, { disarm: () => {}, wait: async () => false, setCapacity: () => {} } satisfies Armed);
        const input = waiting.reserve(rows)?.input;
        const offer = input ? (await store.enqueueRows(rows, input)).some((r) => r.id === plain.id && r.claimed) : false;
        await arrange(base);
        const pending = batch(NOW);
        await store.enqueueRows(pending.rows);
        const took = await store.claim({
          agent: "a",
          instance: "test",
          max: 1,
          nowMs: NOW,
          leaseTtlMs: LEASE,
          affinity: { policy: "rebind", graceMs: GRACE },
          bindingSeed: "01KB0000000000000000000000",
          liveEdgeMs: 0,
          leaseToken: "claim-token",
        });
        const claim = took.claimed.some((r) => r.id === pending.plain.id);
        const what = `${JSON.stringify(other)} at priority ${priority}, ${otherFirst ? "before" : "after"} the plain row`;
        if (offer && !claim) wrong.push(`offer hands over what the claim does not take: ${what}`);
        // Arrived first, the row left to the claim comes first at the same priority; arrived after, the
        // offer keeps the plain row back anyway (comesFirst asks priorities alone).
        if (otherFirst && offer !== claim) wrong.push(`offer ${offer ? "hands over" : "refuses"}, claim ${claim ? "takes" : "does not take"}: ${what}`);
      }
  expect(wrong).toEqual([]);
});
