/**
 * The loops every daemon instance runs beside the server: agent liveness, orchestrator liveness,
 * and (from the queue) lease expiry. Each task is one statement that is safe when every instance
 * runs it at once, and each reads time from the clock, so tests call `runOnce()` after moving a
 * fake clock instead of sleeping.
 */
import type { Clock } from "../clock.js";
import type { Logger } from "../log.js";

export interface MaintenanceTask {
  name: string;
  run(nowMs: number): Promise<unknown>;
}

export class Maintenance {
  readonly #tasks: MaintenanceTask[] = [];
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;

  constructor(
    private readonly clock: Clock,
    private readonly log: Logger,
  ) {}

  add(task: MaintenanceTask): void {
    this.#tasks.push(task);
  }

  start(intervalMs: number): void {
    this.#timer = setInterval(() => void this.runOnce(), intervalMs);
    this.#timer.unref();
  }

  /** Runs every task once, in order; one task failing does not stop the others. */
  runOnce(): Promise<void> {
    return (this.#running ??= (async () => {
      const now = this.clock.nowMs();
      for (const t of this.#tasks) {
        try {
          await t.run(now);
        } catch (err) {
          this.log.error({ err, task: t.name }, "maintenance task failed");
        }
      }
    })().finally(() => (this.#running = undefined)));
  }

  async stop(): Promise<void> {
    clearInterval(this.#timer);
    await this.#running;
  }
}
