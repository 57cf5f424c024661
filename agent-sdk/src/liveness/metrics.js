// @ts-check
/**
 * Host metrics for heartbeats, measured in the heartbeat thread so they stay current while task
 * code keeps the agent's main thread busy. Nothing is ever estimated: a source that cannot be read
 * (a mount that vanished, no nvidia-smi) is left out of the report. What the agent's
 * `heartbeatMetrics` option states (simulated agents, tests) is reported in place of what it
 * replaces, and that is then not measured at all (no nvidia-smi run for simulated GPUs).
 *
 * Plain JavaScript (type-checked from JSDoc, declared in metrics.d.ts) because worker threads load
 * it with Node itself, whatever runs the agent's TypeScript.
 */
import { statfs } from "node:fs/promises";
import os from "node:os";
import { runNvidiaSmi } from "./nvidia-smi.js";

const GPU_QUERY = ["--query-gpu=index,name,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits"];
const MIB = 1024n * 1024n;

/** @typedef {{ mount: string, freeBytes: bigint, totalBytes: bigint }} Disk */
/** @typedef {{ index: number, model: string, utilization: number, memoryUsedBytes: bigint, memoryTotalBytes: bigint }} Gpu */
/** @typedef {{ cpuUtilization: number, memoryUsedBytes: bigint, memoryTotalBytes: bigint, disks: Disk[], gpus: Gpu[] }} Metrics */

/** Busy and total CPU time over all cores, in ms. */
function cpuTimes() {
  let busy = 0;
  let total = 0;
  for (const c of os.cpus()) {
    const t = c.times;
    const all = t.user + t.nice + t.sys + t.idle + t.irq;
    total += all;
    busy += all - t.idle;
  }
  return { busy, total };
}

/**
 * Parses `nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used,memory.total
 * --format=csv,noheader,nounits` (memory in MiB). A line with a value that is not a number
 * ("[N/A]", "[Not Supported]") is skipped rather than guessed.
 * @param {string} csv
 * @returns {Gpu[]}
 */
export function parseNvidiaSmi(csv) {
  /** @type {Gpu[]} */
  const gpus = [];
  for (const line of csv.split("\n")) {
    if (line.trim() === "") continue;
    const cells = line.split(",").map((c) => c.trim());
    if (cells.length !== 5) continue;
    const [index, model, util, used, total] = /** @type {[string, string, string, string, string]} */ (cells);
    if (![index, util, used, total].every((v) => /^\d+(\.\d+)?$/.test(v))) continue;
    gpus.push({
      index: Number(index),
      model,
      utilization: Math.min(100, Number(util)),
      memoryUsedBytes: BigInt(Math.round(Number(used))) * MIB,
      memoryTotalBytes: BigInt(Math.round(Number(total))) * MIB,
    });
  }
  return gpus;
}

export class MetricsSampler {
  /** @type {{ busy: number, total: number }} */
  #lastCpu = cpuTimes();
  /** @type {Gpu[]} */
  #gpus = [];
  /** False once nvidia-smi turned out not to exist: it is not looked for again. */
  #gpuPresent = true;
  /** @type {Promise<void> | undefined} */
  #gpuQuery;
  #gpuSampled = false;
  /** After a failed run (a driver error), nvidia-smi is not run again before this time. */
  #gpuNextTry = 0;

  /**
   * @param {readonly string[]} mounts
   * @param {{ nvidiaSmi?: string, override?: Partial<Metrics> }} [options] the nvidia-smi executable
   *   (tests point it elsewhere); figures reported in place of measured ones
   */
  constructor(mounts, options = {}) {
    this.mounts = mounts;
    this.nvidiaSmi = options.nvidiaSmi ?? "nvidia-smi";
    this.override = options.override ?? {};
    if (this.override.gpus) this.#gpuPresent = false;
  }

  /**
   * CPU utilisation since the previous sample, memory, disks, and the GPUs of the latest completed
   * nvidia-smi run (a slow nvidia-smi never delays a heartbeat beyond the first).
   * @returns {Promise<Metrics>}
   */
  async sample() {
    const first = this.#refreshGpus();
    if (first) await first;
    const cpu = cpuTimes();
    const dBusy = cpu.busy - this.#lastCpu.busy;
    const dTotal = cpu.total - this.#lastCpu.total;
    this.#lastCpu = cpu;
    const total = BigInt(os.totalmem());
    const free = BigInt(os.freemem());
    const o = this.override;
    return {
      cpuUtilization: o.cpuUtilization ?? (dTotal > 0 ? Math.min(100, Math.max(0, (100 * dBusy) / dTotal)) : 0),
      memoryUsedBytes: o.memoryUsedBytes ?? (total > free ? total - free : 0n),
      memoryTotalBytes: o.memoryTotalBytes ?? total,
      disks: o.disks ?? (await this.#disks()),
      gpus: o.gpus ?? this.#gpus,
    };
  }

  /** @returns {Promise<Disk[]>} */
  async #disks() {
    const disks = await Promise.all(
      this.mounts.map(async (mount) => {
        try {
          const s = await statfs(mount, { bigint: true });
          return { mount, freeBytes: s.bavail * s.bsize, totalBytes: s.blocks * s.bsize };
        } catch {
          return undefined;
        }
      }),
    );
    return disks.filter((d) => d !== undefined);
  }

  /**
   * Starts an nvidia-smi run unless one is running. Returns its promise the first time only, so
   * the first heartbeat carries GPUs when there are any.
   * @returns {Promise<void> | undefined}
   */
  #refreshGpus() {
    if (!this.#gpuPresent || this.#gpuQuery || Date.now() < this.#gpuNextTry) return undefined;
    const isFirst = !this.#gpuSampled;
    this.#gpuQuery = runNvidiaSmi(this.nvidiaSmi, GPU_QUERY, 5_000).then((r) => {
      if (!r.ok && r.missing) this.#gpuPresent = false;
      else if (!r.ok) this.#gpuNextTry = Date.now() + 60_000;
      this.#gpus = r.ok ? parseNvidiaSmi(r.stdout) : [];
      this.#gpuSampled = true;
      this.#gpuQuery = undefined;
    });
    return isFirst ? this.#gpuQuery : undefined;
  }
}
