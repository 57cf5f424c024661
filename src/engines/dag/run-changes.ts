/**
 * What a step changed in its run's row: the context keys and node states it set, and the agents of
 * the nodes it ended. A run's row holds its whole plan, context and task list; writing only these
 * keeps an advance's cost to what it did, not to the size of the run.
 */
import type { RunChanges, RunRow } from "../../store/dag-runs.js";

export class RunChangeLog {
  /** What the run's row held when the step began, to write back only what changed (./engine.ts). */
  readonly #nodeSnapshot = new Map<string, string>();
  readonly #contextDirty = new Set<string>();
  readonly #workersDirty = new Set<string>();

  constructor(private readonly run: RunRow) {
    for (const [name, rec] of Object.entries(run.meta.nodes)) this.#nodeSnapshot.set(name, JSON.stringify(rec));
  }

  setContext(key: string, value: unknown): void {
    this.run.context[key] = value;
    this.#contextDirty.add(key);
  }

  setWorker(node: string, agent: string): void {
    this.run.meta.workers[node] = agent;
    this.#workersDirty.add(node);
  }

  changes(): RunChanges {
    const pick = <T>(from: Record<string, T>, keys: Iterable<string>): Record<string, T> => Object.fromEntries([...keys].map((k) => [k, from[k]!]));
    const nodes = Object.entries(this.run.meta.nodes).filter(([name, rec]) => this.#nodeSnapshot.get(name) !== JSON.stringify(rec));
    return {
      context: pick(this.run.context, this.#contextDirty),
      nodes: Object.fromEntries(nodes),
      workers: pick(this.run.meta.workers, this.#workersDirty),
    };
  }
}
