/**
 * Process lifecycle for the benchmark: spawn children that say when they are ready, sample their
 * CPU and memory from /proc, and make sure nothing outlives the run.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { PYTHON, pythonEnv } from "./python.js";

const children = new Set<ChildProcess>();
let hooked = false;

function hookExit(): void {
  if (hooked) return;
  hooked = true;
  const killAll = () => {
    for (const c of children) c.kill("SIGKILL");
  };
  process.on("exit", killAll);
  for (const sig of ["SIGINT", "SIGTERM"] as const)
    process.on(sig, () => {
      killAll();
      process.exit(130);
    });
}

export interface Child {
  readonly proc: ChildProcess;
  readonly pid: number;
  /** Resolves with the first stdout line matching `ready` (a JSON line by convention). */
  ready: Promise<string>;
  /** Every later stdout line. */
  onLine(fn: (line: string) => void): void;
  /** SIGTERM, then SIGKILL after `graceMs`; resolves when the process has exited. */
  stop(graceMs?: number): Promise<number | null>;
  exited: Promise<number | null>;
}

export function startChild(
  script: string,
  args: readonly string[],
  opts: { env?: NodeJS.ProcessEnv; ready: (line: string) => boolean; stderr?: "inherit" | "ignore"; nodeArgs?: readonly string[] },
): Child {
  // A .py script is a Python agent: Debian's interpreter with the library on its path (./python.ts).
  if (script.endsWith(".py"))
    return track(spawn(PYTHON, [script, ...args], { env: { ...pythonEnv(), ...opts.env }, stdio: ["ignore", "pipe", opts.stderr ?? "inherit"] }), script, opts);
  // BENCH_CPU_PROF=DIR writes a V8 CPU profile of every child (daemon, agents, producer) into DIR.
  const prof = process.env.BENCH_CPU_PROF ? ["--cpu-prof", `--cpu-prof-dir=${process.env.BENCH_CPU_PROF}`] : [];
  // BENCH_NODE_ARGS adds Node options to every child (say --trace-gc, or --import of a probe).
  prof.push(...(process.env.BENCH_NODE_ARGS?.split(" ").filter(Boolean) ?? []));
  const proc = spawn(process.execPath, [...prof, ...(opts.nodeArgs ?? []), "--import", "tsx", script, ...args], {
    env: { ...process.env, ...opts.env },
    stdio: ["ignore", "pipe", opts.stderr ?? "inherit", "ipc"],
  });
  return track(proc, script, opts);
}

/** Watches a spawned child: its ready line, its later lines, its exit; killed if this process exits first. */
function track(proc: ChildProcess, script: string, opts: { ready: (line: string) => boolean }): Child {
  hookExit();
  children.add(proc);
  // "close", not "exit": it comes after the child's output has been read to its end, so its last
  // lines (its figures) reach the listeners before it counts as gone.
  const exited = new Promise<number | null>((resolve) => proc.once("close", (code) => (children.delete(proc), resolve(code))));
  const listeners: ((line: string) => void)[] = [];
  const ready = new Promise<string>((resolve, reject) => {
    let done = false;
    createInterface({ input: proc.stdout! }).on("line", (line) => {
      if (!done && opts.ready(line)) {
        done = true;
        resolve(line);
        return;
      }
      for (const l of listeners) l(line);
    });
    void exited.then((code) => {
      if (!done) reject(new Error(`${script} exited (${code}) before it was ready`));
    });
  });
  return {
    proc,
    pid: proc.pid!,
    ready,
    exited,
    onLine: (fn) => listeners.push(fn),
    stop: async (graceMs = 10_000) => {
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode;
      proc.kill("SIGTERM");
      const timer = setTimeout(() => proc.kill("SIGKILL"), graceMs);
      const code = await exited;
      clearTimeout(timer);
      return code;
    },
  };
}

export interface ProcSample {
  /** user + system CPU time so far, in ms. */
  cpuMs: number;
  rssBytes: number;
}

const TICK_MS = 10; // USER_HZ is 100 on Linux.

/** CPU and RSS of a process from /proc (Linux). */
export function sampleProc(pid: number): ProcSample {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const cpuTicks = Number(fields[11]) + Number(fields[12]);
  const rss = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return { cpuMs: cpuTicks * TICK_MS, rssBytes: rss ? Number(rss[1]) * 1024 : 0 };
}

/**
 * Processes whose name (/proc/PID/comm) starts with `prefix`. The steady sections meter the host's
 * kdamond threads with it: on these machines DAMON takes a core for 30–50 ms every ~0.57 s under
 * load, and the slow items of a run cluster on those bursts.
 */
