/**
 * Directives to agents, across every daemon. A directive is published with NOTIFY on one channel;
 * every daemon hears it, pushes it at once to the agent's WatchDirectives stream if the agent is
 * connected there, and also keeps it for the agent's next heartbeat reply, so it reaches a live agent
 * within one heartbeat interval even when no stream is open.
 *
 * The hub also keeps each agent's last known status (the cache heartbeats answer from), fed by
 * registrations, heartbeat flushes and status directives, so a heartbeat never reads the database;
 * it is dropped whenever the listener reconnects, since directives sent meanwhile never arrive.
 *
 * Beside it the hub keeps each agent's work scope (the tenants and engine kinds it registered with),
 * which claims wait on and tenant-limited tokens are checked against. A registration changes it, and
 * every registration of a known agent publishes a status directive: any status directive for an
 * agent drops its scope here, so the next call reads it again.
 */
import type { DatabasePool } from "slonik";
import type { Clock } from "../clock.js";
import { notify, type PgListener } from "../db/notify.js";
import type { Logger } from "../log.js";
import type { AgentStatus, DrainState } from "../store/agents.js";

/** A directive as it travels between daemons (JSON over NOTIFY). */
export type DirectiveMessage =
  | { kind: "status"; status: AgentStatus; reason: string; drainDeadline: number | null }
  | { kind: "cancel"; workItemId: string; leaseToken: string; reason: string };

interface Envelope {
  agent: string;
  directives: DirectiveMessage[];
}

/** Directives per NOTIFY, keeping each payload well under Postgres's 8000-byte limit. */
const PER_NOTIFY = 40;

export interface KnownAgent {
  status: AgentStatus;
  drain: DrainState | null;
}

/** What an agent serves, as it registered: its claims take only items of these tenants and kinds. */
export interface AgentScope {
  tenants: readonly string[];
  kinds: readonly string[];
  /** Items it runs at once, as it registered (0: it gave none); bounds the credits its stream may hold. */
  slots: number;
}

type Subscriber = (d: DirectiveMessage) => void;

export class DirectiveHub {
  readonly #subscribers = new Map<string, Set<Subscriber>>();
  /** Directives waiting for the agent's next heartbeat, with when they were received. */
  readonly #pending = new Map<string, { at: number; directive: DirectiveMessage }[]>();
  readonly #known = new Map<string, KnownAgent>();
  readonly #scopes = new Map<string, { scope: AgentScope; at: number }>();
  readonly #channel: string;

  constructor(
    private readonly pool: DatabasePool,
    channel: string,
    private readonly clock: Clock,
    private readonly log: Logger,
    /** How long an undelivered directive is kept for heartbeat replies. */
    private readonly keepMs: number,
  ) {
    this.#channel = channel;
  }

  async start(listener: PgListener): Promise<void> {
    await listener.on(this.#channel, (payload) => this.#receive(payload));
    // Directives published while the listener was away are lost, and with them any status change
    // (a drain, a removal) the cache should have taken; heartbeats and claims answer from it, so a
    // kept ACTIVE would never end. Forgotten, each agent's next call reads its row again.
    listener.onReconnect(() => {
      if (this.#known.size > 0) this.log.info({ agents: this.#known.size }, "listener reconnected: re-reading agent statuses");
      this.#known.clear();
      this.#scopes.clear();
    });
  }

  /** Sends a directive to an agent, wherever it is connected. */
  publish(agent: string, directive: DirectiveMessage): Promise<void> {
    return this.publishMany(agent, [directive]);
  }

  /** Sends several directives to one agent in as few notifications as fit. */
  async publishMany(agent: string, directives: readonly DirectiveMessage[]): Promise<void> {
    for (let i = 0; i < directives.length; i += PER_NOTIFY) {
      const payload = JSON.stringify({ agent, directives: directives.slice(i, i + PER_NOTIFY) } satisfies Envelope);
      await notify(this.pool, this.#channel, payload);
    }
  }

  /** Subscribes a WatchDirectives stream; returns the unsubscribe function. */
  subscribe(agent: string, fn: Subscriber): () => void {
    let set = this.#subscribers.get(agent);
    if (!set) this.#subscribers.set(agent, (set = new Set()));
    set.add(fn);
    return () => {
      set.delete(fn);
      if (set.size === 0) this.#subscribers.delete(agent);
    };
  }

  /** Takes the directives kept for an agent's heartbeat reply. */
  takePending(agent: string): DirectiveMessage[] {
    const list = this.#pending.get(agent);
    if (!list) return [];
    this.#pending.delete(agent);
    const cutoff = this.clock.nowMs() - this.keepMs;
    return list.filter((p) => p.at >= cutoff).map((p) => p.directive);
  }

  known(agent: string): KnownAgent | undefined {
    return this.#known.get(agent);
  }

  remember(agent: string, state: KnownAgent): void {
    this.#known.set(agent, state);
  }

  forget(agent: string): void {
    this.#known.delete(agent);
    this.#scopes.delete(agent);
  }

  /** The agent's cached scope if it was read less than `maxAgeMs` ago by the hub's clock. */
  scope(agent: string, maxAgeMs: number): AgentScope | undefined {
    const hit = this.#scopes.get(agent);
    return hit && this.clock.nowMs() - hit.at < maxAgeMs ? hit.scope : undefined;
  }

  rememberScope(agent: string, scope: AgentScope): void {
    // Bounded: names of agents long gone must not accumulate.
    if (this.#scopes.size >= 100_000) this.#scopes.clear();
    this.#scopes.set(agent, { scope, at: this.clock.nowMs() });
  }

  forgetScope(agent: string): void {
    this.#scopes.delete(agent);
  }

  /** Drops kept directives nobody collected in time (agents that no longer heartbeat here). */
  prune(): void {
    const cutoff = this.clock.nowMs() - this.keepMs;
    for (const [agent, list] of this.#pending) {
      const fresh = list.filter((p) => p.at >= cutoff);
      if (fresh.length === 0) this.#pending.delete(agent);
      else this.#pending.set(agent, fresh);
    }
  }

  #receive(payload: string): void {
    let env: Envelope;
    try {
      env = JSON.parse(payload) as Envelope;
    } catch {
      this.log.warn({ payload: payload.slice(0, 200) }, "ignoring malformed directive notification");
      return;
    }
    const { agent, directives } = env;
    const list = this.#pending.get(agent) ?? [];
    for (const directive of directives) {
      // Only agents this daemon already knows are updated: a removed agent must not be re-added
      // by its own farewell directive (its next heartbeat reads the database and finds it gone).
      const prev = this.#known.get(agent);
      if (directive.kind === "status") this.#scopes.delete(agent);
      if (directive.kind === "status" && prev) {
        const drain: DrainState | null =
          directive.status !== "draining"
            ? null
            : { ...(prev.drain ?? { startedAt: this.clock.nowMs(), inFlightAtStart: 0, by: "" }), reason: directive.reason, deadline: directive.drainDeadline };
        this.#known.set(agent, { status: directive.status, drain });
      }
      list.push({ at: this.clock.nowMs(), directive });
      for (const fn of this.#subscribers.get(agent) ?? []) fn(directive);
    }
    // Bounded: an agent that never heartbeats again must not grow this forever.
    if (list.length > 1000) list.splice(0, list.length - 1000);
    this.#pending.set(agent, list);
  }
}
