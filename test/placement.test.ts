/**
 * Dispatch that fits work to the agent: items that state requirements go only to an agent whose
 * free resources (registered capacity less what its in-flight items reserve, capped by its latest
 * heartbeat) hold them, on the GPUs the claim names; concurrency keys hold a key's items in flight
 * to its limit. Agents here simulate their GPUs: they register the capacity and heartbeat the
 * metrics, no GPU needed.
 *
 * On the daemon of test/support/queue-daemon.ts: one daemon, a fake clock, heartbeat flushes run by
 * the tests.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { beforeAll, describe, expect, it } from "vitest";
import type { AgentMetricsSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import type { RequirementsSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import type { Daemon } from "../src/daemon.js";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { unplaceableTask } from "../src/fleet/unplaceable-work-sweep.js";
import { silentLogger } from "../src/log.js";
import { AgentStore } from "../src/store/agents.js";
import { WorkItemStatsStore } from "../src/store/work-item-stats.js";
import { codeOf } from "./support/kit.js";
import { opsSession } from "./support/ops.js";
import { serverNow, STATEMENT, track, untilStatementRan, type Producer, type TestAgent } from "./support/queue.js";
import { CLAIM_MAX_WAIT, LIVENESS, ids, useQueueDaemon } from "./support/queue-daemon.js";

const fx = useQueueDaemon("placement");
const { clock } = fx;
let daemon: Daemon, p: Producer;
beforeAll(() => void ({ daemon, p } = fx));

const GB = 1024;
const MiB = 1024n * 1024n;
type Need = MessageInitShape<typeof RequirementsSchema>;

interface Box {
  gpus: number[];
  /** GB used per GPU as the heartbeat reports it (default none). */
  used?: number[];
  cpuMillis?: number;
  memoryGb?: number;
  disks?: { mount: string; gb: number }[];
}

const metricsOf = (b: Box): MessageInitShape<typeof AgentMetricsSchema> => ({
  cpuUtilization: 0,
  memoryUsedBytes: 0n,
  memoryTotalBytes: BigInt(b.memoryGb ?? 64) * 1024n * MiB,
  disks: (b.disks ?? [{ mount: "/work", gb: 100 }]).map((d) => ({
    mount: d.mount,
    freeBytes: BigInt(d.gb) * 1024n * MiB,
    totalBytes: BigInt(d.gb) * 1024n * MiB,
  })),
  gpus: b.gpus.map((gb, index) => ({
    index,
    model: "NVIDIA A100-SXM4",
    utilization: 0,
    memoryUsedBytes: BigInt(b.used?.[index] ?? 0) * 1024n * MiB,
    memoryTotalBytes: BigInt(gb) * 1024n * MiB,
  })),
});

/** An agent with simulated GPUs (GB each, by index), its capacity registered and a fresh heartbeat written. */
async function box(name: string, tenant: string, b: Box): Promise<TestAgent> {
  const a = await fx.agent(name, {
    tenants: [tenant],
    slots: 8,
    capacity: {
      cpuMillis: BigInt(b.cpuMillis ?? 8000),
      memoryMb: BigInt((b.memoryGb ?? 64) * GB),
      gpus: b.gpus.map((gb, index) => ({ index, model: "NVIDIA A100-SXM4", memoryMb: BigInt(gb * GB) })),
      disks: (b.disks ?? [{ mount: "/work", gb: 100 }]).map((d) => ({ mount: d.mount, sizeMb: BigInt(d.gb * GB) })),
    },
  });
  await beat(a, b);
  return a;
}

async function beat(a: TestAgent, b: Box): Promise<void> {
  await a.heartbeat(metricsOf(b));
  await daemon.maintenance.flushHeartbeats();
}

const needing = (requirements: Need, extra: Record<string, unknown> = {}) => ({ engineKind: "dag", workerParams: { requirements }, ...extra });
const gpuGb = (gpus: number, gb: number): Need => ({ gpus, gpuMemoryMb: BigInt(gb * GB) });

