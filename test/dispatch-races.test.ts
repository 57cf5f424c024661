/**
 * Resource placement and concurrency keys raced across two daemons on one schema, every agent on an
 * HTTP/2 session of its own, while a reader samples the table continuously:
 *   - thousands of items over a few concurrency keys, claimed and completed by agents on both
 *     daemons: no sample ever shows more of a key dispatched than its limit, and the limit is reached;
 *   - one GPU agent claiming through both daemons at once (two sessions, one name): no sample ever
 *     shows more of a GPU's memory reserved than the GPU has, and both GPUs are used;
 *   - every path that ends a dispatch (complete, fail, release, lease expiry, the agent going
 *     inactive, a drain's deadline, cancel) gives back the key's slot and the GPU's memory: the
 *     next item needing both is dispatched at once.
 * A sample is one statement, so it sees one committed state of the whole table.
 */
import pg from "pg";
import { beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import type { TestDb } from "./support/db.js";
import { useTestCluster } from "./support/kit.js";
import { Producer, TestAgent, type WorkItem } from "./support/queue.js";
import { opsSession } from "./support/ops.js";
import { bearer, TOKENS } from "./support/daemon.js";
import { durationFromMs } from "@bufbuild/protobuf/wkt";

const clock = new FakeClock(Date.UTC(2026, 6, 1));
const LEASE = 60_000;
const fx = useTestCluster("dispatchrace", {
  clock,
  instances: ["race-a", "race-b"],
  config: {
    sweepInterval: 3_600_000,
    heartbeatFlush: 3_600_000,
    heartbeatInterval: 86_400_000,
    livenessIntervals: 3,
    leaseTtl: LEASE,
    claimMaxItems: 8,
  },
});
const closers = fx.closers;
let db: TestDb;
let A: Daemon;
let B: Daemon;
let producer: Producer;

beforeAll(async () => {
  db = fx.db;
  [A, B] = fx.daemons;
  producer = closers.add(new Producer(A.address));
});

/** Samples `query` (one row per group, its count in `n`) until stopped; the largest `n` seen per group. */
class Sampler {
  readonly #c: pg.Client;
  #stop = false;
  #done: Promise<void> | undefined;
  samples = 0;
  readonly most = new Map<string, number>();

  private constructor(c: pg.Client) {
    this.#c = c;
  }

  static async start(query: string, values: unknown[]): Promise<Sampler> {
    const c = new pg.Client({ connectionString: db.url });
    await c.connect();
    const s = new Sampler(c);
    s.#done = (async () => {
      while (!s.#stop) {
        const res = await c.query<{ g: string; n: string }>(query, values);
        s.samples++;
        for (const r of res.rows) s.most.set(r.g, Math.max(s.most.get(r.g) ?? 0, Number(r.n)));
      }
    })();
    return s;
  }

  async stop(): Promise<void> {
    this.#stop = true;
    await this.#done;
    await this.#c.end();
  }
}

/** Claims (carrying the completions of what it took last) until `done` holds. */
async function churn(a: TestAgent, max: number, done: () => boolean): Promise<number> {
  let held: WorkItem[] = [];
  let took = 0;
  while (!done()) {
    const res = await a.claimCompleting(max, held);
    held = res.items;
    took += held.length;
  }
  if (held.length > 0) await a.complete(held);
  return took;
}

const work = () => db.tables.qualified("work_item");

