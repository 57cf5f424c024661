/**
 * The loops every daemon instance runs beside the server: agent liveness, orchestrator liveness,
 * and (from the queue) lease expiry. Each task is one statement that is safe when every instance
 * runs it at once, and each reads time from the clock, so tests call `runOnce()` after moving a
 * fake clock instead of sleeping.
 *
 * Each run also tells its tasks since when this daemon has reached the database without a break
 * (MaintenanceRun). What must stay true: a stretch starts at the daemon's first run and at the
 * first run after any run in which a task failed because the database was away, and at no other
 * time. The tasks that judge agents by what reached the database (the liveness sweep, lease
 * expiry) hold back until agents have had time to reach this daemon since then: before it, what
 * the database shows of them says nothing about whether they are alive.
 */
import type { Clock } from "./clock.js";
import { OutageLog } from "./db/outage-log.js";
import type { Logger } from "./log.js";

/** What a maintenance run knows of this daemon's hold on the database. */
export interface MaintenanceRun {
  /** When this daemon's current stretch of reaching the database began (the time of that stretch's first run). */
  reachedSinceMs: number;
  /**
   * This run is the stretch's first: the daemon just started, or just got the database back (or
   * has not yet: each run while the database is away starts a stretch that its failure ends).
   */
  justReached: boolean;
}

export interface MaintenanceTask {
  name: string;
  /**
   * `run` is optional only for callers that drive one task by hand (tests); Maintenance always
   * passes it, and a task treats its absence as a stretch that began long ago.
   */
  run(nowMs: number, run?: MaintenanceRun): Promise<unknown>;
}

export class Maintenance {
  readonly #tasks: MaintenanceTask[] = [];
  #timer: NodeJS.Timeout | undefined;
  #running: Promise<void> | undefined;
  /** A run requested while another was in progress (shared by every such request). */
  #queued: Promise<void> | undefined;
  readonly #outage: OutageLog;
  /** The current stretch's start; undefined before the first run. */
  #reachedSince: number | undefined;
  /** A task of the last run failed because the database was away: the next run starts a stretch. */
  #lastRunAway = false;

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
    const justReached = this.#reachedSince === undefined || this.#lastRunAway;
    if (justReached) this.#reachedSince = now;
    const run: MaintenanceRun = { reachedSinceMs: this.#reachedSince!, justReached };
    let away = false;
    for (const t of this.#tasks) {
      try {
        await t.run(now, run);
      } catch (err) {
        // Only the database's absence breaks the stretch: a task failing for its own reasons says
        // nothing of what agents could reach.
        if (this.#outage.note(err, { task: t.name })) away = true;
        else this.log.error({ err, task: t.name }, "maintenance task failed");
      }
    }
    this.#lastRunAway = away;
  }

  async stop(): Promise<void> {
    clearInterval(this.#timer);
    await this.#queued;
    await this.#running;
  }
}
