/**
 * What one agent stream holds (./stream.ts has the contract): the credits granted and not yet used,
 * the items pushed under a lease and not yet reported through it, and the completions waiting to
 * ride the next claim statement. Never more items pushed than credits granted: a push uses credits,
 * and a grant stops at the cap of items granted and unreported at once.
 */
import { Code } from "@connectrpc/connect";
import type { Completion } from "../../store/work-items.js";

/** Items a stream may hold granted and unreported at once (credits beyond it are not granted). */
export const MAX_OUTSTANDING = 10_000;

/**
 * Items an agent of `slots` registered slots may hold granted and unreported at once: its slots and
 * a claim-ahead allowance of 3 × slots, and never less than 256 in all (slots 0, an agent that
 * registered none, gets 256). The SDKs ask for at most slots + prefetch, and their default
 * prefetch is 3 × slots at most 256 − slots (agent-sdk/src/options.ts, and the Python agent's), so
 * an agent on the defaults never meets this; an agent that grants itself more is refused the rest.
 */
export const creditCap = (slots: number) => Math.min(MAX_OUTSTANDING, Math.max(4 * slots, slots + 256));

export class Ledger {
  /** Pushed under a lease and not yet reported through this stream: id → token. */
  readonly held = new Map<string, string>();
  /** Credits granted and not yet used by a push. */
  credit = 0;
  /** Completions waiting to ride the next claim statement (or be applied alone). */
  completions: Completion[] = [];

  /**
   * Grants what it can of `asked` credits to an agent of `slots` slots; returns what it granted and
   * the cap. Held and not reported: completions already applied from this or an earlier message
   * are reported, though `held` lets them go only once their statement runs.
   */
  grant(asked: number, slots: number): { granted: number; cap: number } {
    let reported = 0;
    for (const c of this.completions) if (this.held.has(c.id)) reported++;
    const cap = creditCap(slots);
    const granted = Math.min(asked, Math.max(0, cap - (this.held.size - reported) - this.credit));
    this.credit += granted;
    return { granted, cap };
  }

  /** Outcomes of releases; a released item is no longer held. */
  released(leases: readonly { id: string }[], ok: readonly string[]) {
    const done = new Set(ok);
    for (const l of leases) if (done.has(l.id)) this.held.delete(l.id);
    return leases.map((l) => ({
      workItemId: l.id,
      ok: done.has(l.id),
      code: done.has(l.id) ? 0 : Code.FailedPrecondition,
      message: done.has(l.id) ? "" : "lease lost",
    }));
  }

  /** The completions queued, to be applied now: their items are no longer held. */
  takeCompletions(): Completion[] {
    const taken = this.completions;
    this.completions = [];
    for (const c of taken) this.held.delete(c.id);
    return taken;
  }

  /** Completions taken whose statement applied nothing: still the agent's to hear about. */
  putBack(completions: Completion[]): void {
    this.completions.unshift(...completions);
  }

  /** Everything still held, which the ledger then lets go (the stream ended). */
  settle(): { id: string; token: string }[] {
    const leases = [...this.held].map(([id, token]) => ({ id, token }));
    this.held.clear();
    return leases;
  }
}