describe("concurrency keys, raced", () => {
  it("2,400 items over 8 keys of limit 3, 8 agents on 2 daemons: never more than 3 of a key in flight, and 3 reached", async () => {
    const t = "race-keys";
    const KEYS = 8;
    const LIMIT = 3;
    const ITEMS = 2_400;
    const agents = await Promise.all(
      Array.from({ length: 8 }, async (_, i) =>
        closers.add(await TestAgent.register((i % 2 ? B : A).address, `keys-${i}`, { tenants: [t], engineKinds: ["k"], slots: 8 })),
      ),
    );
    for (let start = 0; start < ITEMS; start += 400)
      await producer.enqueue(
        t,
        Array.from({ length: 400 }, (_, i) => ({ engineKind: "k", workerParams: { concurrencyKey: `key-${(start + i) % KEYS}`, maxInFlight: LIMIT } })),
      );
    const sampler = await Sampler.start(
      `SELECT concurrency_key AS g, count(*) AS n FROM ${work()} WHERE tenant_key = $1 AND status = 'dispatched' GROUP BY 1`,
      [t],
    );
    const counter = new pg.Client({ connectionString: db.url });
    await counter.connect();
    let left = ITEMS;
    const watch = (async () => {
      while (left > 0)
        left = Number((await counter.query(`SELECT count(*) AS n FROM ${work()} WHERE tenant_key = $1 AND status <> 'completed'`, [t])).rows[0].n);
    })();
    const took = await Promise.all(agents.map((a) => churn(a, 4, () => left === 0)));
    await watch;
    await counter.end();
    await sampler.stop();
    expect(took.reduce((x, y) => x + y, 0)).toBe(ITEMS);
    expect(sampler.samples).toBeGreaterThan(10);
    expect(Math.max(...sampler.most.values())).toBe(LIMIT);
    const byDaemon = await fx.db.raw<{ leased_by: string; n: number }>(
      `SELECT leased_by, count(*)::int AS n FROM ${work()} WHERE tenant_key = $1 GROUP BY 1 ORDER BY 1`,
      [t],
    );
    expect(byDaemon.map((r) => r.leased_by)).toEqual(["race-a", "race-b"]);
  }, 180_000);
});

const GB = 1024;
const MiB = 1024n * 1024n;
const gpuMetrics = (sizes: number[]) => ({
  cpuUtilization: 0,
  memoryUsedBytes: 0n,
  memoryTotalBytes: 64n * 1024n * MiB,
  disks: [{ mount: "/work", freeBytes: 100n * 1024n * MiB, totalBytes: 100n * 1024n * MiB }],
  gpus: sizes.map((gb, index) => ({ index, model: "sim", utilization: 0, memoryUsedBytes: 0n, memoryTotalBytes: BigInt(gb) * 1024n * MiB })),
});
const capacity = (sizes: number[]) => ({
  cpuMillis: 8000n,
  memoryMb: BigInt(64 * GB),
  gpus: sizes.map((gb, index) => ({ index, model: "sim", memoryMb: BigInt(gb * GB) })),
  disks: [{ mount: "/work", sizeMb: BigInt(100 * GB) }],
});

/** One agent name on a session to each daemon, its capacity registered and a heartbeat written. */
async function gpuAgent(name: string, tenant: string, sizes: number[]): Promise<[TestAgent, TestAgent]> {
  const spec = { tenants: [tenant], engineKinds: ["k"], slots: 16, capacity: capacity(sizes) };
  const onA = closers.add(await TestAgent.register(A.address, name, spec));
  const onB = closers.add(await TestAgent.register(B.address, name, spec));
  await onA.heartbeat(gpuMetrics(sizes));
  await A.maintenance.flushHeartbeats();
  return [onA, onB];
}

