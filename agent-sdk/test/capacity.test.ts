/**
 * Capacity detection and the options that state resources, without a daemon: nvidia-smi is a real
 * executable here (a script put first on PATH, or a PATH with none), disks are this machine's, and
 * the options' checks are createAgent's own.
 */
import { create } from "@bufbuild/protobuf";
import { existsSync, readFileSync } from "node:fs";
import { chmod, mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import os, { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { WorkItemSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { until } from "../../test/support/kit.js";
import { capacityToWire, detectCapacity, heartbeatMounts, mountPointOf, parseGpuCapacity } from "../src/liveness/capacity.js";
import { MetricsSampler } from "../src/liveness/metrics.js";
import { resolveOptions, type AgentOptions } from "../src/options.js";
import { itemFromWire } from "../src/wire.js";

const QUERY = "--query-gpu=index,name,memory.total";
const MIB = 1024n * 1024n;

let dir: string;
let path: string | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "capacity-"));
  path = process.env.PATH;
});
afterEach(async () => {
  process.env.PATH = path;
  await rm(dir, { recursive: true, force: true });
});

/** An executable `nvidia-smi` in the test's directory running `body` (sh). */
async function fakeNvidiaSmi(body: string): Promise<string> {
  const file = join(dir, "nvidia-smi");
  await writeFile(file, `#!/bin/sh\n${body}\n`);
  await chmod(file, 0o755);
  return file;
}

