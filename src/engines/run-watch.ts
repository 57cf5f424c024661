/**
 * Watchers of runs, by run id: an engine's save sends `r<run id>` on its channel at commit, and the
 * watchers of that run (WatchRun calls, on any daemon) are called. A change missed while the
 * listener reconnected counts as a change of every watched run. Other payloads on the channel are
 * not this class's (the engine's advance kicks).
 */
import type { PgListener } from "../db/notify.js";
import type { Tables } from "../db/tables.js";

export class RunWatch {
  readonly #watchers = new Map<string, Set<() => void>>();
  #unlisten: (() => void) | undefined;

  constructor(
    private readonly d: { listener: PgListener; tables: Tables },
    /** The channel's topic (Tables.channel). */
    private readonly topic: string,
  ) {}

  async start(): Promise<void> {
    this.#unlisten = await this.d.listener.on(this.d.tables.channel(this.topic), (payload) => {
      if (payload.startsWith("r")) for (const f of this.#watchers.get(payload.slice(1)) ?? []) f();
    });
    this.d.listener.onReconnect(() => {
      for (const set of this.#watchers.values()) for (const f of set) f();
    });
  }

  async stop(): Promise<void> {
    this.#unlisten?.();
  }

  /** Calls `onChange` after each save of the run until the returned function is called. */
  watch(runId: string, onChange: () => void): () => void {
    let set = this.#watchers.get(runId);
    if (!set) this.#watchers.set(runId, (set = new Set()));
    set.add(onChange);
    return () => {
      set.delete(onChange);
      if (set.size === 0) this.#watchers.delete(runId);
    };
  }
}
