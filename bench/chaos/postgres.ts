/**
 * The chaos run's own Postgres: an embedded cluster (src/db/embedded.ts) on a spare port, in a data
 * directory of the run's, so that the run may stop and restart it, which a shared server must never
 * be. Stopping signals the postmaster as `pg_ctl stop` does (SIGINT is `-m fast`, SIGQUIT is
 * `-m immediate`: no checkpoint, crash recovery at the next start); pg_ctl itself refuses to run as
 * root, and the signals are all it sends. Starting again reuses the data directory and port.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pino } from "pino";
import { startEmbeddedPostgres, type EmbeddedPostgres } from "../../src/db/embedded.js";

export type StopMode = "fast" | "immediate";
const SIGNAL: Record<StopMode, NodeJS.Signals> = { fast: "SIGINT", immediate: "SIGQUIT" };

export class ChaosPostgres {
  #server: EmbeddedPostgres | undefined;
  #url = "";
  readonly #dataDir: string;
  readonly #port: number;

  constructor(dataDir: string, port: number) {
    this.#dataDir = dataDir;
    this.#port = port;
  }

  get url(): string {
    return this.#url;
  }

  get running(): boolean {
    return this.#server !== undefined;
  }

  async start(): Promise<void> {
    this.#server = await startEmbeddedPostgres({ dataDir: this.#dataDir, port: this.#port, log: pino({ level: "warn" }), database: "chaos" });
    this.#url = this.#server.url;
  }

  /** Stops the postmaster with `mode`'s signal and resolves once it has exited. */
  async stop(mode: StopMode): Promise<void> {
    if (!this.#server) return;
    const pid = Number.parseInt(readFileSync(join(this.#dataDir, "postmaster.pid"), "utf8").split("\n", 1)[0]!, 10);
    process.kill(pid, SIGNAL[mode]);
    const deadline = Date.now() + 60_000;
    while (running(pid)) {
      if (Date.now() > deadline) throw new Error(`Postgres (pid ${pid}) did not stop (${mode}) within 60 s`);
      await new Promise((r) => setTimeout(r, 25));
    }
    // The postmaster has exited, so this only removes the exit hook that would signal its old pid.
    await this.#server.stop();
    this.#server = undefined;
  }

  /** The clean stop at the end of a run (or on failure); safe when already stopped. */
  async close(): Promise<void> {
    const server = this.#server;
    this.#server = undefined;
    await server?.stop();
  }
}

/** Whether pid is a process that has not exited (an unreaped zombie counts as exited). */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return !stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z");
  } catch {
    return false;
  }
}
