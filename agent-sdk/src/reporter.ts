/**
 * Reports outcomes in batches. Completions, failures and releases submitted within
 * `reportCoalesceMs` of each other travel together: one Complete, one Fail and one Release call at
 * most, each answering per item. A batch that fails in transit waits for the link to recover and is
 * sent again (the daemon fences every item by its lease token, so a late report of a lease that
 * meanwhile expired is refused, not applied twice). One item the daemon rejects as invalid does not
 * sink its batch: the batch is split and sent item by item.
 *
 * Completions may instead ride on the next claim (`lend`): a handler that finishes frees a slot, so
 * a claim usually follows within milliseconds, and one call then does both. What a claim could not
 * deliver comes back here and goes the ordinary way.
 *
 * While the agent stream is open (channel.ts, see viaStream) reports travel on it instead, gathered
 * per event-loop turn rather than per coalescing period: a stream message costs no call, and the
 * daemon applies what arrives while it is busy together. Between streams they go by unary calls.
 */
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Logger } from "pino";
import { retryDelay, sleep } from "./backoff.js";
import type { ItemOutcome as WireOutcome } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { errorText, type Link } from "./link.js";
import type { ResolvedOptions } from "./options.js";
import type { Report } from "./report.js";
import type { Channel, StreamReport } from "./channel.js";

/** The daemon's answer for one report, or why there is none. */
export interface ReportResult {
  ok: boolean;
  /** A gRPC code when not ok: FAILED_PRECONDITION means the lease was lost. */
  code: Code;
  message: string;
}

interface Pending {
  report: Report;
  resolve: (r: ReportResult) => void;
}

/** Completions lent to a claim: sent aboard it, then settled from its reply or given back. */
export interface Lent {
  completions: { workItemId: string; leaseToken: string; resultJson: string }[];
  /** The claim's completion outcomes arrived. */
  settle(outcomes: readonly WireOutcome[]): void;
  /** The claim failed: the reporter sends them itself. */
  giveBack(): void;
}

/** How many coalescing periods completions may wait for a claim to carry them. */
const MAX_HOLD_FACTOR = 10;

/** Release first: at a drain deadline, giving items back is what must land. */
const KINDS: readonly Report["kind"][] = ["release", "complete", "fail"];

export class Reporter {
  #queue: Pending[] = [];
  #timer: NodeJS.Timeout | undefined;
  /** When the oldest queued report was submitted (for the hold limit). */
  #oldestAt = 0;
  /** True while a claim that will carry completions is coming (see holdForClaim). */
  #claimComing: () => boolean = () => false;
  /** The agent stream when reports can travel on it (see viaStream). */
  #stream: () => Channel | undefined = () => undefined;
  #soon: NodeJS.Immediate | undefined;
  readonly #sending = new Set<Promise<void>>();
  readonly #giveUp = new AbortController();

  constructor(
    private readonly link: Link,
    private readonly opts: ResolvedOptions,
    private readonly log: Logger,
  ) {}

  /**
   * While `coming()` says a claim will go out without waiting on the daemon (the claimer is busy
   * refilling slots, not parked in a long-poll), queued completions wait for it rather than taking a
   * call of their own, up to MAX_HOLD_FACTOR coalescing periods.
   */
  holdForClaim(coming: () => boolean): void {
    this.#claimComing = coming;
  }

  /** Reports go on the stream `current()` returns while it returns one, by unary calls otherwise. */
  viaStream(current: () => Channel | undefined): void {
    this.#stream = current;
  }

