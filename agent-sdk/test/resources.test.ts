/**
 * Resources end to end, against a real daemon: the capacity an SDK agent registers (detected, or
 * stated with its heartbeats simulated to match) decides which items with requirements the daemon
 * gives it, and the handler learns the GPUs the item was placed on. Agents here simulate their
 * GPUs, so no GPU is needed.
 */
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../../src/daemon.js";
import { agentRow } from "../../test/support/agents.js";
import type { TestDb } from "../../test/support/db.js";
import { useTestDaemon } from "../../test/support/kit.js";
import type { WorkItem } from "../src/index.js";
import { mountPointOf } from "../src/liveness/capacity.js";
import { finished, Producer, testAgent, until, WorkItemStatus } from "./support.js";

const fx = useTestDaemon({ label: "sdkres", config: { heartbeatInterval: 500, heartbeatFlush: 50, sweepInterval: 50 } });
let db: TestDb;
let daemon: Daemon;
let producer: Producer;

beforeAll(() => {
  ({ db, daemon } = fx);
  producer = fx.closers.add(new Producer(daemon.address, "t1"));
});

const GPU = { index: 0, model: "NVIDIA L40S", memoryMb: 49_152 };

describe("placement on an SDK agent's resources", () => {
  it("an agent without GPUs passes over a 40 GB GPU item; one registered with a 48 GB GPU runs it on GPU 0, and its handler is told so", async () => {
    const kind = "gpu-job";
    const seen: Pick<WorkItem, "id" | "taskName" | "gpuIndices" | "cudaVisibleDevices" | "requirements">[] = [];
    const handler = (item: WorkItem) => {
      seen.push({
        id: item.id,
        taskName: item.taskName,
        gpuIndices: item.gpuIndices,
        cudaVisibleDevices: item.cudaVisibleDevices,
        requirements: item.requirements,
      });
      return { cuda: item.cudaVisibleDevices };
    };
    // What the machine has, except GPUs: none, whatever this machine has.
    // Short claims throughout: the daemon places requirements only once a heartbeat reported what is
    // free, and a claim before that comes back empty at the end of its wait.
    const cpuOnly = testAgent(daemon.address, { engineKinds: [kind], capacity: { gpus: [] }, claimWaitMs: 250, handlers: { [kind]: handler } });
    await cpuOnly.start();
    const registered = (await agentRow(db, cpuOnly.name))?.metadata as { capacity?: { gpus: unknown[]; disks: { mount: string }[] } };
    expect(registered.capacity?.gpus).toEqual([]);
    expect(registered.capacity?.disks[0]?.mount).toBe(await mountPointOf(process.cwd()));
    expect(registered.capacity).toEqual(cpuOnly.capacity);

    const [gpuJob] = await producer.enqueue([{ engineKind: kind, taskName: "train", workerParams: { requirements: { gpus: 1, gpuMemoryMb: 40_000n } } }]);
    // Enqueued after the GPU item. Its disk need names no mount: it goes on the first registered
    // disk, the work directory's, which the heartbeats must report under the same name.
    const disk = finished(cpuOnly, (item) => item.taskName === "scratch");
    await producer.enqueue([{ engineKind: kind, taskName: "scratch", workerParams: { requirements: { diskMb: 1n, memoryMb: 1n } } }]);
    expect((await disk).outcome).toEqual({ kind: "completed" });
    expect(seen.map((s) => s.taskName)).toEqual(["scratch"]);
    expect(seen[0]).toMatchObject({ gpuIndices: [], cudaVisibleDevices: "", requirements: { diskMb: 1, memoryMb: 1, diskMount: undefined } });
    expect((await producer.get(gpuJob!)).status).toBe(WorkItemStatus.PENDING);

    const gpuAgent = testAgent(daemon.address, {
      engineKinds: [kind],
      capacity: { gpus: [GPU] },
      heartbeatMetrics: { gpus: [{ index: 0, model: GPU.model, memoryUsedMb: 0, memoryTotalMb: GPU.memoryMb }] },
      // The default claim wait: its first claim waits from before its first heartbeat is written,
      // and that write wakes it (a long wait would time the test out otherwise).
      handlers: { [kind]: handler },
    });
    const onGpu = finished(gpuAgent, gpuJob!);
    await gpuAgent.start();
    expect((await onGpu).outcome).toEqual({ kind: "completed" });
    expect(seen.at(-1)).toEqual({
      id: gpuJob,
      taskName: "train",
      gpuIndices: [0],
      cudaVisibleDevices: "0",
      requirements: expect.objectContaining({ gpus: 1, gpuMemoryMb: 40_000 }),
    });
    const [done] = await producer.waitDone([gpuJob!]);
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, agentId: gpuAgent.name, gpuIndices: [0] });
    expect(JSON.parse(done!.resultJson)).toEqual({ cuda: "0" });
    expect(seen.filter((s) => s.taskName === "train")).toHaveLength(1);

    // The heartbeats reported the simulated GPU, as registered.
    let gpus: unknown;
    await until(
      "a heartbeat with the GPU landed",
      async () => ((gpus = ((await agentRow(db, gpuAgent.name))?.metrics as { gpus?: unknown[] } | null)?.gpus)?.length ?? 0) > 0,
    );
    expect(gpus).toEqual([{ index: 0, model: GPU.model, utilization: 0, memory: { used: 0, total: GPU.memoryMb * 1048576 } }]);
  });
});
