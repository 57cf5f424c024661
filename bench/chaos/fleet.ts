/**
 * The chaos run's processes: daemons on fixed ports (a restarted one comes back at the same address,
 * which the agents already list) and agents under fixed names (a replacement takes its
 * predecessor's name, as a restarted worker would). Every exit the run did not cause is recorded as
 * a crash, and the process is started again so the run goes on measuring everything else.
 */
import { appendFileSync } from "node:fs";
import { join } from "node:path";
import { DAEMON_NODE_TUNING, NODE_TUNING } from "../env.js";
import { startChild, type Child } from "../proc.js";

export const TOKEN = "chaos-agent-token";
export const ENGINE_TOKEN = "chaos-engine-token";
/** The DAG producer's (role `runs`): every DAG run of the chaos run belongs to this caller. */
export const RUNS_TOKEN = "chaos-runs-token";
export const TENANT = "chaos";
export const KIND = "chaos";

/**
 * A process that has not said it is ready within this is killed and the run fails: a daemon whose
 * start failed part-way may live on without ever serving, and the run would wait for it for good.
 * Generous: a daemon waits for its database at start, and a loaded CI host starts tsx slowly.
 */
export const START_BOUND_MS = 90_000;

export interface Crash {
  process: string;
  code: number | null;
  signal: NodeJS.Signals | null;
  atMs: number;
}

export interface FleetOptions {
  dir: string;
  dbUrl: string;
  ports: readonly number[];
  agents: number;
  slots: number;
  handlerMs: readonly [number, number];
  daemonEnv: Record<string, string>;
  /** How the agents take work: the agent stream (the SDK's default) or unary claims (`stream: false`). */
  mode: "stream" | "unary";
}

/** How a process took a SIGTERM: whether it exited within its bound or needed the SIGKILL after it. */
export interface TermOutcome {
  process: string;
  /** From the SIGTERM to the exit (a hung one: to the exit after the SIGKILL). */
  ms: number;
  hung: boolean;
}

interface Slot {
  name: string;
  child: Child | undefined;
  generation: number;
  /** Set just before the run itself ends this process, so that its exit is not a crash. */
  expectExit: boolean;
}

export class Fleet {
  readonly crashes: Crash[] = [];
  /** Per agent name, when it had no live registered process: [from, to) in epoch ms (to undefined: still). */
  readonly agentGaps = new Map<string, [number, number | undefined][]>();
  readonly #o: FleetOptions;
  readonly #daemons: Slot[];
  readonly #agents: Slot[];
  #closing = false;

  constructor(o: FleetOptions) {
    this.#o = o;
    this.#daemons = o.ports.map((_, i) => ({ name: `chaos-daemon-${i}`, child: undefined, generation: 0, expectExit: false }));
    this.#agents = Array.from({ length: o.agents }, (_, i) => ({ name: `chaos-agent-${i}`, child: undefined, generation: 0, expectExit: false }));
  }

  get addresses(): string[] {
    return this.#o.ports.map((p) => `127.0.0.1:${p}`);
  }

  get agentNames(): string[] {
    return this.#agents.map((a) => a.name);
  }

  /** Files every agent process wrote its runs and outcomes to. */
  recordFiles(): string[] {
    return this.#agents.flatMap((a) => Array.from({ length: a.generation }, (_, g) => join(this.#o.dir, `${a.name}.g${g}.jsonl`)));
  }

  auditFiles(): string[] {
    return this.#daemons.flatMap((d) => Array.from({ length: d.generation }, (_, g) => join(this.#o.dir, `${d.name}.g${g}.audit.jsonl`)));
  }

