/**
 * What the queue's services and sweeps share: the store, the two wake-up channels (work became claimable;
 * work finished) and the directives that tell agents to stop work they no longer hold.
 */
import type { Clock } from "../clock.js";
import type { Config } from "../config.js";
import type { Logger } from "../log.js";
import type { EnqueueRow, Requeued, WorkItemStore } from "../store/work-items.js";
import { invalidArgument } from "../domain/errors.js";
import type { Wakeups } from "./wakeups.js";
import { identifier, optionalText } from "../domain/input.js";
import { EnqueueGroupCommit } from "./enqueue-group-commit.js";
import { WaitingClaims } from "./waiting-claims.js";
import { keyParts, workKey } from "./work-keys.js";
import { ClaimRound } from "./claim-round.js";
import type { AgentScope, DirectiveHub, DirectiveMessage } from "../fleet/directives.js";
import type { MaintenanceTask } from "../maintenance.js";
import type { QueueEvents } from "../observability/metrics.js";

/**
 * How often (by the clock) waiting claims re-check without a wake-up, for work whose notification
 * was lost or never sent (another daemon's clock, a ring that woke a claim whose call then ended).
 */
export const FALLBACK_CHECK_MS = 5_000;

export class WorkQueue {
  /** Enqueue calls share insert statements (group commit). */
  readonly enqueuer: EnqueueGroupCommit;
  /** Waiting claims, offered new items by the enqueuer's inserts; opened and closed by claim rounds only. */
  private readonly waitingClaims: WaitingClaims;

  constructor(
    readonly store: WorkItemStore,
    readonly hub: DirectiveHub,
    /** Rung when items become claimable (by ringWork from outside the queue); armed by claim rounds. */
    private readonly work: Wakeups,
    /** Rung (per tenant) when items finish. */
    readonly done: Wakeups,
    readonly clock: Clock,
    readonly config: Config,
    readonly log: Logger,
    /** What the services and sweeps report for /metrics. */
    readonly events: QueueEvents,
  ) {
    this.waitingClaims = new WaitingClaims(config.instanceId, config.leaseTtl, () => clock.nowMs());
    this.enqueuer = new EnqueueGroupCommit(store, this.waitingClaims, { windowMs: config.enqueueWindow });
  }

  /** Wakeups keys of a scope (its tenants × engine kinds), made once per cached scope. */
  readonly #keysOf = new WeakMap<AgentScope, ReadonlySet<string>>();

  /** A claim round for `agent` (./claim-round.ts): the one way an agent's claim takes work. */
  claimRound(agent: string): ClaimRound {
    return new ClaimRound(
      {
        store: this.store,
        work: this.work,
        waitingClaims: this.waitingClaims,
        clock: this.clock,
        config: this.config,
        events: this.events,
        keysOf: (scope) => {
          let keys = this.#keysOf.get(scope);
          if (!keys) this.#keysOf.set(scope, (keys = new Set(scope.tenants.flatMap((t) => scope.kinds.map((k) => workKey(t, k))))));
          return keys;
        },
      },
      agent,
    );
  }

  /**
   * Wakes claims waiting on `keys` (ANY: every claim) for work that became claimable there; `limit`:
   * how many items, when known, so a ring wakes no more local claims than it has work for.
   */
  ringWork(keys: readonly string[], limit?: number): void {
    this.work.ring(keys, limit);
  }

  /**
   * Items that ended a dispatch under a concurrency key, or with resources reserved, gave them back:
   * claims waiting on their tenant and engine kind may take work now that was passed over while the
   * key was full or the resources taken, and nothing else would wake them (that work was pending
   * all along).
   */
  freed(rows: readonly { freed: string | null; engine_kind: string | null }[]): void {
    const keys = new Set<string>();
    for (const r of rows) if (r.freed !== null && r.engine_kind !== null) keys.add(workKey(r.freed, r.engine_kind));
    if (keys.size > 0) this.work.ring([...keys]);
  }

