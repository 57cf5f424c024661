/**
 * Which iterations of a run's fan-out nodes have completed, for one step: the checkpoints it reads
 * (loaded only once the step needs them) and the ones it writes. An iteration that completes
 * before they are loaded is held and applied when they are, so none is lost to the order.
 */
import type { CheckpointWrite, DagRunStore } from "../../store/dag-runs.js";
import { indicesOf, rangesOf } from "./model.js";

export class FanOutProgress {
  /** Completed iteration indices per fan-out node, loaded from the checkpoints when first needed. */
  #done: Map<string, Set<number>> | undefined;
  /** Iterations completed before the checkpoints were loaded (applied in load). */
  readonly #late: { node: string; index: number }[] = [];
  readonly #writes = new Map<string, CheckpointWrite>();

  constructor(
    private readonly runs: DagRunStore,
    private readonly runId: string,
    /** A fan-out node's number of iterations now. */
    private readonly totalOf: (node: string) => number,
  ) {}

  /** An iteration completed: recorded now when the checkpoints are loaded, else when they are. */
  markDone(node: string, index: number): void {
    if (!this.#done) return void this.#late.push({ node, index });
    this.#add(node, index);
  }

  /** Loads the run's checkpoints (once) and applies the iterations that completed before. */
  async load(): Promise<void> {
    if (this.#done && this.#late.length === 0) return;
    if (!this.#done) {
      this.#done = new Map();
      for (const [node, cp] of await this.runs.checkpoints(this.runId)) this.#done.set(node, indicesOf(cp.cursor));
    }
    for (const { node, index } of this.#late.splice(0)) this.#add(node, index);
  }

  /** A fan-out node starts over with `total` iterations, none completed. After load. */
  restart(node: string, total: number): void {
    const none = new Set<number>();
    this.#done!.set(node, none);
    this.#write(node, none, total);
  }

  /** The node's completed iterations. After load. */
  doneOf(node: string): ReadonlySet<number> {
    return this.#done!.get(node) ?? new Set<number>();
  }

  /** The checkpoints this step changed, to save. */
  writes(): CheckpointWrite[] {
    return [...this.#writes.values()];
  }

  #add(node: string, index: number): void {
    const set = this.#done!.get(node) ?? new Set<number>();
    this.#done!.set(node, set);
    set.add(index);
    this.#write(node, set, this.totalOf(node));
  }

  #write(node: string, done: ReadonlySet<number>, total: number): void {
    this.#writes.set(node, { node, cursor: rangesOf(done), idx: done.size, total, done: done.size === total });
  }
}