export function pidsNamed(prefix: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (readFileSync(`/proc/${entry}/comm`, "utf8").startsWith(prefix)) pids.push(Number(entry));
    } catch {
      // gone since the listing
    }
  }
  return pids;
}

/** A process's CPU so far (ms), or `fallback` once it is gone (a kernel thread may be restarted). */
function cpuMsOr(pid: number, fallback: number): number {
  try {
    return sampleProc(pid).cpuMs;
  } catch {
    return fallback;
  }
}

/** Samples a process every `everyMs` until stopped: peak RSS and CPU used in the window. */
export function watchProc(pid: number, everyMs = 200) {
  const first = sampleProc(pid);
  const startedAt = Date.now();
  let peakRss = first.rssBytes;
  let last = first;
  const timer = setInterval(() => {
    try {
      last = sampleProc(pid);
      peakRss = Math.max(peakRss, last.rssBytes);
    } catch {
      clearInterval(timer);
    }
  }, everyMs);
  return {
    stop(): { cpuPercent: number; peakRssMb: number; wallMs: number } {
      clearInterval(timer);
      try {
        last = sampleProc(pid);
        peakRss = Math.max(peakRss, last.rssBytes);
      } catch {
        // exited: keep the last sample
      }
      const wallMs = Date.now() - startedAt;
      return { cpuPercent: wallMs > 0 ? ((last.cpuMs - first.cpuMs) / wallMs) * 100 : 0, peakRssMb: peakRss / 1024 / 1024, wallMs };
    },
  };
}

/**
 * Busy CPU time of the whole machine so far (every process: daemons, agents, Postgres, this one), in
 * ms, from /proc/stat; null where there is none. Divided by items it is the figure that throughput on
 * a saturated machine hides: what one item costs in all.
 */
export function machineBusyMs(): number | null {
  try {
    const cpu = readFileSync("/proc/stat", "utf8").split("\n", 1)[0]!.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal ...: everything but idle and iowait is busy.
    const busy = cpu.reduce((a, b) => a + b, 0) - (cpu[3] ?? 0) - (cpu[4] ?? 0);
    return busy * TICK_MS;
  } catch {
    return null;
  }
}

/** How often a process has been on a CPU and for how long in all, from /proc/PID/schedstat (Linux). */
export interface Runs {
  runMs: number;
  runs: number;
}

/** A process's runs so far; null where schedstat is not readable (gone, or a kernel without it). */
export function sampleRuns(pid: number): Runs | null {
  try {
    const [runNs, , runs] = readFileSync(`/proc/${pid}/schedstat`, "utf8").trim().split(/\s+/).map(Number);
    return Number.isFinite(runNs) && Number.isFinite(runs) ? { runMs: runNs! / 1e6, runs: runs! } : null;
  } catch {
    return null;
  }
}

/**
 * Starts counting a group's runs; its call gives the mean length of a run since, in ms (null: no run
 * or unreadable). For the host's kdamond this tells a quiet host from a noisy one better than its
 * share of a core, which is small either way (0–5 %): runs of ~1 ms leave the steady tail alone,
 * while page-out bursts of 20–50 ms on a kernel that does not preempt them set it.
 */
export function runLengthMeter(pids: readonly number[]): () => number | null {
  const first = pids.map(sampleRuns);
  return () => {
    let ms = 0;
    let runs = 0;
    pids.forEach((pid, i) => {
      const a = first[i];
      const b = sampleRuns(pid);
      // Gone since (DAMON switched off), or its pid taken by a newer process: it counts nothing.
      if (!a || !b || b.runs < a.runs) return;
      ms += b.runMs - a.runMs;
      runs += b.runs - a.runs;
    });
    return runs > 0 ? ms / runs : null;
  };
}

/** CPU used between a cpuMeter() and its call: wall time, the machine's busy time, each group's own time (ms). */
export interface CpuUse {
  wallMs: number;
  /** null where the machine's counters are not readable. */
  machineMs: number | null;
  groupMs: Record<string, number>;
}

/** Starts measuring CPU: of the whole machine, and of each named group of processes. */
export function cpuMeter(groups: Record<string, readonly number[]> = {}): () => CpuUse {
  const t0 = Date.now();
  const busy0 = machineBusyMs();
  const cpu0 = Object.entries(groups).map(([name, pids]) => ({ name, pids, ms: pids.map((pid) => cpuMsOr(pid, 0)) }));
  return () => {
    const busy1 = machineBusyMs();
    const groupMs: Record<string, number> = {};
    for (const g of cpu0) groupMs[g.name] = g.pids.reduce((sum, pid, i) => sum + cpuMsOr(pid, g.ms[i]!) - g.ms[i]!, 0);
    return { wallMs: Date.now() - t0, machineMs: busy0 === null || busy1 === null ? null : busy1 - busy0, groupMs };
  };
}
