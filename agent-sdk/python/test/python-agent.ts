/**
 * Python agents for the tests: agent-sdk/python/test/worker.py in a child process of Debian's
 * Python (the one python3-grpcio and python3-protobuf install for), driven by commands on its stdin
 * and observed through the JSON lines it prints, one per agent event. Waits are on those lines (and
 * on the process's exit), never on time.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { afterEach } from "vitest";
import { PYTHON, PYTHON_PKG, pythonEnv } from "../../../bench/python.js";
import { TOKENS } from "../../../test/support/daemon.js";

export { PYTHON, PYTHONPATH } from "../../../bench/python.js";

export interface PyEvent {
  event: string;
  [field: string]: unknown;
}

/** What worker.py takes: AgentOptions fields by their Python names. */
export type PyOptions = Record<string, unknown> & { name: string };

const live = new Set<PythonAgent>();
afterEach(async () => {
  await Promise.all([...live].map((a) => a.kill()));
});

export class PythonAgent {
  readonly events: PyEvent[] = [];
  readonly stderr: string[] = [];
  readonly exited: Promise<number | null>;
  readonly #child: ChildProcess;
  readonly #waiters = new Set<() => void>();

  private constructor(options: PyOptions) {
    this.#child = spawn(PYTHON, [`${PYTHON_PKG}test/worker.py`, JSON.stringify(options)], {
      env: pythonEnv(),
      stdio: ["pipe", "pipe", "pipe"],
    });
    live.add(this);
    this.exited = once(this.#child, "exit").then(([code]) => {
      live.delete(this);
      this.#wake();
      return code as number | null;
    });
    let buf = "";
    this.#child.stdout!.on("data", (chunk: Buffer) => {
      buf += chunk.toString();
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.trim()) this.events.push(JSON.parse(line) as PyEvent);
      }
      this.#wake();
    });
    let err = "";
    this.#child.stderr!.on("data", (chunk: Buffer) => {
      err += chunk.toString();
      const lines = err.split("\n");
      err = lines.pop()!;
      this.stderr.push(...lines);
      this.#wake();
    });
  }

  /** Starts worker.py; with `token: undefined` explicitly absent, the agent token is sent. */
  static start(address: string, options: PyOptions): PythonAgent {
    return new PythonAgent({ address, token: TOKENS.agent, tenants: ["t1"], rpc_timeout: 5, ...options });
  }

  get exitCode(): number | null {
    return this.#child.exitCode;
  }

  send(command: string): void {
    this.#child.stdin!.write(`${command}\n`);
  }

  /** Resolves with the first event (from the start) that `match` accepts; fails after `timeoutMs`. */
  async next(what: string, match: (e: PyEvent) => boolean, timeoutMs = 20_000): Promise<PyEvent> {
    return this.#until(what, () => this.events.find(match), timeoutMs);
  }

  /** Resolves once a stderr (log) line matches `re`. */
  async logged(re: RegExp, timeoutMs = 20_000): Promise<string> {
    return this.#until(`the agent logged ${re}`, () => this.stderr.find((l) => re.test(l)), timeoutMs);
  }

  state(s: string, timeoutMs?: number): Promise<PyEvent> {
    return this.next(`state ${s}`, (e) => e.event === "state" && e.state === s, timeoutMs);
  }

  finished(id: string, timeoutMs?: number): Promise<PyEvent> {
    return this.next(`item ${id} finished`, (e) => e.event === "finished" && e.id === id, timeoutMs);
  }

  started(id: string, timeoutMs?: number): Promise<PyEvent> {
    return this.next(`item ${id} started`, (e) => e.event === "started" && e.id === id, timeoutMs);
  }

  count(event: string): number {
    return this.events.filter((e) => e.event === event).length;
  }

  async kill(): Promise<void> {
    if (this.#child.exitCode === null && this.#child.signalCode === null) this.#child.kill("SIGKILL");
    await this.exited;
  }

  signal(sig: NodeJS.Signals): void {
    this.#child.kill(sig);
  }

  async #until<T>(what: string, find: () => T | undefined, timeoutMs: number): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const found = find();
      if (found !== undefined) return found;
      if (this.#child.exitCode !== null || this.#child.signalCode !== null)
        throw new Error(`the Python agent exited (${this.#child.exitCode ?? this.#child.signalCode}) before ${what}\n${this.stderr.slice(-30).join("\n")}`);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`timed out after ${timeoutMs}ms waiting until ${what}\n${this.stderr.slice(-30).join("\n")}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          this.#waiters.delete(wake);
          resolve();
        }, left);
        const wake = () => {
          clearTimeout(timer);
          resolve();
        };
        this.#waiters.add(wake);
      });
    }
  }

  #wake(): void {
    for (const w of [...this.#waiters]) {
      this.#waiters.delete(w);
      w();
    }
  }
}