describe("GPU placement", () => {
  it("gives a 40 GB job only to an agent with 40 GB free on one GPU, names that GPU, and uses the memory again once it ends", async () => {
    const t = "place-40";
    const small = await box("place-40-small", t, { gpus: [24, 24] });
    const big = await box("place-40-big", t, { gpus: [16, 48] });
    const first = await p.one(t, needing(gpuGb(1, 40)));
    expect(await small.claim(5)).toEqual([]);
    const [job] = await big.claim(5);
    expect(job).toMatchObject({ id: first, gpuIndices: [1] });
    expect(job!.workerParams?.requirements?.gpuMemoryMb).toBe(BigInt(40 * GB));
    const second = await p.one(t, needing(gpuGb(1, 40)));
    // 8 GB is left on GPU 1, and 16 on GPU 0.
    expect(await big.claim(5)).toEqual([]);
    expect(await small.claim(5)).toEqual([]);
    await big.complete([job!]);
    const [next] = await big.claim(5);
    expect(next).toMatchObject({ id: second, gpuIndices: [1] });
    expect((await p.item(t, second)).gpuIndices).toEqual([1]);
  });

  it("reuses what the completions a claim carries give back, in the same statement", async () => {
    const t = "place-reuse";
    const a = await box("place-reuse-a", t, { gpus: [48] });
    const keyed = { concurrencyKey: "one", maxInFlight: 1 };
    const [x, y] = await p.enqueue(t, [
      needing(gpuGb(1, 40), { workerParams: { requirements: gpuGb(1, 40), ...keyed } }),
      needing(gpuGb(1, 40), { workerParams: { requirements: gpuGb(1, 40), ...keyed } }),
    ]);
    const [held] = await a.claim(5);
    expect(held!.id).toBe(x!.id);
    const res = await a.claimCompleting(5, [held!]);
    expect(res.completionOutcomes.map((o) => o.ok)).toEqual([true]);
    expect(ids(res.items)).toEqual([y!.id]);
  });

  it("shares a GPU between items only within its memory, each on the GPU with the least room that holds it", async () => {
    const t = "place-share";
    const a = await box("place-share-a", t, { gpus: [24, 48] });
    const [x, y, z, w] = await p.enqueue(t, [needing(gpuGb(1, 20)), needing(gpuGb(1, 20)), needing(gpuGb(1, 20)), needing(gpuGb(1, 20))]);
    const got = await a.claim(5);
    expect(got.map((i) => [i.id, i.gpuIndices])).toEqual([
      [x!.id, [0]],
      [y!.id, [1]],
      [z!.id, [1]],
    ]);
    // 4 GB is left on GPU 0 and 8 on GPU 1: the fourth waits.
    expect((await p.item(t, w!.id)).status).toBe(WorkItemStatus.PENDING);
  });

  it("places a many-GPU item on distinct GPUs, and an item that names no memory takes each of its GPUs whole", async () => {
    const t = "place-whole";
    const a = await box("place-whole-a", t, { gpus: [24, 24, 24] });
    const [pair] = await p.enqueue(t, [needing({ gpus: 2 })]);
    const [got] = await a.claim(5);
    expect(got!.id).toBe(pair!.id);
    expect(got!.gpuIndices).toHaveLength(2);
    const rest = [0, 1, 2].filter((g) => !got!.gpuIndices.includes(g));
    const [slice] = await p.enqueue(t, [needing(gpuGb(1, 1))]);
    expect((await a.claim(5)).map((i) => [i.id, i.gpuIndices])).toEqual([[slice!.id, rest]]);
    // No GPU is unreserved now: a whole-GPU item waits even though 23 GB are free on one.
    await p.enqueue(t, [needing({ gpus: 1 })]);
    expect(await a.claim(5)).toEqual([]);
  });

  it("matches the GPU model by a part of its name, ignoring case", async () => {
    const t = "place-model";
    const a = await box("place-model-a", t, { gpus: [80] });
    await p.enqueue(t, [needing({ gpus: 1, gpuModel: "h100" })]);
    expect(await a.claim(5)).toEqual([]);
    const [ok] = await p.enqueue(t, [needing({ gpus: 1, gpuModel: "a100" })]);
    expect(ids(await a.claim(5))).toEqual([ok!.id]);
  });
});

describe("what the heartbeat says", () => {
  it("grants no more than the heartbeat reports free: memory something else uses is not given out", async () => {
    const t = "place-hb";
    const spec: Box = { gpus: [48], used: [40] };
    const a = await box("place-hb-a", t, spec);
    const [item] = await p.enqueue(t, [needing(gpuGb(1, 20))]);
    expect(await a.claim(5)).toEqual([]);
    await beat(a, { gpus: [48], used: [0] });
    expect(ids(await a.claim(5))).toEqual([item!.id]);
  });

  it("counts an item the heartbeat has seen start once, not twice: what it uses and what it reserves are the same memory", async () => {
    const t = "place-seen";
    const a = await box("place-seen-a", t, { gpus: [48] });
    const [one, two] = await p.enqueue(t, [needing(gpuGb(1, 20)), needing(gpuGb(1, 20))]);
    expect(ids(await a.claim(1))).toEqual([one!.id]);
    clock.advance(1);
    // The first item now uses its 20 GB, as a heartbeat after its start reports.
    await beat(a, { gpus: [48], used: [20] });
    expect(ids(await a.claim(5))).toEqual([two!.id]);
  });

  it("wakes a claim that waited before the agent's first heartbeat was written, once it is", async () => {
    const t = "place-first";
    const a = await fx.agent("place-first-a", {
      tenants: [t],
      slots: 8,
      capacity: { cpuMillis: 8000n, memoryMb: BigInt(64 * GB), gpus: [{ index: 0, model: "sim", memoryMb: BigInt(48 * GB) }], disks: [] },
    });
    const [item] = await p.enqueue(t, [needing(gpuGb(1, 8))]);
    const t0 = await serverNow(fx.db);
    const waiting = track(a.claim(5, CLAIM_MAX_WAIT));
    await untilStatementRan(fx.db, STATEMENT.claim, t0);
    expect(waiting.settled()).toBe(false);
    // Nothing wakes it but the write of the agent's first beat (the wait outlasts the test).
    await beat(a, { gpus: [48] });
    expect(ids(await waiting.promise)).toEqual([item!.id]);
  });

  it("places nothing by a heartbeat older than the liveness window, while plain work still flows", async () => {
    const t = "place-stale";
    const a = await box("place-stale-a", t, { gpus: [48] });
    clock.advance(LIVENESS + 1);
    const [gpu, plain] = await p.enqueue(t, [needing(gpuGb(1, 8)), { engineKind: "dag", priority: 1 }]);
    expect(ids(await a.claim(5))).toEqual([plain!.id]);
    await beat(a, { gpus: [48] });
    expect(ids(await a.claim(5))).toEqual([gpu!.id]);
  });
});

