/**
 * The options that state an agent's resources instead of detecting and measuring them, `capacity`
 * and `heartbeatMetrics`, and their checks. The checks mirror what the daemon refuses (its
 * src/rpc/input/resources.ts and the heartbeat's metrics checks), so that a mistake fails
 * createAgent naming the option rather than every Register or Heartbeat call.
 */
import type { Capacity } from "./liveness/capacity.js";
import type { Metrics } from "./liveness/metrics.js";

/**
 * Figures the heartbeats report in place of measuring them, for simulated agents and tests that
 * state resources the machine does not have. Each part given replaces that part of the measured
 * report as a whole (`gpus` all GPUs, and nvidia-smi is then not run; `disks` all disks) and stays
 * as given for as long as the agent runs. Memory and disk in MiB.
 */
export interface HeartbeatMetrics {
  /** Percent of all cores in use, 0-100. */
  cpuUtilization?: number;
  memory?: { usedMb: number; totalMb: number };
  disks?: readonly { mount: string; freeMb: number; totalMb: number }[];
  gpus?: readonly { index: number; model?: string; memoryUsedMb?: number; memoryTotalMb: number; utilization?: number }[];
}

type Bad = (option: string, why: string) => never;

const MAX_ITEMS = 64;
/** 1 PiB in MiB, the daemon's limit. */
const MAX_MB = 2 ** 30;
const MAX_CPU_MILLIS = 1_000_000_000;
const MIB = 1024n * 1024n;

function whole(v: unknown, option: string, max: number, bad: Bad): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0 || v > max) bad(option, `must be a whole number in 0..${max}, got ${String(v)}`);
  return v;
}

function text(v: unknown, option: string, max: number, bad: Bad, required: boolean): string {
  if (v === undefined && !required) return "";
  if (typeof v !== "string" || (required && v === "") || v.length > max)
    bad(option, `must be ${required ? "a non-empty" : "a"} string of at most ${max} characters, got ${JSON.stringify(v)}`);
  return v;
}

function list<T>(v: readonly T[] | undefined, option: string, bad: Bad): readonly T[] | undefined {
  if (v === undefined) return undefined;
  if (!Array.isArray(v) || v.length > MAX_ITEMS) bad(option, `must be a list of at most ${MAX_ITEMS}`);
  return v;
}

function unique<K>(seen: Set<K>, key: K, option: string, bad: Bad): void {
  if (seen.has(key)) bad(option, `names ${String(key)} twice`);
  seen.add(key);
}

/** The `capacity` option, checked and copied; false registers none. */
export function checkCapacity(c: Partial<Capacity> | false | undefined, bad: Bad): Partial<Capacity> | false {
  if (c === false) return false;
  if (c === undefined) return {};
  if (typeof c !== "object" || c === null) bad("capacity", "must be an object, or false to register none");
  const out: Partial<Capacity> = {};
  if (c.cpuMillis !== undefined) out.cpuMillis = whole(c.cpuMillis, "capacity.cpuMillis", MAX_CPU_MILLIS, bad);
  if (c.memoryMb !== undefined) out.memoryMb = whole(c.memoryMb, "capacity.memoryMb", MAX_MB, bad);
  const gpus = list(c.gpus, "capacity.gpus", bad);
  if (gpus) {
    const indices = new Set<number>();
    out.gpus = gpus.map((g, i) => {
      const index = whole(g?.index, `capacity.gpus[${i}].index`, 1023, bad);
      unique(indices, index, "capacity.gpus", bad);
      return {
        index,
        model: text(g.model, `capacity.gpus[${i}].model`, 256, bad, false),
        memoryMb: whole(g.memoryMb, `capacity.gpus[${i}].memoryMb`, MAX_MB, bad),
      };
    });
  }
  const disks = list(c.disks, "capacity.disks", bad);
  if (disks) {
    const mounts = new Set<string>();
    out.disks = disks.map((d, i) => {
      const mount = text(d?.mount, `capacity.disks[${i}].mount`, 512, bad, true);
      unique(mounts, mount, "capacity.disks", bad);
      return { mount, sizeMb: whole(d.sizeMb, `capacity.disks[${i}].sizeMb`, MAX_MB, bad) };
    });
  }
  return out;
}

/** A part (used or free) and its whole, in MiB, as bytes; `at` names the object, `part` and `of` its fields. */
function partOf(at: string, part: string, partMb: unknown, of: string, ofMb: unknown, bad: Bad): [bigint, bigint] {
  const t = whole(ofMb, `${at}.${of}`, MAX_MB, bad);
  const u = whole(partMb, `${at}.${part}`, MAX_MB, bad);
  if (u > t) bad(`${at}.${part}`, `is ${u}, more than ${of} (${t})`);
  return [BigInt(u) * MIB, BigInt(t) * MIB];
}

function percent(v: unknown, option: string, bad: Bad): number {
  if (typeof v !== "number" || !(v >= 0 && v <= 100)) bad(option, `must be a percentage in 0..100, got ${String(v)}`);
  return v;
}

/** The `heartbeatMetrics` option, checked, as the heartbeat thread reports it (bytes). */
export function checkHeartbeatMetrics(m: HeartbeatMetrics | undefined, bad: Bad): Partial<Metrics> {
  if (m === undefined) return {};
  if (typeof m !== "object" || m === null) bad("heartbeatMetrics", "must be an object");
  const out: Partial<Metrics> = {};
  if (m.cpuUtilization !== undefined) out.cpuUtilization = percent(m.cpuUtilization, "heartbeatMetrics.cpuUtilization", bad);
  if (m.memory !== undefined)
    [out.memoryUsedBytes, out.memoryTotalBytes] = partOf("heartbeatMetrics.memory", "usedMb", m.memory?.usedMb, "totalMb", m.memory?.totalMb, bad);
  const disks = list(m.disks, "heartbeatMetrics.disks", bad);
  if (disks) {
    const mounts = new Set<string>();
    out.disks = disks.map((d, i) => {
      const at = `heartbeatMetrics.disks[${i}]`;
      const mount = text(d?.mount, `${at}.mount`, 512, bad, true);
      unique(mounts, mount, "heartbeatMetrics.disks", bad);
      const [freeBytes, totalBytes] = partOf(at, "freeMb", d.freeMb, "totalMb", d.totalMb, bad);
      return { mount, freeBytes, totalBytes };
    });
  }
  const gpus = list(m.gpus, "heartbeatMetrics.gpus", bad);
  if (gpus) {
    const indices = new Set<number>();
    out.gpus = gpus.map((g, i) => {
      const at = `heartbeatMetrics.gpus[${i}]`;
      const index = whole(g?.index, `${at}.index`, 1023, bad);
      unique(indices, index, "heartbeatMetrics.gpus", bad);
      const [memoryUsedBytes, memoryTotalBytes] = partOf(at, "memoryUsedMb", g.memoryUsedMb ?? 0, "memoryTotalMb", g.memoryTotalMb, bad);
      return {
        index,
        model: text(g.model, `${at}.model`, 256, bad, false),
        utilization: percent(g.utilization ?? 0, `${at}.utilization`, bad),
        memoryUsedBytes,
        memoryTotalBytes,
      };
    });
  }
  return out;
}
