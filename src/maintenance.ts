/**
 * The loops every daemon instance runs beside the server: agent liveness, orchestrator liveness,
 * and (from the queue) lease expiry. Each task is one statement that is safe when every instance
 * runs it at once, and each reads time from the clock, so tests call `runOnce()` after moving a
 * fake clock instead of sleeping.
 */
import type { Clock } from "./clock.js";
import { OutageLog } from "./db/outage-log.js";
import type { Logger } from "./log.js";

export interface MaintenanceTask {
  name: string;
  run(nowMs: number): Promise<unknown>;
}

export class Maintenance {
  readonly #tasks: MaintenanceTask[] = [];
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  /** A run requested while another was in progress (shared by every such request). */
  #queued: Promise<void> | undefined;
  readonly #outage: OutageLog;

  constructor(
    private readonly clock: Clock,
    private readonly log: Logger,
  ) {
    this.#outage = new OutageLog(log, "database unavailable: maintenance tasks wait for it");
  }

  add(task: MaintenanceTask): void {
    this.#tasks.push(task);
  }

  start(intervalMs: number): void {
    this.#timer = setInterval(() => void this.runOnce(), intervalMs);
    this.#timer.unref();
  }

  /**
   * Runs every task once, in order; one task failing does not stop the others. The run reads the
   * clock after this call: a run already in progress read it before, so the call waits for that one
   * and then runs again (calls made meanwhile share that next run).
   */
  runOnce(): Promise<void> {
    const start = () => (this.#running = this.#runAll().finally(() => (this.#running = undefined)));
    if (!this.#running) return start();
    return (this.#queued ??= this.#running.then(() => {
      this.#queued = undefined;
      // A run started since the previous one ended read the clock after this call too.
      return this.#running ?? start();
    }));
  }

  async #runAll(): Promise<void> {
    const now = this.clock.nowMs();
    for (const t of this.#tasks) {
      try {
        await t.run(now);
      } catch (err) {
        if (!this.#outage.note(err, { task: t.name })) this.log.error({ err, task: t.name }, "maintenance task failed");
      }
    }
  }

  async stop(): Promise<void> {
    clearInterval(this.#timer);
    await this.#queued;
    await this.#running;
  }
}