  /**
   * After an engine's transaction committed: claims are woken for the items it queued (one ring per
   * tenant and engine kind), and the items it cancelled give back what they held and their holders
   * are told to stop.
   */
  async announce(enqueued: readonly EnqueueRow[], revoked: readonly Requeued[], reason: string): Promise<void> {
    const counts = new Map<string, number>();
    for (const r of enqueued) {
      const key = workKey(r.tenant, r.item.engineKind);
      counts.set(key, (counts.get(key) ?? 0) + 1);
    }
    for (const [key, n] of counts) this.work.ring([key], n);
    if (revoked.length === 0) return;
    this.freed(revoked);
    await this.revoke(revoked, reason);
    this.done.ring(["*"]);
  }

  /** Tells each former holder to stop the items taken from it. */
  async revoke(rows: readonly Requeued[], reason: string): Promise<void> {
    const byAgent = new Map<string, DirectiveMessage[]>();
    for (const r of rows) {
      if (!r.agent || !r.token) continue;
      const list = byAgent.get(r.agent) ?? [];
      list.push({ kind: "cancel", workItemId: r.id, leaseToken: r.token, reason });
      byAgent.set(r.agent, list);
    }
    for (const [agent, list] of byAgent) await this.hub.publishMany(agent, list);
  }

  /**
   * Cancels unfinished items of a tenant (by ids, a run, or parents with their children): pending and
   * dispatched ones become cancelled at once, holders are told to stop, waiters are woken.
   */
  async cancel(
    tenant: string,
    req: { ids: readonly string[]; runId: string; parentIds: readonly string[]; reason: string },
    principal: string,
  ): Promise<string[]> {
    const target = {
      ids: req.ids.map((id, i) => identifier(id, `ids[${i}]`)),
      runId: req.runId ? identifier(req.runId, "run_id") : null,
      parentIds: req.parentIds.map((id, i) => identifier(id, `parent_ids[${i}]`)),
    };
    if (target.ids.length === 0 && !target.runId && target.parentIds.length === 0) throw invalidArgument("ids", "name items, a run_id or parent_ids to cancel");
    const reason = optionalText(req.reason, "reason", 1024) ?? `cancelled by ${principal}`;
    const rows = await this.store.cancel(tenant, target, reason, this.clock.nowMs(), principal);
    this.events.cancelled(rows);
    this.freed(rows);
    await this.revoke(rows, reason);
    if (rows.length > 0) this.done.ring(["*"]);
    return rows.map((r) => r.id);
  }

  /** An agent left or was found dead: everything it held goes back now, not when its leases run out. */
  async agentGone(name: string): Promise<void> {
    const now = this.clock.nowMs();
    const rows = await this.store.requeueAgent(name, now, "liveness", `agent '${name}' went inactive`);
    this.events.requeued(rows, "agent_gone");
    this.freed(rows);
    if (rows.length === 0) return;
    this.log.warn({ agent: name, items: rows.length }, "released the work of an inactive agent");
    await this.revoke(rows, "agent inactive");
    this.#afterRequeue(rows);
  }

  /**
   * The leases a broken agent stream pushed and that were not reported go back now, a redelivery
   * spent on each; their holder is told to stop them (it may have reconnected elsewhere).
   */
  async streamBroke(name: string, leases: readonly { id: string; token: string }[]): Promise<void> {
    const rows = await this.store.requeueLeases(name, leases, this.clock.nowMs(), "stream", `the stream of agent '${name}' broke`);
    this.events.requeued(rows, "agent_gone");
    this.freed(rows);
    if (rows.length === 0) return;
    this.log.info({ agent: name, items: rows.length }, "an agent stream broke: its unreported items returned to the queue");
    await this.revoke(rows, "stream broke");
    this.#afterRequeue(rows);
  }

