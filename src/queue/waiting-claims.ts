/**
 * Hands new items straight to claims already waiting for them. Without it, a new item's path is an
 * insert (pending), a wake-up, and then the woken claim's own statement to take it: a second
 * Postgres round trip, and a claim statement, per item. Here a claim keeps a slot open while its
 * statement runs and while it waits; the Enqueue insert offers its plain items to open slots of their
 * tenant and engine kind, and the insert statement itself writes each offered row dispatched to the
 * slot's agent, under a lease, when the claim would have taken it (WorkItemStore.enqueueRows checks
 * that in the same statement). The claim answers with those rows, with its statement's if it found
 * any (past its max_items, the handed ones go back), and a claim handed items while it waits answers
 * without a statement of its own.
 *
 * Only plain items are offered: due now, with neither worker params nor an affinity key (those need
 * the claim's full rules). What an offer may carry, and the order it keeps, come from the claim rule
 * (../store/work-items/claim-rule.ts: dueNow, offerable, byClaimOrder, comesFirst), which the insert
 * then applies in full. A slot that is offered items stops waiting for wake-ups (its wake-up waiter
 * is disarmed, so rings go to others), and its claim waits for the insert's outcome: the rows it got,
 * or none (the statement refused the offer, or failed), after which it claims as before.
 */
import { msToNs } from "../clock.js";
import type { ClaimedRow, EnqueueResult, EnqueueRow, HandoffInput } from "../store/work-items.js";
import { byClaimOrder, comesFirst, dueNow, offerable } from "../store/work-items/claim-rule.js";
import type { Armed } from "./wakeups.js";
import { workKey } from "./work-keys.js";
import { newDispatch, type Dispatch } from "./dispatch.js";

/** What a slot's claim got: the rows and the dispatch they went under. */
export interface Handed {
  rows: ClaimedRow[];
  dispatch: Dispatch;
}

export interface Slot {
  agent: string;
  /** Wakeups keys of the work the agent serves (tenant and engine kind); null: any. */
  keys: ReadonlySet<string> | null;
  capacity: number;
  armed: Armed;
  state: "open" | "offered" | "closed";
  /** Settles when an offer's insert has an outcome. */
  outcome?: Promise<Handed | undefined>;
}

/** The offers of one insert: what the statement takes, and how its outcome reaches the claims. */
export interface Reservation {
  input: HandoffInput;
  /** Hands each claim its rows (results in the rows' order); undefined: the insert failed. */
  settle(results: readonly EnqueueResult[] | undefined): void;
}

export class WaitingClaims {
  readonly #open = new Set<Slot>();

  constructor(
    private readonly instance: string,
    private readonly leaseTtlMs: number,
    private readonly nowMs: () => number,
  ) {}

  /** A waiting claim's slot; `armed` is the claim's wake-up waiter, disarmed when the slot is offered items. */
  open(agent: string, keys: ReadonlySet<string> | null, capacity: number, armed: Armed): Slot {
    const slot: Slot = { agent, keys, capacity: Math.max(1, capacity), armed, state: "open" };
    this.#open.add(slot);
    return slot;
  }

  /** More room for an open slot (a stream given credits while it waits); an offered or closed one keeps its offer. */
  grow(slot: Slot, capacity: number): void {
    if (slot.state !== "open") return;
    slot.capacity = Math.max(1, capacity);
    slot.armed.setCapacity(slot.capacity);
  }

  /** Closes the slot; when it was offered items, waits for the insert and answers what it got. */
  async close(slot: Slot): Promise<Handed | undefined> {
    this.#open.delete(slot);
    const offered = slot.state === "offered";
    slot.state = "closed";
    return offered ? slot.outcome : undefined;
  }

  /** Open slots: claims that may be offered items now. */
  get waiting(): number {
    return this.#open.size;
  }

  /**
   * Offers the plain rows of an insert to open slots, the longest-waiting first, each up to its
   * capacity, in claim order. A row of a key is not offered when a due row of the same batch that is
   * not offered comes first (claim-rule.ts: the same or a higher priority).
   */
  reserve(rows: readonly EnqueueRow[]): Reservation | undefined {
    if (this.#open.size === 0) return undefined;
    const nowMs = this.nowMs();
    const nowNs = msToNs(nowMs);
    // The highest priority (lowest number) per key among rows a claim could take but no slot may.
    const blocked = new Map<string, number>();
    const plain: number[] = [];
    rows.forEach((r, i) => {
      // A row not yet due is taken by no claim now, so it comes first for nothing.
      if (!dueNow(r.item, nowNs)) return;
      if (!offerable(r.item)) {
        const key = workKey(r.tenant, r.item.engineKind);
        blocked.set(key, Math.min(blocked.get(key) ?? Infinity, r.item.priority));
      } else plain.push(i);
    });
    if (plain.length === 0) return undefined;
    plain.sort(byClaimOrder(rows));
    const agents: (string | null)[] = rows.map(() => null);
    const tokens: (string | null)[] = rows.map(() => null);
    const taken = new Map<Slot, { dispatch: Dispatch; rows: number[] }>();
    const left = new Map<Slot, number>();
    for (const i of plain) {
      const r = rows[i]!;
      const key = workKey(r.tenant, r.item.engineKind);
      if (comesFirst(blocked.get(key), r.item.priority)) continue;
      const slot = this.#slotFor(key, left);
      if (!slot) {
        // No slot left for this key: the rows after this one (not before it in claim order) stay pending too.
        blocked.set(key, Math.min(blocked.get(key) ?? Infinity, r.item.priority));
        continue;
      }
      let t = taken.get(slot);
      if (!t) {
        t = { dispatch: newDispatch(slot.agent, this.instance, nowMs, this.leaseTtlMs), rows: [] };
        taken.set(slot, t);
      }
      t.rows.push(i);
      left.set(slot, (left.get(slot) ?? slot.capacity) - 1);
      agents[i] = slot.agent;
      tokens[i] = t.dispatch.leaseToken;
    }
    if (taken.size === 0) return undefined;
    const resolvers = new Map<Slot, (h: Handed | undefined) => void>();
    for (const slot of taken.keys()) {
      this.#open.delete(slot);
      slot.state = "offered";
      slot.outcome = new Promise((resolve) => resolvers.set(slot, resolve));
      // Rings now go to other claims; this one waits for the insert instead.
      slot.armed.disarm();
    }
    return {
      input: { agents, tokens, instance: this.instance, nowMs, leaseTtlMs: this.leaseTtlMs },
      settle: (results) => {
        for (const [slot, t] of taken) {
          const got = results ? t.rows.flatMap((i) => (results[i]?.claimed ? [results[i]!.claimed!] : [])) : [];
          resolvers.get(slot)!(got.length > 0 ? { rows: got, dispatch: t.dispatch } : undefined);
        }
      },
    };
  }

  #slotFor(key: string, left: ReadonlyMap<Slot, number>): Slot | undefined {
    for (const slot of this.#open) {
      if ((left.get(slot) ?? slot.capacity) <= 0) continue;
      if (slot.keys === null || slot.keys.has(key)) return slot;
    }
    return undefined;
  }
}