/** Whether process `pid` runs (a zombie does not). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  return !existsSync(`/proc/${pid}/stat`) || readFileSync(`/proc/${pid}/stat`, "utf8").split(" ")[2] !== "Z";
}

const detect = (extra: Partial<Parameters<typeof detectCapacity>[0]> = {}) => {
  const warnings: string[] = [];
  return { warnings, capacity: detectCapacity({ workDir: process.cwd(), mounts: ["/"], warn: (m) => warnings.push(m), ...extra }) };
};

describe("detection", () => {
  it("without nvidia-smi on PATH: no GPUs and no warning; cores, memory and the work directory's disk first", async () => {
    process.env.PATH = dir;
    const { capacity, warnings } = detect({ mounts: ["/", "/definitely/not/a/mount"] });
    const c = await capacity;
    expect(c.gpus).toEqual([]);
    expect(warnings).toEqual([]);
    expect(c.cpuMillis).toBe(os.availableParallelism() * 1000);
    expect(c.memoryMb).toBeGreaterThan(0);
    expect(c.memoryMb).toBeLessThanOrEqual(os.totalmem() / 1048576);
    const work = await mountPointOf(process.cwd());
    // Each mount once, the unreadable one left out rather than registered as zero.
    expect(c.disks.map((d) => d.mount)).toEqual([...new Set([work, "/"])]);
    for (const d of c.disks) expect(d.sizeMb).toBeGreaterThan(0);
  });

  it("registers the GPUs nvidia-smi on PATH lists, by index, with their model and memory", async () => {
    await fakeNvidiaSmi(
      `[ "$1" = "${QUERY}" ] && [ "$2" = "--format=csv,noheader,nounits" ] || exit 9\necho "1, NVIDIA A100-SXM4-80GB, 81920"\necho "0, NVIDIA L40S, 46068"`,
    );
    process.env.PATH = `${dir}:${path}`;
    const { capacity, warnings } = detect();
    expect((await capacity).gpus).toEqual([
      { index: 0, model: "NVIDIA L40S", memoryMb: 46068 },
      { index: 1, model: "NVIDIA A100-SXM4-80GB", memoryMb: 81920 },
    ]);
    expect(warnings).toEqual([]);
  });

  it("an nvidia-smi that fails gives no GPUs, with a warning", async () => {
    await fakeNvidiaSmi(`echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" >&2\nexit 9`);
    process.env.PATH = `${dir}:${path}`;
    const { capacity, warnings } = detect();
    expect((await capacity).gpus).toEqual([]);
    expect(warnings).toEqual([expect.stringContaining("exited with code 9")]);
  });

  it("an nvidia-smi that never answers gives no GPUs at the timeout, and what it started is killed with it", async () => {
    const pidFile = join(dir, "sleeper.pid");
    // The script's child holds the output open: waiting for it to close would wait a minute.
    await fakeNvidiaSmi(`sleep 60 &\necho $! > ${pidFile}\nwait`);
    process.env.PATH = `${dir}:${path}`;
    const { capacity, warnings } = detect({ timeoutMs: 300 });
    expect((await capacity).gpus).toEqual([]);
    expect(warnings).toEqual([expect.stringContaining("no answer within 300 ms")]);
    const sleeper = Number(readFileSync(pidFile, "utf8"));
    expect(sleeper).toBeGreaterThan(0);
    await until("the script's child is killed", () => !alive(sleeper), 5_000);
  });

  it("takes what the override gives as it is, and does not detect it: no nvidia-smi run for given GPUs, no disk read for given disks", async () => {
    const ran = join(dir, "ran");
    await fakeNvidiaSmi(`touch ${ran}\necho "0, Real GPU, 1024"`);
    process.env.PATH = `${dir}:${path}`;
    const override = { gpus: [{ index: 3, model: "Simulated H100", memoryMb: 81_920 }], disks: [{ mount: "/scratch", sizeMb: 500_000 }] };
    const c = await detect({ override }).capacity;
    expect(c).toMatchObject({ gpus: override.gpus, disks: override.disks, cpuMillis: os.availableParallelism() * 1000 });
    expect(existsSync(ran)).toBe(false);
    expect(await detect({ override: { cpuMillis: 500, memoryMb: 2048 } }).capacity).toMatchObject({
      cpuMillis: 500,
      memoryMb: 2048,
      gpus: [{ index: 0, model: "Real GPU", memoryMb: 1024 }],
    });
    expect(existsSync(ran)).toBe(true);
  });

  it("the heartbeat reports the registered disks first, in their order, then the other mounts", () => {
    const c = {
      cpuMillis: 1000,
      memoryMb: 1,
      gpus: [],
      disks: [
        { mount: "/work", sizeMb: 1 },
        { mount: "/", sizeMb: 1 },
      ],
    };
    expect(heartbeatMounts(c, ["/", "/data"])).toEqual(["/work", "/", "/data"]);
    expect(capacityToWire({ ...c, gpus: [{ index: 0, model: "m", memoryMb: 49_152 }] })).toMatchObject({
      cpuMillis: 1000n,
      gpus: [{ index: 0, memoryMb: 49_152n }],
      disks: [
        { mount: "/work", sizeMb: 1n },
        { mount: "/", sizeMb: 1n },
      ],
    });
  });

  it("a directory's mount point is its highest ancestor on the same device", async () => {
    for (const d of [process.cwd(), dir, "/"]) {
      const mount = await mountPointOf(d);
      expect(d === mount || d.startsWith(mount === "/" ? "/" : `${mount}/`)).toBe(true);
      expect((await stat(mount)).dev).toBe((await stat(d)).dev);
      if (mount !== "/") expect((await stat(dirname(mount))).dev).not.toBe((await stat(d)).dev);
    }
  });

  it("parses nvidia-smi's capacity CSV, skipping what it does not have numbers for", () => {
    const csv = ["0, NVIDIA H100 80GB HBM3, 81559", "1, NVIDIA A10G, [N/A]", "2, Odd, Name, With Commas, 15360", "garbage", ""].join("\n");
    expect(parseGpuCapacity(csv)).toEqual([
      { index: 0, model: "NVIDIA H100 80GB HBM3", memoryMb: 81559 },
      { index: 2, model: "Odd, Name, With Commas", memoryMb: 15360 },
    ]);
  });
});

describe("heartbeat metrics stated instead of measured", () => {
  it("reports the simulated GPUs, memory and disks as given, and does not run nvidia-smi", async () => {
    const ran = join(dir, "ran");
    const fake = await fakeNvidiaSmi(`touch ${ran}\necho "0, Real, 0, 0, 1024"`);
    const opts = resolveOptions(
      options({
        heartbeatMetrics: {
          memory: { usedMb: 1024, totalMb: 65_536 },
          gpus: [{ index: 0, model: "Simulated L40S", memoryUsedMb: 8_192, memoryTotalMb: 49_152, utilization: 12 }],
        },
      }),
    );
    const sampler = new MetricsSampler(["/"], { nvidiaSmi: fake, override: opts.heartbeatMetrics });
    const m = await sampler.sample();
    expect(m.gpus).toEqual([{ index: 0, model: "Simulated L40S", utilization: 12, memoryUsedBytes: 8_192n * MIB, memoryTotalBytes: 49_152n * MIB }]);
    expect([m.memoryUsedBytes, m.memoryTotalBytes]).toEqual([1024n * MIB, 65_536n * MIB]);
    // Not stated: measured.
    expect(m.disks).toEqual([{ mount: "/", freeBytes: expect.any(BigInt), totalBytes: expect.any(BigInt) }]);
    expect(existsSync(ran)).toBe(false);
  });
});

const options = (extra: Partial<AgentOptions>): AgentOptions => ({
  address: "127.0.0.1:1",
  name: "cap",
  tenants: ["t"],
  handlers: { k: () => null },
  ...extra,
});

describe("option checks", () => {
  it("refuses capacities and metrics the daemon would refuse, naming the field", () => {
    const refused = (extra: Partial<AgentOptions>) => () => resolveOptions(options(extra));
    expect(
      refused({
        capacity: {
          gpus: [
            { index: 0, model: "a", memoryMb: 1 },
            { index: 0, model: "b", memoryMb: 1 },
          ],
        },
      }),
    ).toThrow(/capacity\.gpus names 0 twice/);
    expect(refused({ capacity: { memoryMb: -1 } })).toThrow(/capacity\.memoryMb must be a whole number/);
    expect(refused({ capacity: { cpuMillis: 1.5 } })).toThrow(/capacity\.cpuMillis/);
    expect(refused({ capacity: { disks: [{ mount: "", sizeMb: 1 }] } })).toThrow(/capacity\.disks\[0\]\.mount/);
    expect(refused({ heartbeatMetrics: { gpus: [{ index: 0, memoryUsedMb: 2, memoryTotalMb: 1 }] } })).toThrow(
      /heartbeatMetrics\.gpus\[0\]\.memoryUsedMb is 2, more than memoryTotalMb/,
    );
    expect(refused({ heartbeatMetrics: { cpuUtilization: 101 } })).toThrow(/heartbeatMetrics\.cpuUtilization/);
    expect(refused({ heartbeatMetrics: { disks: [{ mount: "/", freeMb: 5, totalMb: 4 }] } })).toThrow(/heartbeatMetrics\.disks\[0\]\.freeMb/);
  });

  it("defaults: the capacity detected whole, nothing simulated, the work directory the current one; false registers none", () => {
    expect(resolveOptions(options({}))).toMatchObject({ capacity: {}, heartbeatMetrics: {}, workDir: process.cwd() });
    expect(resolveOptions(options({ capacity: false })).capacity).toBe(false);
  });
});

describe("the handler's item", () => {
  it("carries the GPUs the claim placed it on, CUDA_VISIBLE_DEVICES for them, its requirements and concurrency key", () => {
    const placed = itemFromWire(
      create(WorkItemSchema, {
        id: "01GPU",
        payloadJson: "{}",
        gpuIndices: [2, 5],
        workerParams: { concurrencyKey: "train", rateLimitKey: "hub", requirements: { gpus: 2, gpuMemoryMb: 40_000n, gpuModel: "A100", diskMb: 10n } },
      }),
    );
    expect(placed).toMatchObject({ gpuIndices: [2, 5], cudaVisibleDevices: "2,5", concurrencyKey: "train", rateLimitKey: "hub" });
    expect(placed.requirements).toEqual({ gpus: 2, gpuMemoryMb: 40_000, gpuModel: "A100", cpuMillis: 0, memoryMb: 0, diskMb: 10, diskMount: undefined });
    const plain = itemFromWire(create(WorkItemSchema, { id: "01PLAIN" }));
    expect(plain).toMatchObject({
      gpuIndices: [],
      cudaVisibleDevices: "",
      concurrencyKey: undefined,
      rateLimitKey: undefined,
      requirements: { gpus: 0, diskMount: undefined },
    });
  });
});
