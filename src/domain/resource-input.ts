/**
 * Requirements (an item's) and capacity (an agent's) from the wire into the shapes the daemon stores
 * (../../domain/resources.ts). Every refusal is INVALID_ARGUMENT naming the field, before anything
 * is written. Limits are what no machine has (a mistake, or a negative number), and keep every
 * figure well inside an int8 and a float8 in the claim's arithmetic.
 */
import type { Requirements as WireRequirements } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import type { AgentCapacity } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { invalidArgument } from "./errors.js";
import type { Capacity, Requirements } from "./resources.js";
import { optionalText } from "./input.js";

const MAX_GPUS = 64;
/** 1 PiB in MiB: more memory or disk than any machine. */
const MAX_MB = 2 ** 30;
/** A million cores. */
const MAX_CPU_MILLIS = 1_000_000_000;

function amount(v: number | bigint, field: string, max: number): number {
  const n = typeof v === "bigint" ? Number(v) : v;
  if (!Number.isSafeInteger(n)) throw invalidArgument(field, `${v} is not a whole number`);
  if (n < 0) throw invalidArgument(field, `${v} is negative; give 0 for no need`);
  if (n > max) throw invalidArgument(field, `${v} is more than ${max}`);
  return n;
}

/** An item's requirements, or null when it states none (every field zero or empty). */
export function requirementsOf(r: WireRequirements | undefined, field: string): Requirements | null {
  if (r === undefined) return null;
  const f = (name: string) => `${field}.${name}`;
  const out: Requirements = {};
  const gpus = amount(r.gpus, f("gpus"), MAX_GPUS);
  const gpuMemoryMb = amount(r.gpuMemoryMb, f("gpu_memory_mb"), MAX_MB);
  const gpuModel = optionalText(r.gpuModel, f("gpu_model"), 128);
  if (gpus === 0 && (gpuMemoryMb > 0 || gpuModel)) throw invalidArgument(f("gpus"), "is 0, but gpu_memory_mb or gpu_model is set: say how many GPUs");
  if (gpus > 0) out.gpus = gpus;
  if (gpuMemoryMb > 0) out.gpuMemoryMb = gpuMemoryMb;
  if (gpuModel) out.gpuModel = gpuModel;
  const cpuMillis = amount(r.cpuMillis, f("cpu_millis"), MAX_CPU_MILLIS);
  if (cpuMillis > 0) out.cpuMillis = cpuMillis;
  const memoryMb = amount(r.memoryMb, f("memory_mb"), MAX_MB);
  if (memoryMb > 0) out.memoryMb = memoryMb;
  const diskMb = amount(r.diskMb, f("disk_mb"), MAX_MB);
  const diskMount = optionalText(r.diskMount, f("disk_mount"), 512);
  if (diskMb === 0 && diskMount) throw invalidArgument(f("disk_mb"), "is 0, but disk_mount is set: say how much disk");
  if (diskMb > 0) out.diskMb = diskMb;
  if (diskMount) out.diskMount = diskMount;
  return Object.keys(out).length > 0 ? out : null;
}

/** An agent's registered capacity, or null when it registered none. */
export function capacityOf(c: AgentCapacity | undefined, field: string): Capacity | null {
  if (c === undefined) return null;
  const f = (name: string) => `${field}.${name}`;
  if (c.gpus.length > MAX_GPUS) throw invalidArgument(f("gpus"), `has ${c.gpus.length} GPUs; the limit is ${MAX_GPUS}`);
  if (c.disks.length > 64) throw invalidArgument(f("disks"), `has ${c.disks.length} disks; the limit is 64`);
  const indices = new Set<number>();
  const gpus = c.gpus.map((g, i) => {
    const index = amount(g.index, f(`gpus[${i}].index`), 1023);
    if (indices.has(index)) throw invalidArgument(f(`gpus[${i}].index`), `${index} is named twice`);
    indices.add(index);
    return { index, model: optionalText(g.model, f(`gpus[${i}].model`), 256) ?? "", memoryMb: amount(g.memoryMb, f(`gpus[${i}].memory_mb`), MAX_MB) };
  });
  const mounts = new Set<string>();
  const disks = c.disks.map((d, i) => {
    const mount = optionalText(d.mount, f(`disks[${i}].mount`), 512);
    if (!mount) throw invalidArgument(f(`disks[${i}].mount`), "is required");
    if (mounts.has(mount)) throw invalidArgument(f(`disks[${i}].mount`), `'${mount}' is named twice`);
    mounts.add(mount);
    return { mount, sizeMb: amount(d.sizeMb, f(`disks[${i}].size_mb`), MAX_MB) };
  });
  gpus.sort((x, y) => x.index - y.index);
  return { cpuMillis: amount(c.cpuMillis, f("cpu_millis"), MAX_CPU_MILLIS), memoryMb: amount(c.memoryMb, f("memory_mb"), MAX_MB), gpus, disks };
}