  #afterRequeue(rows: readonly Requeued[]): void {
    // Items that failed for good are finished; the rest become due after their backoff, which the
    // due-wake task notices.
    if (rows.some((r) => r.status === "failed")) this.done.ring(["*"]);
  }

  /**
   * The expiry sweep: one statement, safe when every daemon runs it. What must stay true around an
   * outage (or a start), so that work an agent kept running is neither refused nor run again:
   *
   * - At the first run after this daemon (re)gained the database, before any expiry, the leases of
   *   the agents whose heartbeats reached it within the last liveness window (`inTouch`: the
   *   agents it knows first-hand to be alive, beats received while the database was away
   *   included) are extended to a full TTL from now. Those agents could not renew while the
   *   database was away; they kept working, and their results must be accepted.
   * - For one lease TTL since then it expires nothing: as if every lease had been renewed when the
   *   database came back, which is no more than its holder's next renewal would give it. That is
   *   the time the agents of the other daemons have to be extended likewise (each daemon extends
   *   those it heard from at its own first run back, within a sweep interval or two of this one)
   *   and the time an agent that reaches a daemon only now has to renew (it renews every TTL/3).
   *   A lease granted or renewed since then cannot expire sooner anyway, so the hold-off only
   *   touches leases that ran out while this daemon could not see their holders; an agent that is
   *   gone meanwhile goes inactive by liveness, which gives its work back without waiting for this.
   */
  expiryTask(inTouch: { heardSince(sinceMs: number): string[] }): MaintenanceTask {
    const ttl = this.config.leaseTtl;
    const window = this.config.livenessIntervals * this.config.heartbeatInterval;
    return {
      name: "lease-expiry",
      run: async (now, run) => {
        if (run?.justReached) {
          const agents = inTouch.heardSince(now - window);
          const kept = await this.store.extendHeldLeases(agents, now, ttl, "lease-carry-over");
          if (kept.length > 0)
            this.log.info({ agents: agents.length, items: kept.length }, "database back: leases of the agents heard from during the outage extended");
        }
        if (now - (run?.reachedSinceMs ?? Number.NEGATIVE_INFINITY) < ttl) return;
        const rows = await this.store.requeueExpired(now, "expiry-sweep");
        this.events.requeued(rows, "expired");
        this.freed(rows);
        if (rows.length === 0) return;
        this.log.info({ items: rows.length }, "leases expired: items returned to the queue");
        await this.revoke(rows, "lease expired");
        this.#afterRequeue(rows);
      },
    };
  }

  /** Fails items stranded by their affinity key past the grace (see WorkItemStore.failStranded). */
  strandedTask(): MaintenanceTask {
    return {
      name: "affinity-stranded",
      run: async (now) => {
        const policy = this.config.affinityPolicy === "hold" ? "hold" : "rebind";
        const rows = await this.store.failStranded(now, { policy, graceMs: this.config.affinityGrace }, "affinity-sweep");
        this.events.stranded(rows);
        if (rows.length === 0) return;
        this.log.warn({ items: rows.length, policy }, "items stranded by their affinity key became dead letters");
        this.done.ring(["*"]);
      },
    };
  }

  /**
   * Wakes local claims for items whose backoff or not-before passed since the last run; and every
   * FALLBACK_CHECK_MS, the claims waiting on any key that has a due item at all. That second check is
   * the only timer waiting claims have: one statement per daemon, however many claims wait, and only
   * the claims that can find something run their statement again.
   */
  dueTask(): MaintenanceTask {
    let last = this.clock.nowMs();
    let lastFallback = last;
    return {
      name: "due-wake",
      run: async (now) => {
        if (now <= last) return;
        const pairs = await this.store.dueSince(last, now);
        last = now;
        if (pairs.length > 0) this.work.ringLocal(pairs.map((p) => workKey(p.tenant_key, p.engine_kind)));
        if (now - lastFallback < FALLBACK_CHECK_MS) return;
        lastFallback = now;
        const waited = this.work.waitedKeys();
        if (waited.length === 0) return;
        const due = await this.store.dueKeys(waited.map(keyParts), now);
        if (due.length > 0) this.work.ringLocal(due.map((p) => workKey(p.tenant_key, p.engine_kind)));
      },
    };
  }
}
