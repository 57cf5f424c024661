/**
 * Every multi-row write on the queue takes its row locks in one order (by id), so that two writes
 * of one agent's items never wait on each other in a cycle (Postgres would kill one as a deadlock,
 * and its call would fail). Raced here on two daemons over real connections: lease extensions in
 * ascending id order against extensions in descending order, and against claims carrying
 * completions of the same items, each sent in the opposite order.
 */
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { captureLog } from "./support/agents.js";
import { useTestCluster } from "./support/kit.js";
import { Producer, TestAgent, type WorkItem } from "./support/queue.js";

const logA = captureLog("warn");
const logB = captureLog("warn");
const f = useTestCluster("lockorder", { instances: ["lock-a", "lock-b"], log: (id) => (id === "lock-a" ? logA : logB).log });
let a: Daemon;
let b: Daemon;

const TENANT = "t1";
const N = 240;

beforeAll(() => {
  [a, b] = f.daemons;
});

/** An agent registered on daemon A, holding N items, and a second connection to it through daemon B. */
async function holding(name: string): Promise<{ viaA: TestAgent; viaB: TestAgent; items: WorkItem[] }> {
  const viaA = f.closers.add(await TestAgent.register(a.address, name, { tenants: [TENANT], engineKinds: [name], slots: N }));
  const viaB = f.closers.add(await TestAgent.register(b.address, name, { tenants: [TENANT], engineKinds: [name], slots: N }));
  const producer = f.closers.add(new Producer(a.address));
  await producer.enqueue(
    TENANT,
    Array.from({ length: N }, () => ({ engineKind: name, payloadJson: "{}" })),
  );
  const items: WorkItem[] = [];
  while (items.length < N) items.push(...(await viaA.claim(N - items.length)));
  items.sort((x, y) => (x.id < y.id ? -1 : 1));
  return { viaA, viaB, items };
}

const lease = (i: WorkItem) => ({ id: i.id, leaseToken: i.leaseToken });
const outcomesOk = (outcomes: readonly { ok: boolean }[]) => outcomes.every((o) => o.ok);
const problems = () => [...logA.lines(), ...logB.lines()].filter((l) => (l.level as number) >= 40);

describe("lock order", () => {
  it("lease extensions of the same items in opposite orders, raced on two daemons, all succeed", async () => {
    const { viaA, viaB, items } = await holding("lock-extend");
    const up = items.map(lease);
    const down = [...up].reverse();
    for (let round = 0; round < 15; round++) {
      const [x, y] = await Promise.all([viaA.extend(up), viaB.extend(down)]);
      expect(outcomesOk(x.outcomes) && outcomesOk(y.outcomes)).toBe(true);
    }
    expect(problems()).toEqual([]);
  });

  it("claims carrying completions against lease extensions of the same items, in opposite orders, all succeed", async () => {
    const { viaA, viaB, items } = await holding("lock-complete");
    const chunks = 6;
    const size = N / chunks;
    for (let c = 0; c < chunks; c++) {
      // The chunk still held, and the extension of everything still held (the chunk among them).
      const chunk = items.slice(c * size, (c + 1) * size).map(lease);
      const held = items.slice(c * size).map(lease);
      const [claim, ext] = await Promise.all([viaA.claimCompleting(0, [...chunk].reverse(), { result: { c } }), viaB.extend(held)]);
      expect(outcomesOk(claim.completionOutcomes)).toBe(true);
      // An extension that ran after the completion finds the chunk completed: those are refused, nothing else.
      const refused = ext.outcomes.filter((o) => !o.ok).map((o) => o.workItemId);
      expect(refused.every((id) => chunk.some((l) => l.id === id))).toBe(true);
    }
    expect(problems()).toEqual([]);
  });
});
