/**
 * The agent's lifecycle, one state at a time:
 *
 * ```
 * initialized ─start()─▶ starting ─registered─▶ running ─drain()/stop()/signal/daemon drain─▶ draining
 *                                                  ▲                                              │
 *                                                  └────────── undrained by the daemon ───────────┤
 *                                                                                                  │
 *                      in-flight finished (or aborted at the deadline), reported: the daemon's drain
 *                      pauses ─▶ paused ─undrained─▶ running; the process's own drain goes on ─▶ drained
 *                                                                                                  ▼
 *                                               stopped ◀─deregistered, connections closed─ drained
 *
 * any state but stopped ─unrecoverable error─▶ failed
 * ```
 *
 * - `initialized`: created, nothing sent yet.
 * - `starting`: registering with the daemon (retried with backoff across addresses until it works).
 * - `running`: registered, heartbeating, claiming work for free slots.
 * - `draining`: claims nothing more; in-flight items finish within the deadline, then whatever
 *   still runs is aborted and given back to the queue. A drain the daemon ordered is undone by an
 *   undrain (back to `running`); one the process asked for is not.
 * - `paused`: the daemon's drain is complete (with `onDaemonDrain: "pause"`): registered,
 *   heartbeating and following directives, claiming nothing, until an undrain (`running`) or the
 *   process's own drain or stop (`drained`).
 * - `drained`: nothing runs and every outcome is reported (or given up on); deregistering.
 * - `stopped`: deregistered, connections closed. Terminal.
 * - `failed`: an unrecoverable error (the daemon refused the token or the registration). Terminal;
 *   `agent.error` says why.
 *
 * A drain from `starting` skips `running`; `stop()` on an `initialized` agent goes straight to
 * `stopped`. Losing the daemon is not a state: the agent keeps its state and reconnects (the
 * `disconnected` and `registered` events report it).
 */
export type AgentState = "initialized" | "starting" | "running" | "draining" | "paused" | "drained" | "stopped" | "failed";

const NEXT: Record<AgentState, readonly AgentState[]> = {
  initialized: ["starting", "stopped"],
  starting: ["running", "draining", "failed", "stopped"],
  running: ["draining", "failed"],
  draining: ["running", "paused", "drained", "failed"],
  paused: ["running", "drained", "failed"],
  drained: ["stopped", "failed"],
  stopped: [],
  failed: [],
};

export const isTerminal = (s: AgentState) => s === "stopped" || s === "failed";

/**
 * Waits for `work` at most `ms`. A shutdown must always finish (an operator's SIGTERM, a
 * supervisor's stop), so no step of it waits on the daemon, or on a connection to it, without a
 * bound like this one. Resolves true when `work` settled in time (its rejection counts as settled:
 * the step is over either way); false when it gave up, after calling `gaveUp`, which logs what the
 * agent stopped waiting for and ends what it can. `work` runs on; its rejection is ignored.
 */
export function within(work: Promise<unknown>, ms: number, gaveUp: () => void): Promise<boolean> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      resolve(false);
      gaveUp();
    }, ms);
    const settled = () => {
      clearTimeout(timer);
      resolve(true);
    };
    work.then(settled, settled);
  });
}

/** Holds the state, refuses transitions the diagram does not have, and tells listeners. */
export class Lifecycle {
  #state: AgentState = "initialized";
  readonly #listeners = new Set<(state: AgentState, prev: AgentState) => void>();

  get state(): AgentState {
    return this.#state;
  }

  /** Moves to `next`; returns false (and changes nothing) when that is not a transition from here. */
  to(next: AgentState): boolean {
    const prev = this.#state;
    if (!NEXT[prev].includes(next)) return false;
    this.#state = next;
    for (const fn of this.#listeners) fn(next, prev);
    return true;
  }

  onChange(fn: (state: AgentState, prev: AgentState) => void): () => void {
    this.#listeners.add(fn);
    return () => this.#listeners.delete(fn);
  }

  /** Resolves when the state is terminal. */
  settled(): Promise<AgentState> {
    if (isTerminal(this.#state)) return Promise.resolve(this.#state);
    return new Promise((resolve) => {
      const off = this.onChange((s) => {
        if (!isTerminal(s)) return;
        off();
        resolve(s);
      });
    });
  }

  /** The current state, then every transition, ending after a terminal state. */
  async *states(): AsyncGenerator<AgentState, void, undefined> {
    const queue: AgentState[] = [this.#state];
    let wake: (() => void) | undefined;
    const off = this.onChange((s) => {
      queue.push(s);
      wake?.();
    });
    try {
      for (;;) {
        const s = queue.shift();
        if (s === undefined) {
          await new Promise<void>((r) => (wake = r));
          wake = undefined;
          continue;
        }
        yield s;
        if (isTerminal(s)) return;
      }
    } finally {
      off();
    }
  }
}