describe("GPU memory, raced", () => {
  it("one agent claiming through 2 daemons at once: a GPU's reservations never pass its memory, and every GPU is used", async () => {
    const t = "race-gpu";
    const sizes = [80, 40];
    const [onA, onB] = await gpuAgent("gpu-racer", t, sizes);
    const ITEMS = 600;
    await producer.enqueue(
      t,
      Array.from({ length: ITEMS }, () => ({ engineKind: "k", workerParams: { requirements: { gpus: 1, gpuMemoryMb: BigInt(30 * GB) } } })),
    );
    const sampler = await Sampler.start(
      `SELECT g::text AS g, sum((worker_params -> 'requirements' ->> 'gpuMemoryMb')::int8) AS n
         FROM ${work()}, unnest(gpu_indices) g WHERE tenant_key = $1 AND status = 'dispatched' GROUP BY 1`,
      [t],
    );
    let finished = 0;
    const done = () => finished >= ITEMS;
    const churnCounting = async (a: TestAgent) => {
      let held: WorkItem[] = [];
      while (!done()) {
        const res = await a.claimCompleting(4, held);
        finished += res.completionOutcomes.filter((o) => o.ok).length;
        held = res.items;
      }
    };
    await Promise.all([churnCounting(onA), churnCounting(onB), churnCounting(onA), churnCounting(onB)]);
    await sampler.stop();
    expect(sampler.samples).toBeGreaterThan(10);
    expect(sampler.most.get("0")).toBeLessThanOrEqual(80 * GB);
    expect(sampler.most.get("1")).toBeLessThanOrEqual(40 * GB);
    // Both GPUs held work, the larger one two items at once.
    expect(sampler.most.get("0")).toBe(60 * GB);
    expect(sampler.most.get("1")).toBe(30 * GB);
  }, 180_000);
});

describe("every end of a dispatch gives back what it reserved", () => {
  it("complete, fail, release, lease expiry, the agent going inactive, a drain's deadline and cancel each free the GPU and the key's slot", async () => {
    const t = "race-ends";
    let [agent] = await gpuAgent("ender", t, [48]);
    const ops = closers.add(opsSession(A.address));
    const fresh = async () => {
      clock.advance(1);
      await agent.heartbeat(gpuMetrics([48]));
      await A.maintenance.flushHeartbeats();
    };
    // Each item needs the whole of what is free: 40 of 48 GB, and the key's only slot.
    const item = { engineKind: "k", workerParams: { requirements: { gpus: 1, gpuMemoryMb: BigInt(40 * GB) }, concurrencyKey: "solo", maxInFlight: 1 } };
    const claimOne = async (a: TestAgent): Promise<WorkItem> => {
      const got = await a.claim(4);
      expect(got).toHaveLength(1);
      return got[0]!;
    };
    await producer.enqueue(t, [item, item]);
    let held = await claimOne(agent);
    // The second waits: the GPU and the key are taken.
    expect(await agent.claim(4)).toEqual([]);

    const ends: [string, (i: WorkItem) => Promise<unknown>][] = [
      ["complete", (i) => agent.complete([i])],
      ["fail", (i) => agent.fail([i], { retryable: false })],
      ["release", (i) => agent.release([i])],
      [
        "lease expiry",
        async () => {
          clock.advance(LEASE + 1);
          await agent.heartbeat(gpuMetrics([48]));
          await A.maintenance.flushHeartbeats();
          await A.maintenance.runOnce();
        },
      ],
      [
        "the agent going inactive",
        async () => {
          await agent.conn.agent.deregister({ name: agent.name }, { headers: bearer(TOKENS.agent) });
          agent = closers.add(await TestAgent.register(A.address, agent.name, { tenants: [t], engineKinds: ["k"], slots: 16, capacity: capacity([48]) }));
          await fresh();
        },
      ],
      [
        "a drain's deadline",
        async () => {
          await ops.client.drainAgent({ name: agent.name, deadline: durationFromMs(1_000), reason: "deploy" }, ops.call);
          clock.advance(1_001);
          await A.maintenance.runOnce();
          await ops.client.undrainAgent({ name: agent.name }, ops.call);
          await fresh();
        },
      ],
      ["cancel", (i) => producer.cancel(t, [i.id])],
    ];
    for (const [how, end] of ends) {
      await end(held);
      await producer.enqueue(t, [item]);
      held = await claimOne(agent).catch((e: unknown) => {
        throw new Error(`after ${how}: ${String(e)}`);
      });
      expect(await agent.claim(4), `after ${how}`).toEqual([]);
    }
  });
});
