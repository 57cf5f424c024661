/**
 * The capacity an agent registers (AgentMetadata.capacity): what the daemon places work that states
 * requirements against. Detected once, when the agent starts: CPU cores, memory, the GPUs nvidia-smi
 * lists, and the disks of the work directory and of the `mounts` option; the `capacity` option
 * replaces any part of it.
 *
 * What must stay true:
 * - Detection never fails and never hangs: without nvidia-smi there are no GPUs; one that errs or
 *   does not answer within its timeout also gives none, with a warning (the agent then offers none
 *   until it restarts, rather than offering GPUs it could not see).
 * - The work directory's disk comes first: the daemon places a disk need that names no mount on the
 *   agent's first disk, and a handler's scratch space is its work directory.
 * - Every disk registered is one the heartbeats report, under the same mount name and in the same
 *   order (`heartbeatMounts`): the daemon finds nothing free on a disk the heartbeat does not report.
 * - Nothing is estimated: a mount that cannot be read is left out, not registered as zero.
 */
import { stat, statfs } from "node:fs/promises";
import os from "node:os";
import { dirname } from "node:path";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { AgentCapacitySchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { runNvidiaSmi } from "./nvidia-smi.js";

/** One GPU, as registered. */
export interface GpuCapacity {
  /** Its index as nvidia-smi (and the heartbeat) numbers it, and as the claim hands it back in `gpuIndices`. */
  index: number;
  /** The model name, matched by an item's `gpu_model` (a case-insensitive part of it). */
  model: string;
  /** MiB of memory. */
  memoryMb: number;
}

/** One disk, as registered. */
export interface DiskCapacity {
  /** The mount point, as heartbeats name it and an item's `disk_mount` does. */
  mount: string;
  /** MiB. */
  sizeMb: number;
}

/** An agent's resources as a whole. */
export interface Capacity {
  /** Thousandths of a core (8 cores: 8000). */
  cpuMillis: number;
  /** MiB of memory. */
  memoryMb: number;
  gpus: GpuCapacity[];
  /** The work directory's disk first. */
  disks: DiskCapacity[];
}

export interface DetectOptions {
  /** The directory whose disk is registered first. */
  workDir: string;
  /** Further mount points (the `mounts` option), registered after it when they can be read. */
  mounts: readonly string[];
  /** Parts given here are taken as they are and not detected. */
  override?: Partial<Capacity>;
  /** The nvidia-smi to run. @default "nvidia-smi", looked up on PATH */
  nvidiaSmi?: string;
  /** How long nvidia-smi may take. @default 5000 */
  timeoutMs?: number;
  /** Told when nvidia-smi exists but gave no answer to go by. */
  warn?: (message: string) => void;
}

const GPU_QUERY = ["--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"];
const MIB = 1024 * 1024;

/** Detects what `override` does not give. Never rejects. */
export async function detectCapacity(o: DetectOptions): Promise<Capacity> {
  const given = o.override ?? {};
  const [gpus, disks] = await Promise.all([
    given.gpus ? Promise.resolve(given.gpus.map((g) => ({ ...g }))) : detectGpus(o.nvidiaSmi ?? "nvidia-smi", o.timeoutMs ?? 5_000, o.warn),
    given.disks ? Promise.resolve(given.disks.map((d) => ({ ...d }))) : detectDisks(o.workDir, o.mounts),
  ]);
  return {
    cpuMillis: given.cpuMillis ?? os.availableParallelism() * 1000,
    memoryMb: given.memoryMb ?? memoryMb(),
    gpus: gpus.sort((a, b) => a.index - b.index),
    disks,
  };
}

/**
 * The machine's memory, or the memory limit the process runs under (a container's cgroup) when that
 * is less: a pod limited to 8 GiB on a 512 GiB host has 8 GiB to offer.
 */
function memoryMb(): number {
  const total = os.totalmem();
  const limit = process.constrainedMemory?.() ?? 0;
  return Math.floor((limit > 0 && limit < total ? limit : total) / MIB);
}

async function detectGpus(executable: string, timeoutMs: number, warn: DetectOptions["warn"]): Promise<GpuCapacity[]> {
  const r = await runNvidiaSmi(executable, GPU_QUERY, timeoutMs);
  if (r.ok) return parseGpuCapacity(r.stdout);
  if (!r.missing) warn?.(`nvidia-smi gave no GPU list (${r.error}): registering no GPUs`);
  return [];
}

/**
 * Parses `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits` (memory in
 * MiB). A line whose index or memory is not a number ("[N/A]") is skipped rather than guessed; a
 * model name with a comma in it is kept whole.
 */
export function parseGpuCapacity(csv: string): GpuCapacity[] {
  const gpus: GpuCapacity[] = [];
  for (const line of csv.split("\n")) {
    const cells = line.split(",").map((c) => c.trim());
    if (cells.length < 3) continue;
    const index = cells[0]!;
    const memory = cells[cells.length - 1]!;
    if (!/^\d+$/.test(index) || !/^\d+(\.\d+)?$/.test(memory)) continue;
    gpus.push({ index: Number(index), model: cells.slice(1, -1).join(", "), memoryMb: Math.round(Number(memory)) });
  }
  return gpus;
}

/** The work directory's filesystem, then those of `mounts`, each once, as far as they can be read. */
async function detectDisks(workDir: string, mounts: readonly string[]): Promise<DiskCapacity[]> {
  const names = [...new Set([await mountPointOf(workDir), ...mounts])];
  const disks = await Promise.all(
    names.map(async (mount) => {
      try {
        const s = await statfs(mount, { bigint: true });
        return { mount, sizeMb: Number((s.blocks * s.bsize) / BigInt(MIB)) };
      } catch {
        return undefined;
      }
    }),
  );
  return disks.filter((d) => d !== undefined);
}

/**
 * The mount point of the filesystem `dir` is on: its highest ancestor (or itself) on the same device,
 * so that a work directory on the root filesystem is reported as "/" like the default `mounts`, and
 * one under a volume as the volume. A directory that cannot be read is its own name.
 */
export async function mountPointOf(dir: string): Promise<string> {
  let here = dir;
  let dev: bigint;
  try {
    dev = (await stat(here, { bigint: true })).dev;
  } catch {
    return dir;
  }
  for (;;) {
    const up = dirname(here);
    if (up === here) return here;
    try {
      if ((await stat(up, { bigint: true })).dev !== dev) return here;
    } catch {
      return here;
    }
    here = up;
  }
}

/** The mounts heartbeats report: every registered disk, in its order, then the rest of `mounts`. */
export function heartbeatMounts(capacity: Capacity, mounts: readonly string[]): string[] {
  return [...new Set([...capacity.disks.map((d) => d.mount), ...mounts])];
}

/** As RegisterRequest carries it (the int64 fields as bigint). */
export function capacityToWire(c: Capacity): MessageInitShape<typeof AgentCapacitySchema> {
  return {
    cpuMillis: BigInt(c.cpuMillis),
    memoryMb: BigInt(c.memoryMb),
    gpus: c.gpus.map((g) => ({ index: g.index, model: g.model, memoryMb: BigInt(g.memoryMb) })),
    disks: c.disks.map((d) => ({ mount: d.mount, sizeMb: BigInt(d.sizeMb) })),
  };
}