  /** Every daemon's stdout and stderr lines are kept here, for a failed run's post-mortem. */
  #logTo(child: Child, file: string): void {
    child.onLine((line) => appendFileSync(file, `${line}\n`));
  }

  async startDaemon(i: number): Promise<void> {
    const d = this.#daemons[i]!;
    const g = d.generation++;
    const child = startChild("bin/aiflowd.js", ["serve"], {
      nodeArgs: DAEMON_NODE_TUNING,
      stderr: "inherit",
      env: {
        DATABASE_URL: this.#o.dbUrl,
        AIFLOW_LISTEN: this.addresses[i]!,
        AIFLOW_INSTANCE_ID: d.name,
        AIFLOW_TENANTS: TENANT,
        AIFLOW_TOKENS: `agent:${TOKEN};engine:${ENGINE_TOKEN};runs:${RUNS_TOKEN}`,
        AIFLOW_AUDIT_LOG: join(this.#o.dir, `${d.name}.g${g}.audit.jsonl`),
        AIFLOW_LOG_LEVEL: "info",
        NO_COLOR: "1",
        // Several daemons on one host: none takes the default metrics port.
        AIFLOW_HTTP_LISTEN: "off",
        ...this.#o.daemonEnv,
      },
      ready: (line) => line.includes("aiflowd serving gRPC"),
    });
    this.#watch(d, child);
    this.#logTo(child, join(this.#o.dir, `${d.name}.g${g}.log`));
    await this.#ready(d, child, g);
  }

  async startAgent(i: number): Promise<void> {
    const a = this.#agents[i]!;
    const g = a.generation++;
    const [min, max] = this.#o.handlerMs;
    const file = (ext: string) => join(this.#o.dir, `${a.name}.g${g}.${ext}`);
    const child = startChild(
      "bench/chaos/child-agent.ts",
      [this.addresses.join(","), TOKEN, a.name, TENANT, KIND, String(this.#o.slots), String(min), String(max), file("jsonl"), file("log"), this.#o.mode],
      { nodeArgs: NODE_TUNING, stderr: "inherit", ready: (line) => line.includes('"ready":true') },
    );
    this.#watch(a, child);
    await this.#ready(a, child, g);
    const gaps = this.agentGaps.get(a.name);
    const open = gaps?.at(-1);
    if (open && open[1] === undefined) open[1] = Date.now();
  }

  /** kill -9 of agent i; a replacement under the same name is started at once. */
  async killAgent(i: number): Promise<void> {
    await this.killAgents([i]);
  }

  /** kill -9 of these agents at once; once every one has exited, their replacements start together. */
  async killAgents(indices: readonly number[]): Promise<void> {
    await Promise.all(indices.map((i) => this.#kill(this.#agents[i]!)));
    await Promise.all(indices.map((i) => this.startAgent(i)));
  }

  async killDaemon(i: number): Promise<void> {
    await this.#kill(this.#daemons[i]!);
    await this.startDaemon(i);
  }

  /** kill -9 of these daemons at once; they stay down until startDaemons. */
  async killDaemonsOnly(indices: readonly number[]): Promise<void> {
    await Promise.all(indices.map((i) => this.#kill(this.#daemons[i]!)));
  }

  async startDaemons(indices: readonly number[]): Promise<void> {
    await Promise.all(indices.map((i) => this.startDaemon(i)));
  }

  /**
   * A graceful restart: SIGTERM to daemon i and a wait for its exit; one that has not exited within
   * `boundMs` is hung (SIGKILL then, so the run goes on). It is started again either way.
   */
  async termDaemon(i: number, boundMs: number): Promise<TermOutcome> {
    const d = this.#daemons[i]!;
    d.expectExit = true;
    const outcome = await terminate(d.name, d.child!, boundMs);
    await this.startDaemon(i);
    return outcome;
  }

  get daemonCount(): number {
    return this.#daemons.length;
  }

  agentIndex(name: string): number {
    return this.#agents.findIndex((a) => a.name === name);
  }

  /** The child's ready line, or (past START_BOUND_MS) a SIGKILL and an error that fails the run. */
  async #ready(s: Slot, child: Child, generation: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((r) => (timer = setTimeout(() => r("late"), START_BOUND_MS)));
    try {
      if ((await Promise.race([child.ready, late])) !== "late") return;
    } finally {
      clearTimeout(timer);
    }
    s.expectExit = true;
    child.proc.kill("SIGKILL");
    await child.exited;
    throw new Error(
      `${s.name} (generation ${generation}, pid ${child.pid}) did not say it was ready within ${START_BOUND_MS / 1000} s (its log: ${join(this.#o.dir, `${s.name}.g${generation}.log`)})`,
    );
  }

  async #kill(s: Slot): Promise<void> {
    const child = s.child!;
    s.expectExit = true;
    if (this.#agents.includes(s)) this.#gapStarts(s.name);
    child.proc.kill("SIGKILL");
    await child.exited;
  }

  #gapStarts(name: string): void {
    const gaps = this.agentGaps.get(name) ?? [];
    gaps.push([Date.now(), undefined]);
    this.agentGaps.set(name, gaps);
  }

  #watch(s: Slot, child: Child): void {
    s.child = child;
    s.expectExit = false;
    child.proc.once("exit", (code, signal) => {
      if (s.expectExit || this.#closing) return;
      this.crashes.push({ process: `${s.name} (generation ${s.generation - 1}, pid ${child.pid})`, code, signal, atMs: Date.now() });
      const isAgent = this.#agents.includes(s);
      if (isAgent) this.#gapStarts(s.name);
      const i = isAgent ? this.#agents.indexOf(s) : this.#daemons.indexOf(s);
      // Started again so the run keeps measuring; the crash itself fails the run.
      setTimeout(() => void (isAgent ? this.startAgent(i) : this.startDaemon(i)).catch(() => {}), 500);
    });
  }

  /**
   * SIGTERM to every agent at once (they deregister through a daemon); each must exit within
   * `boundMs`, or it is hung and gets a SIGKILL. Told per agent, for the verdict.
   */
  async stopAgents(boundMs: number): Promise<TermOutcome[]> {
    this.#closing = true;
    const live = this.#agents.filter((a) => a.child && a.child.proc.exitCode === null && a.child.proc.signalCode === null);
    return Promise.all(live.map((a) => terminate(a.name, a.child!, boundMs)));
  }

  /** Agents first (they deregister through a daemon), then daemons; SIGKILL after a grace. */
  async stop(): Promise<void> {
    this.#closing = true;
    await Promise.all(this.#agents.map((a) => a.child?.stop(5000)));
    await Promise.all(this.#daemons.map((d) => d.child?.stop(10_000)));
  }

  /** For a synchronous exit path (Ctrl-C): SIGKILL to everything still running. */
  killAllNow(): void {
    this.#closing = true;
    for (const s of [...this.#agents, ...this.#daemons]) if (s.child && s.child.proc.exitCode === null) s.child.proc.kill("SIGKILL");
  }
}

/**
 * SIGTERM, then the exit raced against `boundMs`: past it the process is hung and gets a SIGKILL.
 * (proc.ts's Child.stop escalates the same way but does not say whether it had to.)
 */
async function terminate(name: string, child: Child, boundMs: number): Promise<TermOutcome> {
  const t0 = Date.now();
  child.proc.kill("SIGTERM");
  let timer: NodeJS.Timeout | undefined;
  const hung = await Promise.race([child.exited.then(() => false), new Promise<boolean>((r) => (timer = setTimeout(() => r(true), boundMs)))]);
  clearTimeout(timer);
  if (hung) {
    child.proc.kill("SIGKILL");
    await child.exited;
  }
  return { process: name, ms: Date.now() - t0, hung };
}