describe("CPU, memory and disk", () => {
  it("holds CPU, memory and disk to what the agent has free, with disk on the named mount or the first one", async () => {
    const t = "place-cpu";
    const a = await box("place-cpu-a", t, {
      gpus: [],
      cpuMillis: 4000,
      memoryGb: 16,
      disks: [
        { mount: "/work", gb: 50 },
        { mount: "/scratch", gb: 500 },
      ],
    });
    const [c1, c2] = await p.enqueue(t, [needing({ cpuMillis: 3000n }), needing({ cpuMillis: 3000n })]);
    expect(ids(await a.claim(5))).toEqual([c1!.id]);
    const [m1] = await p.enqueue(t, [needing({ memoryMb: BigInt(20 * GB) })]);
    const [d1, d2, d3] = await p.enqueue(t, [
      needing({ diskMb: BigInt(100 * GB) }),
      needing({ diskMb: BigInt(100 * GB), diskMount: "/scratch" }),
      needing({ diskMb: BigInt(1 * GB), diskMount: "/nowhere" }),
    ]);
    expect(ids(await a.claim(5))).toEqual([d2!.id]);
    for (const id of [c2!.id, m1!.id, d1!.id, d3!.id]) expect((await p.item(t, id)).status).toBe(WorkItemStatus.PENDING);
  });

  it("claims plain work behind a backlog of items that do not fit now: they do not fill the claim", async () => {
    const t = "place-backlog";
    const a = await box("place-backlog-a", t, { gpus: [24] });
    await p.enqueue(
      t,
      Array.from({ length: 12 }, () => needing(gpuGb(1, 40))),
    );
    const [plain] = await p.enqueue(t, [{ engineKind: "dag", priority: 1 }]);
    expect(ids(await a.claim(5))).toEqual([plain!.id]);
  });
});

describe("requirements and capacity at the edge", () => {
  it("refuses negative or half-stated requirements and a capacity naming a GPU twice, as INVALID_ARGUMENT naming the field", async () => {
    const t = "place-edge";
    const refused = async (requirements: Need) => {
      const err = await p.enqueue(t, [needing(requirements)]).then(
        () => null,
        (e: unknown) => e as { code: Code; rawMessage: string },
      );
      expect(err?.code).toBe(Code.InvalidArgument);
      return err!.rawMessage;
    };
    expect(await refused({ gpus: -1 })).toContain("items[0].worker_params.requirements.gpus");
    expect(await refused({ gpuMemoryMb: 1000n })).toContain("say how many GPUs");
    expect(await refused({ cpuMillis: -5n })).toContain("negative");
    expect(await refused({ diskMount: "/x" })).toContain("disk_mb");
    expect(
      await codeOf(
        fx.agent("place-edge-a", {
          tenants: [t],
          capacity: {
            gpus: [
              { index: 0, memoryMb: 1n },
              { index: 0, memoryMb: 1n },
            ],
          },
        }),
      ),
    ).toBe(Code.InvalidArgument);
  });
});

