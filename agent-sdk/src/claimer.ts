/**
 * The claim loop: long-polls for as many items as there is room for (the free slots, and what the
 * agent may claim ahead: claim-ahead.ts), hands them over, and waits for a slot when there is no
 * room. A claim that fails hands the failure to the link and tries again once it recovered. The
 * reply's status is the daemon's view of this agent: INACTIVE means register again (the link's
 * recovery does), DRAINING means the daemon is draining it (the agent decides what then).
 *
 * A claim carries the completions queued meanwhile (the reporter lends them): the handlers that just
 * finished are usually why slots are free, so one call reports them and asks for more. Such a claim
 * waits for work only briefly (LENT_WAIT_MS: the daemon applies the completions at once, but their
 * outcomes come back with the reply) and is not cancelled by stop(), so no outcome is lost to a
 * cancel; when it fails, the completions go back to the reporter, which sends them on its own.
 * After items are handed over the loop yields once before claiming again, so that handlers which
 * finish at once have their completions ride that claim instead of a Complete call of their own.
 */
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import type { WorkItem as WireItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import type { Link } from "./link.js";
import type { ResolvedOptions } from "./options.js";
import { retryDelay, sleep } from "./backoff.js";
import { statusFromWire, type DaemonStatus } from "./wire.js";
import type { ClaimResult } from "./metrics.js";
import type { Lent } from "./reporter.js";

/** How long a claim waits for more slots to free before claiming for the few that are. */
const CLAIM_GATHER_MS = 3;
/** The longest a claim carrying completions waits for work (stop() waits for such a claim). */
const LENT_WAIT_MS = 250;

export interface ClaimerHooks {
  /** How many items a claim may ask for now. */
  room(): number;
  /** A claim brought all it asked for (so it did not wait for work) after `ms`. */
  answeredAtOnce(ms: number): void;
  /** A claim came back with items, came back empty, or failed (one cancelled by stop() is none of these). */
  claimed?(result: ClaimResult): void;
  onItems(items: WireItem[]): void;
  onStatus(status: DaemonStatus): void;
  /** Queued completions for the claim to carry, if any. */
  lend(max: number): Lent | undefined;
}

export class Claimer {
  #stop = new AbortController();
  #loop: Promise<void> | undefined;
  #wake: (() => void) | undefined;
  /** In a claim that may wait on the daemon for work and carries nothing (the reporter does not hold completions for it). */
  #longPolling = false;
  /**
   * The last claim brought all it asked for: work is likely queued, so the next claim, carrying
   * nothing or not, answers at once, and completions meanwhile can wait for the one after it.
   */
  #full = false;

  constructor(
    private readonly link: Link,
    private readonly opts: ResolvedOptions,
    private readonly hooks: ClaimerHooks,
  ) {}

  /**
   * Starts the loop; after stop(), starts it again (an undrained agent claims again), once the
   * stopped loop has exited, so two loops never claim at once.
   */
  start(): void {
    if (this.#loop && !this.#stop.signal.aborted) return;
    const previous = this.#loop;
    this.#stop = new AbortController();
    const signal = this.#stop.signal;
    this.#loop = previous ? previous.then(() => this.#run(signal)) : this.#run(signal);
  }

  /** True while a claim is coming that answers at once: the loop runs and is not parked in a long-poll. */
  get refilling(): boolean {
    return this.#loop !== undefined && !this.#stop.signal.aborted && !this.#longPolling;
  }

  /** A slot came free. */
  nudge(): void {
    this.#wake?.();
  }

  /** Stops claiming: the pending long-poll is cancelled. Resolves when the loop has exited. */
  async stop(): Promise<void> {
    this.#stop.abort();
    this.#wake?.();
    await this.#loop;
  }

  async #run(signal: AbortSignal): Promise<void> {
    let failures = 0;
    while (!signal.aborted) {
      const free = this.hooks.room();
      if (free <= 0) {
        await new Promise<void>((resolve) => (this.#wake = resolve));
        this.#wake = undefined;
        continue;
      }
      // One freed slot at a time would mean one claim per item. While others are still busy, wait a
      // moment for a quarter of the slots to come free, so claims (and their leases) go in batches.
      if (free < Math.ceil(this.opts.slots / 4) && free < this.opts.slots) await this.#gather(signal);
      // Ask for what is free now: the gathering was for the slots that came free meanwhile.
      const want = this.hooks.room();
      const generation = this.link.generation;
      const lent = signal.aborted ? undefined : this.hooks.lend(this.opts.reportMaxBatch);
      const lentWait = Math.min(this.opts.claimWaitMs, LENT_WAIT_MS);
      let reply;
      // A claim carrying completions counts as refilling: with work queued it answers at once, and
      // the reporter holds new completions for the next claim only briefly in any case. So does one
      // that follows a full batch: without that, completions that finish while such a claim is out
      // take Complete calls of their own, and the claims after them carry nothing, for as long as
      // the backlog lasts.
      this.#longPolling = lent === undefined && !this.#full;
      const sent = performance.now();
      try {
        reply = await this.link.client
          .claim(
            lent
              ? { name: this.opts.name, maxItems: want, completions: lent.completions, wait: durationFromMs(lentWait), waitWithCompletions: true }
              : { name: this.opts.name, maxItems: want, wait: durationFromMs(this.opts.claimWaitMs) },
            lent ? { timeoutMs: lentWait + this.opts.rpcTimeoutMs } : { signal, timeoutMs: this.opts.claimWaitMs + this.opts.rpcTimeoutMs },
          )
          .finally(() => (this.#longPolling = false));
        lent?.settle(reply.completionOutcomes);
      } catch (err) {
        lent?.giveBack();
        if (signal.aborted) return;
        this.hooks.claimed?.("error");
        if (!(await this.#recover(generation, err, signal))) return;
        // Recovery registers again; a claim that keeps failing after that must not spin.
        if (failures++ > 0) await sleep(retryDelay(err, failures - 2, this.opts.reconnect), signal);
        continue;
      }
      failures = 0;
      this.hooks.claimed?.(reply.items.length > 0 ? "items" : "empty");
      this.#full = reply.items.length > 0 && reply.items.length >= want;
      if (this.#full) this.hooks.answeredAtOnce(performance.now() - sent);
      // Handed over even when stopping meanwhile: the agent gives back what it will not run.
      if (reply.items.length > 0) {
        this.hooks.onItems(reply.items);
        await new Promise<void>((resolve) => setImmediate(resolve));
      }
      const status = statusFromWire(reply.status);
      if (status === "active") continue;
      this.hooks.onStatus(status);
      if (status === "inactive") {
        if (!(await this.#recover(generation, new Error("the daemon says this agent is inactive"), signal))) return;
      } else {
        // Draining (or a status this SDK does not know): the agent stops the loop; do not spin meanwhile.
        await sleep(1_000, signal);
      }
    }
  }

  /** Waits until a quarter of the slots are free, or CLAIM_GATHER_MS passed, or the loop stops. */
  async #gather(signal: AbortSignal): Promise<void> {
    const until = Date.now() + CLAIM_GATHER_MS;
    while (!signal.aborted && this.hooks.room() < Math.ceil(this.opts.slots / 4)) {
      const left = until - Date.now();
      if (left <= 0) return;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.#wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.#wake = undefined;
    }
  }

  /** False when the agent failed for good. */
  async #recover(generation: number, err: unknown, signal: AbortSignal): Promise<boolean> {
    try {
      await this.link.recover(generation, err, signal);
      return true;
    } catch {
      return false;
    }
  }
}
