/**
 * The one advance loop: applies every engine's events (aiflow_engine_event) to its runs, one locked
 * run per transaction.
 *
 * What must stay true:
 * - An advance takes a run's due events (migration 0017's trigger wrote each in the transaction that
 *   ended its work item; a DAG timeout comes due by the clock) and applies them in the transaction
 *   that deletes them: a daemon killed in between loses nothing (the events wait for the next
 *   advance, on any daemon) and doubles nothing. Daemons lock runs with SKIP LOCKED, so several
 *   advance one database's runs, never one run twice at once.
 * - An engine gets all of a run's due events at once (a DAG fan-out's hundreds of ended iterations
 *   are one transaction, not hundreds).
 * - The loop starts when a daemon hears the trigger's NOTIFY (a bare run id on the engines' channel)
 *   and on every maintenance tick (timeouts come due; a notification may be lost with a dropped
 *   listener). It takes one run of each engine in turn, so a backlog of one engine's runs never holds
 *   another's back, and stops when no engine has a run due that another daemon is not advancing.
 */
import type { MaintenanceTask } from "../maintenance.js";
import { EngineEventStore } from "../store/engine-events.js";
import { KickLoop } from "../util/kick-loop.js";
import type { EngineDeps } from "./deps.js";
import type { Engine } from "./engine.js";
import { inRunTransaction, TOPIC } from "./run-transaction.js";

export class Advancer {
  readonly #loop: KickLoop;
  #unlisten: (() => void) | undefined;

  constructor(
    private readonly d: EngineDeps,
    private readonly engines: readonly Engine[],
  ) {
    this.#loop = new KickLoop(
      () => this.advanceDue(),
      (err) => this.d.log.warn({ err }, "advancing runs failed; the next notification or sweep tries again"),
    );
  }

  async start(): Promise<void> {
    this.#unlisten = await this.d.listener.on(this.d.tables.channel(TOPIC), (payload) => {
      if (!payload.startsWith("r")) this.kick();
    });
    this.d.listener.onReconnect(() => this.kick());
    this.kick();
  }

  async stop(): Promise<void> {
    this.#unlisten?.();
    await this.#loop.stop();
  }

  /** Advances every run with due events, once now and again if kicked meanwhile. */
  kick(): void {
    this.#loop.kick();
  }

  /** The sweep: due timeouts, and events whose notification was lost. */
  task(): MaintenanceTask {
    return { name: "engine-advance", run: () => this.advanceDue() };
  }

  /** Advances runs with due events until none is left that another daemon is not advancing; returns how many. */
  async advanceDue(): Promise<number> {
    let n = 0;
    let busy = this.engines;
    while (busy.length > 0) {
      const next: Engine[] = [];
      for (const e of busy)
        if (await this.#advanceOne(e)) {
          n++;
          next.push(e);
        }
      busy = next;
    }
    return n;
  }

  /** One run of `e` with due events advanced; false when none was left to take. */
  #advanceOne(e: Engine): Promise<boolean> {
    return inRunTransaction(this.d, { engine: e.kind, kind: "advance", counted: (advanced: boolean) => advanced }, "its node timed out", async (w) => {
      const events = new EngineEventStore(w.tx, this.d.tables);
      const runId = await events.lockDue(e.kind, e.runTable, w.nowNs);
      if (runId === null) return false;
      const due = await events.take(e.kind, runId, w.nowNs);
      w.events = due.length;
      await e.advance(w, runId, due);
      return true;
    });
  }
}