describe("concurrency keys", () => {
  it("dispatches at most the key's limit fleet-wide, and a completion or a failure lets a waiting claim of another agent take the next", async () => {
    const t = "keys-limit";
    const a = await fx.agent("keys-limit-a", { tenants: [t], slots: 8 });
    const b = await fx.agent("keys-limit-b", { tenants: [t], slots: 8 });
    const keyed = (extra: Record<string, unknown> = {}) => ({ engineKind: "dag", workerParams: { concurrencyKey: "render", maxInFlight: 2 }, ...extra });
    const items = await p.enqueue(t, [keyed(), keyed(), keyed(), keyed(), keyed()]);
    const took = await a.claim(5);
    expect(ids(took)).toEqual([items[0]!.id, items[1]!.id]);
    expect(await b.claim(5)).toEqual([]);
    const waiting = b.claim(5, CLAIM_MAX_WAIT);
    await a.complete([took[0]!]);
    expect(ids(await waiting)).toEqual([items[2]!.id]);
    // A failure frees the slot too, and wakes a waiting claim as a completion does.
    const again = b.claim(5, CLAIM_MAX_WAIT);
    await a.fail([took[1]!], { retryable: false });
    expect(ids(await again)).toEqual([items[3]!.id]);
  });

  it("holds a key to 1 when its items state no limit, apart from other keys and plain work", async () => {
    const t = "keys-mutex";
    const a = await fx.agent("keys-mutex-a", { tenants: [t], slots: 8 });
    const [m1, , o1, plain] = await p.enqueue(t, [
      { engineKind: "dag", workerParams: { concurrencyKey: "m" } },
      { engineKind: "dag", workerParams: { concurrencyKey: "m" } },
      { engineKind: "dag", workerParams: { concurrencyKey: "other" } },
      { engineKind: "dag" },
    ]);
    expect(ids(await a.claim(5))).toEqual([m1!.id, o1!.id, plain!.id]);
  });

  it("refuses max_in_flight without a key, and a limit over 100000", async () => {
    const t = "keys-edge";
    expect(await codeOf(p.enqueue(t, [{ engineKind: "dag", workerParams: { maxInFlight: 3 } }]))).toBe(Code.InvalidArgument);
    expect(await codeOf(p.enqueue(t, [{ engineKind: "dag", workerParams: { concurrencyKey: "k", maxInFlight: 100_001 } }]))).toBe(Code.InvalidArgument);
  });
});

describe("work no agent could ever run", () => {
  it("is reported by QueueStats, ListItems and GetItem with why, still waits, and the grace policy makes it a dead letter", async () => {
    const t = "place-never";
    await box("place-never-a", t, { gpus: [48, 48] });
    const [huge, many, fits] = await p.enqueue(t, [needing(gpuGb(1, 80)), needing(gpuGb(3, 10)), needing(gpuGb(2, 40))]);
    const ops = fx.closers.add(opsSession(daemon.address));
    const stats = await ops.client.queueStats({ tenantKey: t }, ops.call);
    expect(stats.unplaceable.map((u) => [u.count, u.reason])).toEqual(
      expect.arrayContaining([
        [1n, "needs 80 GB per GPU, the largest agent GPU has 48 GB"],
        [1n, "needs 3 GPUs with 10 GB each, the most any agent has is 2"],
      ]),
    );
    expect(stats.unplaceable).toHaveLength(2);
    expect(stats.unplaceable.find((u) => u.reason.startsWith("needs 80"))?.requirements?.gpuMemoryMb).toBe(BigInt(80 * GB));
    const listed = await ops.client.listItems({ tenantKey: t }, ops.call);
    expect(Object.fromEntries(listed.items.map((i) => [i.id, i.unplaceable]))).toEqual({
      [huge!.id]: "needs 80 GB per GPU, the largest agent GPU has 48 GB",
      [many!.id]: "needs 3 GPUs with 10 GB each, the most any agent has is 2",
      [fits!.id]: "",
    });
    expect((await p.item(t, huge!.id)).unplaceable).toContain("needs 80 GB");
    // An agent of another tenant does not count: it could not take the work.
    await box("place-never-other", "elsewhere", { gpus: [80] });
    expect((await p.item(t, huge!.id)).unplaceable).toContain("needs 80 GB");

    const sweep = unplaceableTask({
      config: { unplaceableGrace: 60_000 },
      agents: new AgentStore(fx.db.pool, fx.db.tables),
      stats: new WorkItemStatsStore(fx.db.pool, fx.db.tables),
      store: fx.store(),
      log: silentLogger(),
      onFailed: () => undefined,
    });
    await sweep.run(clock.nowMs());
    expect((await p.item(t, huge!.id)).status).toBe(WorkItemStatus.PENDING);
    clock.advance(60_001);
    await sweep.run(clock.nowMs());
    const dead = await p.item(t, huge!.id);
    expect(dead.status).toBe(WorkItemStatus.FAILED);
    expect(dead.error).toBe("unplaceable: needs 80 GB per GPU, the largest agent GPU has 48 GB");
    expect((await p.item(t, many!.id)).status).toBe(WorkItemStatus.FAILED);
    // One that fits an agent waits on, however long.
    expect((await p.item(t, fits!.id)).status).toBe(WorkItemStatus.PENDING);
  });
});
