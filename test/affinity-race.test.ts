/**
 * The first claim of an unbound key, raced: two daemons on one schema, six agents (each on an HTTP/2
 * session of its own, three per daemon) claiming at once, many rounds with a fresh key each.
 *
 * In each round nobody completes anything until every racing claim has returned, and leases never
 * run out (the fake clock does not move), so every dispatch made during the race is still visible
 * afterwards as a dispatched row: if the dispatched items of the key then have one agent, no two
 * agents ever held items of the key at once. Then the holder (and, racing it, everybody else) keeps
 * claiming and completing until the key is drained.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { keyed, plain, Reader } from "./support/affinity.js";
import type { TestDb } from "./support/db.js";
import { useTestCluster } from "./support/kit.js";
import { Producer } from "./support/queue.js";
import { OpsTestAgent, show, type ItemInit, type WorkItem } from "./support/ops.js";

const clock = new FakeClock(Date.UTC(2026, 5, 1));
const fx = useTestCluster("affrace", {
  clock,
  instances: ["aff-race-a", "aff-race-b"],
  config: {
    sweepInterval: 3_600_000,
    heartbeatFlush: 3_600_000,
    heartbeatInterval: 86_400_000,
    leaseTtl: 86_400_000,
    affinityPolicy: "rebind",
  },
});
const closers = fx.closers;
let db: TestDb;
let A: Daemon;
let B: Daemon;
let agents: OpsTestAgent[];
let producer: Producer;
let reader: Reader;

const TENANT = "race";
const ROUNDS = 30;
const KEY_ITEMS = 12;
/** Enough items without a key that a claim never runs short of them in the race. */
const PLAIN_ITEMS = 30;
/** Racing claims per agent, and what each asks for (30 items in all: never more than PLAIN_ITEMS). */
const CLAIM_SIZES = [2, 3];
/** What each agent asks for while the queue drains. */
const DRAIN_CLAIM = 8;

beforeAll(async () => {
  db = fx.db;
  [A, B] = fx.daemons;
  const daemons = [A, B];
  agents = await Promise.all(
    Array.from({ length: 6 }, async (_, i) =>
      closers.add(await OpsTestAgent.register(daemons[i % 2]!.address, `racer-${i}`, { tenants: [TENANT], engineKinds: ["k"] })),
    ),
  );
  producer = closers.add(new Producer(A.address));
  reader = closers.add(await Reader.open(db));
});

const keyOf = (i: WorkItem) => i.workerParams?.affinityKey ?? "";

describe("racing first claims of one unbound key", () => {
  it(`${ROUNDS} rounds, 6 agents on 2 daemons: one binding per key, and every item of the key dispatched to and completed by its holder only`, async () => {
    /** Claims that returned fewer items than they asked for while items without a key were left: they picked items of the key and lost the binding race. */
    let lostRaces = 0;
    /** Of those, claims through the daemon the winner did not use. */
    let lostAcrossDaemons = 0;
    const daemonOf = (name: string) => Number(name.slice("racer-".length)) % 2;
    for (let round = 0; round < ROUNDS; round++) {
      const key = `race/${round}`;
      // Items of the key first (claims take them first), then the rest; the plain ones interleave too.
      const init: ItemInit[] = [];
      for (let i = 0; i < KEY_ITEMS; i++) init.push(keyed("k", key), ...(i % 3 === 2 ? [plain("k")] : []));
      while (init.length < KEY_ITEMS + PLAIN_ITEMS) init.push(plain("k"));
      const ids = await producer.ids(TENANT, init);
      const keyIds = new Set(ids.filter((_, i) => init[i]!.workerParams?.affinityKey === key));
      expect(keyIds.size).toBe(KEY_ITEMS);

      // The race: every agent's claims at once, nobody completing.
      const racing = agents.flatMap((a) => CLAIM_SIZES.map(async (max) => ({ a, max, res: await a.claimResponse(max) })));
      const settled = await Promise.all(racing);
      const held = new Map<OpsTestAgent, WorkItem[]>();
      const gotKey = new Set<string>();
      for (const { a, max, res } of settled) {
        held.set(a, [...(held.get(a) ?? []), ...res.items]);
        const mine = res.items.filter((i) => keyOf(i) === key);
        if (mine.length > 0) gotKey.add(a.name);
        expect(res.affinityKeys).toEqual(mine.length > 0 ? [key] : []);
        if (res.items.length < max) lostRaces++;
      }
      const short = settled.filter(({ max, res }) => res.items.length < max);

      const bindings = await reader.bindings(key);
      expect(bindings, `round ${round}`).toHaveLength(1);
      const holder = bindings[0]!.agent_id;
      lostAcrossDaemons += short.filter(({ a }) => daemonOf(a.name) !== daemonOf(holder)).length;
      const dispatched = await reader.items("affinity_key = $1 AND status = 'dispatched'", [key]);
      expect(dispatched.length, `round ${round}: no item of the key was dispatched`).toBeGreaterThan(0);
      expect([...new Set(dispatched.map((r) => r.agent_id))], `round ${round}`).toEqual([holder]);
      expect([...gotKey], `round ${round}: replies carrying items of the key`).toEqual([holder]);

      // Drain: everybody completes what it holds and keeps claiming (racing the holder) until every
      // item of the round is done; only the holder ever gets items of the key.
      const completedBy = new Map<string, string>();
      const finish = async (a: OpsTestAgent, items: WorkItem[]) => {
        if (items.length === 0) return;
        const outcomes = await a.complete(items);
        expect(
          outcomes.every((o) => o.ok),
          show(outcomes),
        ).toBe(true);
        for (const i of items) if (keyOf(i) === key) completedBy.set(i.id, a.name);
      };
      await Promise.all([...held].map(([a, items]) => finish(a, items)));
      for (let pass = 0; ; pass++) {
        expect(pass, `round ${round}: the queue did not drain`).toBeLessThan(50);
        const got = await Promise.all(agents.map(async (a) => ({ a, items: await a.claim(DRAIN_CLAIM) })));
        for (const { a, items } of got) {
          if (items.some((i) => keyOf(i) === key)) expect(a.name, `round ${round}: an item of the key went to another agent`).toBe(holder);
        }
        await Promise.all(got.map(({ a, items }) => finish(a, items)));
        if (got.every(({ items }) => items.length === 0)) break;
      }

      const rows = await reader.items("id = ANY($1)", [ids]);
      expect(
        rows.filter((r) => r.status !== "completed"),
        `round ${round}`,
      ).toEqual([]);
      const keyRows = rows.filter((r) => keyIds.has(r.id));
      expect(new Set(keyRows.map((r) => r.agent_id)), `round ${round}`).toEqual(new Set([holder]));
      expect([...new Set(completedBy.values())]).toEqual([holder]);
      expect(completedBy.size).toBe(KEY_ITEMS);
      expect(await reader.bindings(key)).toMatchObject([{ id: bindings[0]!.id, agent_id: holder }]);
    }
    // The race was real: claims did pick items of a key that another claim bound first.
    console.info(`affinity race: ${lostRaces} claims lost a binding race in ${ROUNDS} rounds, ${lostAcrossDaemons} of them on the other daemon`);
    expect(lostAcrossDaemons).toBeGreaterThan(0);
  }, 60_000);
});
