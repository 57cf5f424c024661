/**
 * One claim round: what an agent's claim does between "it may take `want` items" and "here is what
 * it got", for both of the agent's paths — the unary Claim (../rpc/agent-service/work.ts, which
 * only waits for its call's deadline) and the Connect stream's session
 * (../rpc/agent-service/stream-session.ts, which only keeps credits and pushes). The round arms the
 * wake-ups, opens the waiting slot inserts may hand items to (./waiting-claims.ts), makes each
 * dispatch, runs the claim statement with the completions riding on it, decides whether to look
 * again, and closes the slot.
 *
 * The policy (one, for both paths):
 * - Armed before the statement: the round's waiter is armed and its slot opened before the first
 *   look, so an enqueue landing between the statement and the wait still wakes it, and an insert
 *   meanwhile may hand it items while the statement runs and while it waits.
 * - A look runs one claim statement for at most `want` items under a fresh dispatch (the lease runs
 *   from when the statement runs: a statement tried again after the database was away dispatches
 *   anew). The completions given ride that statement and are applied by it, once.
 * - Then the round says what next:
 *   - "again" — it took nothing and lost a race for a key's slots or the agent's resources
 *     (`contended`): what it lost may be there now and no wake-up would say so, so it looks again at
 *     once;
 *   - "more" — it took a full batch (more is likely there), or it took some and a rate limit held
 *     rows back (`heldBack`: those rows took places in the batch and their key is closed now, so
 *     another look fills the places with other work);
 *   - "wait" — otherwise: the queue had nothing more for the agent when the statement ran.
 *   "again" and the held-back "more" together are allowed RACE_RETRIES times in a round (a full
 *   batch's "more" is not counted: it made progress by the whole of what it asked for); past them
 *   the round waits as any other.
 * - Waiting: for a ring on the agent's keys, an insert's offer, or the clock. Work held back by a
 *   rate limit is pending all along, so nothing rings when its key's next slot comes: when the
 *   statement said when that is (`nextSlotMs`), a waiting round looks again then, if sooner —
 *   `wait()` shortens its timeout to it (the unary call), or a round given `onRing` arms one timer
 *   for it when it decides to wait (the stream, which parks without a timeout of its own). No other
 *   timer: a lost NOTIFY is covered by the daemon's one fallback re-check (WorkQueue.dueTask).
 * - Closing disarms the waiter, clears the timer and closes the slot, answering what an insert
 *   handed it; the caller trims claimed and handed items to its room and gives back the rest.
 */
import type { AgentScope } from "../fleet/directives.js";
import type { Clock } from "../clock.js";
import type { Config } from "../config.js";
import type { QueueEvents } from "../observability/metrics.js";
import type { Completed, Completion, WorkItemStore } from "../store/work-items.js";
import { newId } from "../util/ids.js";
import { newDispatch } from "./dispatch.js";
import type { Handed, Slot, WaitingClaims } from "./waiting-claims.js";
import type { Armed, Wakeups } from "./wakeups.js";

/** Looks at once ("again", and "more" for held-back rows) a round may take before it waits as any other. */
export const RACE_RETRIES = 3;

/** What one look of a round found. */
export interface Look {
  /** The items the statement took, under their dispatch; undefined when none. */
  claimed: Handed | undefined;
  /** The completions that matched their leases (those given to the look). */
  completed: readonly Completed[];
  next: "again" | "more" | "wait";
}

/** Runs a statement: at once, or again while the database is away (the stream's). */
export type StatementRunner = <T>(statement: () => Promise<T>) => Promise<T>;

/** What a round needs of the queue. */
export interface ClaimRoundParts {
  store: WorkItemStore;
  work: Wakeups;
  waitingClaims: WaitingClaims;
  clock: Clock;
  config: Config;
  events: QueueEvents;
  keysOf(scope: AgentScope): ReadonlySet<string>;
}

export class ClaimRound {
  #raced = 0;
  #armed: Armed | undefined;
  #slot: Slot | undefined;
  #timer: NodeJS.Timeout | undefined;
  #nextSlotMs: number | null = null;
  #onRing: (() => void) | undefined;

  constructor(
    private readonly q: ClaimRoundParts,
    readonly agent: string,
  ) {}

  /**
   * Arms the wake-ups for the scope's keys and opens the slot, for at most `capacity` items;
   * `onRing` is called on a ring, an offer, or the next slot's time (see the policy).
   */
  open(scope: AgentScope, capacity: number, onRing?: () => void): void {
    const keys = this.q.keysOf(scope);
    this.#onRing = onRing;
    this.#armed = this.q.work.arm(keys, capacity, onRing);
    this.#slot = this.q.waitingClaims.open(this.agent, keys, capacity, this.#armed);
  }

  /** More room for the open slot (credits given while it waits). */
  grow(capacity: number): void {
    if (this.#slot) this.q.waitingClaims.grow(this.#slot, capacity);
  }

  /** One claim statement for at most `want` items, carrying `completions`; says what next (see the policy). */
  async look(want: number, completions: readonly Completion[], scope: AgentScope, run: StatementRunner = (s) => s()): Promise<Look> {
    const { store, clock, config, events } = this.q;
    let dispatch = newDispatch(this.agent, config.instanceId, clock.nowMs(), config.leaseTtl);
    const r = await run(() => {
      const now = clock.nowMs();
      dispatch = newDispatch(this.agent, config.instanceId, now, config.leaseTtl);
      return store.claim({
        agent: this.agent,
        instance: config.instanceId,
        max: want,
        nowMs: now,
        leaseTtlMs: config.leaseTtl,
        affinity: { policy: config.affinityPolicy === "hold" ? "hold" : "rebind", graceMs: config.affinityGrace },
        bindingSeed: newId(now),
        liveEdgeMs: now - config.livenessIntervals * config.heartbeatInterval,
        leaseToken: dispatch.leaseToken,
        completions,
        tenants: scope.tenants.length,
      });
    });
    if (r.heldBack) events.rateHeld();
    this.#nextSlotMs = r.nextSlotMs;
    const n = r.claimed.length;
    let next: Look["next"];
    if (n === 0) next = r.contended && this.#raced++ < RACE_RETRIES ? "again" : "wait";
    else if (n >= want) next = "more";
    else next = r.heldBack && this.#raced++ < RACE_RETRIES ? "more" : "wait";
    if (next === "wait" && this.#onRing && r.nextSlotMs !== null) {
      const ring = this.#onRing;
      clearTimeout(this.#timer);
      this.#timer = setTimeout(ring, Math.max(1, r.nextSlotMs - clock.nowMs()));
    }
    return { claimed: n > 0 ? { rows: [...r.claimed], dispatch } : undefined, completed: r.completed, next };
  }

  /** Waits up to `ms` (less when the last look said when a held-back key opens) for a ring or an offer. */
  async wait(ms: number, signals: readonly AbortSignal[]): Promise<void> {
    const next = this.#nextSlotMs;
    const wait = next === null ? ms : Math.min(ms, Math.max(1, next - this.q.clock.nowMs()));
    await this.#armed?.wait(wait, signals);
  }

  /** Disarms, closes the slot, and answers what an insert handed it. */
  async close(): Promise<Handed | undefined> {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#armed?.disarm();
    this.#armed = undefined;
    const slot = this.#slot;
    this.#slot = undefined;
    const handed = slot ? await this.q.waitingClaims.close(slot) : undefined;
    if (handed) this.q.events.handedDirect(handed.rows.length);
    return handed;
  }
}