  /** Queues a report; resolves with the daemon's answer for it. */
  submit(report: Report): Promise<ReportResult> {
    if (this.#giveUp.signal.aborted) return Promise.resolve(gaveUp("the agent stopped reporting"));
    return new Promise((resolve) => {
      if (this.#queue.length === 0) this.#oldestAt = Date.now();
      this.#queue.push({ report, resolve });
      if (this.#queue.length >= this.opts.reportMaxBatch) this.#flushNow();
      else if (this.#stream()) this.#soon ??= setImmediate(() => this.#flushNow());
      else this.#timer ??= setTimeout(() => this.#onTimer(), this.opts.reportCoalesceMs);
    });
  }

  #onTimer(): void {
    this.#timer = undefined;
    const holdable = this.#queue.every((p) => p.report.kind === "complete");
    if (holdable && this.#claimComing() && Date.now() - this.#oldestAt < this.opts.reportCoalesceMs * MAX_HOLD_FACTOR)
      this.#timer = setTimeout(() => this.#onTimer(), this.opts.reportCoalesceMs);
    else this.#flushNow();
  }

  /**
   * Sends what is queued and waits until every report is answered. After `timeoutMs` it gives up:
   * what is still unanswered resolves as not reported, and later submissions too.
   */
  async flush(timeoutMs: number): Promise<void> {
    if (!(await this.answered(timeoutMs))) this.close();
  }

  /**
   * Sends what is queued and waits, at most `timeoutMs`, until every report is answered; true when
   * they all were. Unlike flush() it gives up on nothing: what is unanswered goes on being sent
   * (an agent that pauses for the daemon's drain keeps its reports, and reports again once undrained).
   */
  async answered(timeoutMs: number): Promise<boolean> {
    let timedOut = false;
    let wake!: () => void;
    const timeout = new Promise<void>((resolve) => (wake = resolve));
    const timer = setTimeout(() => ((timedOut = true), wake()), timeoutMs);
    try {
      while (!timedOut && (this.#queue.length > 0 || this.#sending.size > 0)) {
        this.#flushNow();
        await Promise.race([Promise.all(this.#sending), timeout]);
      }
      return this.#queue.length === 0 && this.#sending.size === 0;
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Takes up to `max` queued completions for a claim to carry. Until the claim settles or gives them
   * back they count as being sent, so flush() waits for them.
   */
  lend(max: number): Lent | undefined {
    if (this.#giveUp.signal.aborted) return undefined;
    const taken: Pending[] = [];
    const rest: Pending[] = [];
    for (const p of this.#queue) (p.report.kind === "complete" && taken.length < max ? taken : rest).push(p);
    if (taken.length === 0) return undefined;
    this.#queue = rest;
    if (rest.length === 0) {
      clearTimeout(this.#timer);
      this.#timer = undefined;
    }
    let finished!: () => void;
    this.#track(new Promise<void>((resolve) => (finished = resolve)));
    let open = true;
    return {
      completions: completionsOf(taken),
      settle: (outcomes) => {
        if (!open) return;
        open = false;
        settleFrom(taken, outcomes);
        finished();
      },
      giveBack: () => {
        if (!open) return;
        open = false;
        this.#queue.unshift(...taken);
        this.#flushNow();
        finished();
      },
    };
  }

  /** Gives up on everything unanswered. */
  close(): void {
    this.#giveUp.abort();
    this.#flushNow();
  }

  #flushNow(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    clearImmediate(this.#soon);
    this.#soon = undefined;
    while (this.#queue.length > 0) {
      const batch = this.#queue.splice(0, this.opts.reportMaxBatch);
      this.#track(Promise.all(KINDS.map((k) => this.#send(batch.filter((p) => p.report.kind === k)))).then(() => undefined));
    }
  }

  /** Counts a batch as being sent until it settles (flush() waits for these). */
  #track(sending: Promise<void>): void {
    this.#sending.add(sending);
    void sending.finally(() => this.#sending.delete(sending));
  }

  async #send(batch: Pending[]): Promise<void> {
    if (batch.length === 0) return;
    for (let attempt = 0; ; attempt++) {
      if (this.#giveUp.signal.aborted) return settleAll(batch, gaveUp("the daemon did not answer before the agent stopped"));
      const generation = this.link.generation;
      try {
        settleFrom(batch, await this.#call(batch));
        return;
      } catch (err) {
        if (this.#giveUp.signal.aborted) continue;
        const e = ConnectError.from(err);
        if (e.code === Code.InvalidArgument) {
          if (batch.length === 1) return settleAll(batch, { ok: false, code: e.code, message: e.rawMessage });
          await Promise.all(batch.map((p) => this.#send([p])));
          return;
        }
        this.log.debug({ err: errorText(err), items: batch.length, attempt }, "report not delivered: retrying after the link recovers");
        try {
          await this.link.recover(generation, err, this.#giveUp.signal);
        } catch (fatal) {
          return settleAll(batch, gaveUp(errorText(fatal)));
        }
        // A daemon that answers but keeps failing the call (its database is down, say) is not hammered.
        if (attempt > 0) await sleep(retryDelay(err, attempt - 1, this.opts.reconnect), this.#giveUp.signal);
      }
    }
  }

  async #call(batch: Pending[]): Promise<WireOutcome[]> {
    const name = this.opts.name;
    const options = { timeoutMs: this.opts.rpcTimeoutMs, signal: this.#giveUp.signal };
    const client = this.link.client;
    const current = this.#stream();
    const stream = current && { report: (r: StreamReport) => this.#bounded(current.report(r)) };
    const kind = batch[0]!.report.kind;
    if (kind === "complete") {
      const items = completionsOf(batch);
      return stream ? stream.report({ kind, items }) : (await client.complete({ name, items }, options)).outcomes;
    }
    if (kind === "fail") {
      const items = batch.map(({ report: r }) =>
        r.kind === "fail"
          ? {
              workItemId: r.id,
              leaseToken: r.token,
              error: r.error,
              retryable: r.retryable,
              retryDelay: r.retryDelayMs === undefined ? undefined : durationFromMs(r.retryDelayMs),
            }
          : unexpected(r),
      );
      return stream ? stream.report({ kind, items }) : (await client.fail({ name, items }, options)).outcomes;
    }
    const leases = batch.map(({ report: r }) => ({ workItemId: r.id, leaseToken: r.token, drainDeadline: r.kind === "release" && r.drainDeadline === true }));
    return stream ? stream.report({ kind, items: leases }) : (await client.release({ name, leases }, options)).outcomes;
  }

  /** A stream report's answer, bounded like a unary call's: rpcTimeoutMs, and the reporter giving up. */
  #bounded(answer: Promise<WireOutcome[]>): Promise<WireOutcome[]> {
    return new Promise((resolve, reject) => {
      const signal = this.#giveUp.signal;
      const stop = () => reject(new ConnectError("the agent stopped reporting", Code.Canceled));
      const timer = setTimeout(
        () => reject(new ConnectError(`no answer on the agent stream within ${this.opts.rpcTimeoutMs} ms`, Code.DeadlineExceeded)),
        this.opts.rpcTimeoutMs,
      );
      signal.addEventListener("abort", stop, { once: true });
      answer.then(resolve, reject).finally(() => {
        clearTimeout(timer);
        signal.removeEventListener("abort", stop);
      });
    });
  }
}

/** Completion reports on the wire (for Complete, or aboard a claim). */
function completionsOf(batch: readonly Pending[]): Lent["completions"] {
  return batch.map(({ report: r }) => (r.kind === "complete" ? { workItemId: r.id, leaseToken: r.token, resultJson: r.resultJson } : unexpected(r)));
}

/** Resolves each report with the daemon's outcome for its item. */
function settleFrom(batch: readonly Pending[], outcomes: readonly WireOutcome[]): void {
  const byId = new Map(outcomes.map((o) => [o.workItemId, o]));
  for (const p of batch) {
    const o = byId.get(p.report.id);
    p.resolve(
      o ? { ok: o.ok, code: o.code as Code, message: o.message } : { ok: false, code: Code.Internal, message: "the daemon did not answer for this item" },
    );
  }
}

const gaveUp = (message: string): ReportResult => ({ ok: false, code: Code.Unavailable, message });

function settleAll(batch: readonly Pending[], result: ReportResult): void {
  for (const p of batch) p.resolve(result);
}

function unexpected(r: Report): never {
  throw new Error(`a ${r.kind} report in the wrong batch`);
}
