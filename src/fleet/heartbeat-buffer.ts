/**
 * Coalesced heartbeat writes. A heartbeat RPC only records the latest metrics per agent in memory;
 * a flusher writes everything gathered since the last flush in ONE statement. 1,000 agents beating
 * once a second cost one UPDATE per flush interval, not 1,000 transactions. The worst-case staleness
 * of aiflow_agent.updatedon is one flush interval plus the flush's own duration.
 *
 * A flush is not audited: a beat changes no state anyone decided (metrics and freshness only), and
 * auditing every flush made heartbeats most of the log's bytes.
 * What changes an agent (registration, drain, deregistration, removal, the liveness sweep) is
 * audited where it happens.
 */
import { refusedForContent } from "../db/errors.js";
import type { Logger } from "../log.js";
import { OutageLog } from "../db/outage-log.js";
import type { AgentStore, HeartbeatWrite } from "../store/agents.js";
import type { DirectiveHub } from "./directives.js";

export class HeartbeatBuffer {
  #pending = new Map<string, HeartbeatWrite>();
  /**
   * For each agent whose beat this daemon wrote, that beat's receive time: when the agent's row
   * still shows it, this daemon wrote the agent's last beat, and holds any newer one (see
   * ownBeatsBefore).
   */
  readonly #written = new Map<string, number>();
  /**
   * For each agent, when its latest beat arrived here, written or not: what this daemon knows
   * first-hand of which agents are in touch with it, whether the database is there or not (see
   * heardSince).
   */
  readonly #heard = new Map<string, number>();
  #timer: NodeJS.Timeout | undefined;
  #flushing: Promise<void> | undefined;
  /** A flush requested while another was writing (shared by every such request). */
  #queued: Promise<void> | undefined;

  constructor(
    private readonly agents: AgentStore,
    private readonly hub: DirectiveHub,
    private readonly log: Logger,
    /** Told of each flush that wrote: how many agents, in how many seconds (for /metrics). */
    private readonly onFlushed: (rows: number, seconds: number) => void = () => {},
    /**
     * Told of the agents whose beat this daemon wrote for the first time (since it started, or
     * since it forgot them): until that write their claims could place no work that states
     * requirements (placement trusts only a stored, fresh heartbeat), so claims waiting meanwhile
     * should look again now rather than at the end of their wait.
     */
    private readonly onFirstWritten: (names: readonly string[]) => void = () => {},
  ) {
    this.#outage = new OutageLog(log, "database unavailable: heartbeats stay buffered until it is back");
  }

  /** A flush the database's absence failed keeps its batch for the next (see #write); logged as such. */
  readonly #outage: OutageLog;

  add(write: HeartbeatWrite): void {
    this.#pending.set(write.name, write);
    this.#heard.set(write.name, Math.max(write.at, this.#heard.get(write.name) ?? write.at));
  }

  /** Drops a buffered heartbeat (the agent deregistered; its last beat must not land after). */
  discard(name: string): void {
    this.#pending.delete(name);
    this.#written.delete(name);
    this.#heard.delete(name);
  }

  /**
   * The agents whose beat arrived here at or after `sinceMs`, written or not: those in touch with
   * this daemon since then, even while the database was away (the lease carry-over after an
   * outage extends their leases). One entry per agent that ever beat here, as for #written.
   */
  heardSince(sinceMs: number): string[] {
    const names: string[] = [];
    for (const [name, at] of this.#heard) if (at >= sinceMs) names.push(name);
    return names;
  }

  /**
   * The beats this daemon wrote that arrived before `before`, one per agent with the time it
   * arrived, for the liveness sweep: an agent whose row still shows that time has its last beat
   * from here, so only this daemon can hold a newer one (an agent that moves to another daemon
   * registers there first, which rewrites its row). Forgets those that arrived before
   * `forgetBefore`: an agent forgotten here is judged as one whose last beat came from elsewhere.
   */
  ownBeatsBefore(before: number, forgetBefore: number): { name: string; at: number }[] {
    const own: { name: string; at: number }[] = [];
    for (const [name, at] of this.#written) {
      if (at < forgetBefore) this.#written.delete(name);
      else if (at < before) own.push({ name, at });
    }
    return own;
  }

  get size(): number {
    return this.#pending.size;
  }

  start(intervalMs: number): void {
    this.#timer = setInterval(() => {
      this.flush().catch((err) => {
        if (!this.#outage.note(err)) this.log.error({ err }, "heartbeat flush failed");
      });
    }, intervalMs);
    this.#timer.unref();
  }

  /**
   * Writes what is buffered when it is called. A flush already writing took its batch before this
   * call, so the call waits for it and then flushes again (calls made meanwhile share that flush).
   */
  flush(): Promise<void> {
    const start = () => (this.#flushing = this.#write().finally(() => (this.#flushing = undefined)));
    if (!this.#flushing) return start();
    return (this.#queued ??= this.#flushing
      .catch(() => {})
      .then(() => {
        this.#queued = undefined;
        // A flush started since the previous one ended took its batch after this call too.
        return this.#flushing ?? start();
      }));
  }

  async stop(): Promise<void> {
    clearInterval(this.#timer);
    await this.flush().catch((err) => this.log.error({ err }, "final heartbeat flush failed"));
  }

  async #write(): Promise<void> {
    if (this.#pending.size === 0) return;
    const batch = [...this.#pending.values()];
    this.#pending = new Map();
    try {
      const t0 = performance.now();
      await this.#writeIsolating(batch);
      this.onFlushed(batch.length, (performance.now() - t0) / 1000);
    } catch (err) {
      // The database is away: keep the newest beat of each agent for the next attempt, unless a
      // fresher one arrived.
      for (const b of batch) if (!this.#pending.has(b.name)) this.#pending.set(b.name, b);
      throw err;
    }
  }

  /**
   * Writes a batch; when the database refuses it for its content (not for being away or slow), writes each
   * half on its own, down to the one beat it refuses, which is dropped and logged. One bad row must
   * never hold back every other agent's beats: retried whole forever, it would let them all go
   * inactive. Refusals cannot get past the RPC's validation; this is the line behind it.
   */
  async #writeIsolating(batch: readonly HeartbeatWrite[]): Promise<void> {
    try {
      const rows = await this.agents.writeHeartbeats(batch);
      for (const r of rows) this.hub.remember(r.name, { status: r.status, drain: r.drain });
      const written = new Set(rows.map((r) => r.name));
      const first: string[] = [];
      for (const b of batch) {
        if (written.has(b.name)) {
          if (!this.#written.has(b.name)) first.push(b.name);
          this.#written.set(b.name, b.at);
        } else {
          // Removed since it beat: forgotten, so that its next heartbeat answers NOT_FOUND.
          this.hub.forget(b.name);
          this.#written.delete(b.name);
        }
      }
      if (first.length > 0) this.onFirstWritten(first);
    } catch (err) {
      if (!refusedForContent(err)) throw err;
      if (batch.length === 1) {
        this.log.error({ err, agent: batch[0]!.name }, "the database refused this agent's heartbeat; dropped it");
        return;
      }
      const half = Math.ceil(batch.length / 2);
      // In sequence: a second outage error stops the rest, and the caller keeps the whole batch.
      await this.#writeIsolating(batch.slice(0, half));
      await this.#writeIsolating(batch.slice(half));
    }
  }
}
