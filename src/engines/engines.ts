/**
 * The daemon's engines on their one substrate: each engine, the one advance loop over all of them
 * and the one set of run watchers. The trigger firer and the composition root reach an engine by
 * its kind, through the Engine interface (./engine.ts); the engines' own services take the engine
 * itself.
 */
import { ENGINE_KINDS, type EngineKind } from "../domain/engine-kinds.js";
import type { MaintenanceTask } from "../maintenance.js";
import { Advancer } from "./advancer.js";
import { DagEngine } from "./dag/engine.js";
import type { Engine, EngineDeps } from "./engine.js";
import { GraphEngine } from "./graph/engine.js";
import { MachineEngine } from "./machine/engine.js";
import { TOPIC } from "./run-transaction.js";
import { RunWatch } from "./run-watch.js";

export class Engines {
  readonly dag: DagEngine;
  readonly graphs: GraphEngine;
  readonly machines: MachineEngine;
  readonly #byKind: ReadonlyMap<EngineKind, Engine>;
  readonly #watches: RunWatch;
  readonly #advancer: Advancer;

  constructor(d: EngineDeps) {
    this.#watches = new RunWatch(d, TOPIC);
    this.dag = new DagEngine({ ...d, log: d.log.child({ engine: "dag" }) }, this.#watches);
    this.graphs = new GraphEngine({ ...d, log: d.log.child({ engine: "graph" }) }, this.#watches);
    this.machines = new MachineEngine({ ...d, log: d.log.child({ engine: "statemachine" }) }, this.#watches);
    const all: Engine[] = [this.dag, this.graphs, this.machines];
    this.#byKind = new Map(all.map((e) => [e.kind, e]));
    // Every kind the domain names has its engine (a kind without one would be refused only at run time).
    for (const kind of ENGINE_KINDS) if (!this.#byKind.has(kind)) throw new Error(`no engine is built for engine kind '${kind}'`);
    this.#advancer = new Advancer(d, all);
  }

  /** The engine of `kind`. */
  of(kind: EngineKind): Engine {
    return this.#byKind.get(kind)!;
  }

  /** Listens for events and saves, and advances what is due. */
  async start(): Promise<void> {
    await this.#advancer.start();
    await this.#watches.start();
  }

  async stop(): Promise<void> {
    await this.#advancer.stop();
    await this.#watches.stop();
  }

  /** The maintenance sweep: due timeouts, and events whose notification was lost. */
  task(): MaintenanceTask {
    return this.#advancer.task();
  }

  /** Advances every run with due events now; returns how many steps it took. */
  advanceDue(): Promise<number> {
    return this.#advancer.advanceDue();
  }
}
