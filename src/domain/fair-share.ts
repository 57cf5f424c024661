/**
 * Fair share between tenants, and aging inside a tenant: the rules, in the words docs/queue.md uses.
 *
 * Across tenants, fair share decides. Each tenant has a weight (the operator's, set by
 * OpsService.SetTenantWeight; else the configured one, --tenant-weights; else 1). Each item takes a
 * turn when it is enqueued: its tenant's virtual time, which advances by 1/weight per item. A claim
 * by an agent that serves several tenants hands out the earliest turns among the due items it may
 * take, so over any stretch of dispatches each backlogged tenant gets turns in proportion to its
 * weight. A tenant that was idle starts again at the queue's current turn less at most
 * `credit` items' worth (--fair-share-credit): an empty queue banks no more than that. The current
 * turn is the latest turn claims of agents that serve the tenant (and others) handed out, never the
 * earliest pending one, so an item nobody takes gives no one more credit, and it never goes back, so
 * tenants that become busy one after another start from the same turn or later (migration 0015).
 *
 * Inside a tenant, rank decides: a tenant's turn goes to its best due item, by priority (a lower
 * number first), then by enqueue time. With aging (--priority-aging S), waiting S is worth one
 * priority level: an item ranks as if its priority were lower by one for every S it has waited, so
 * an item of priority p is dispatched, at the latest, once it has waited p * S more than the items
 * of priority 0 around it (and its tenant's turn comes). Without aging, priority is strict.
 *
 * An agent that serves one tenant takes that tenant's items by rank; there is no one to share with.
 */

/** The aging step when aging is off: a priority level is worth this many seconds, which is to say priority decides. */
export const NO_AGING_STEP_S = 1e9;
/** Items' worth of turns an idle tenant may bank, unless configured (--fair-share-credit). */
export const DEFAULT_CREDIT = 100;
/** Bounds of a tenant's weight. */
export const MIN_WEIGHT = 0.001;
export const MAX_WEIGHT = 1000;

/**
 * An item's rank inside its tenant (migration 0009's rank column): lower goes first. `agingMs` 0 is
 * aging off. In seconds: priority levels times the step, plus the enqueue time.
 */
export function rankOf(priority: number, enqueuedMs: number, agingMs: number): number {
  const step = agingMs > 0 ? agingMs / 1000 : NO_AGING_STEP_S;
  return priority * step + enqueuedMs / 1000;
}

/** A weight as an operator or a config file gives it: a number within [MIN_WEIGHT, MAX_WEIGHT]; else the reason it is not. */
export function weightProblem(w: number): string | null {
  if (!Number.isFinite(w)) return "is not a number";
  if (w < MIN_WEIGHT || w > MAX_WEIGHT) return `must be between ${MIN_WEIGHT} and ${MAX_WEIGHT}`;
  return null;
}
