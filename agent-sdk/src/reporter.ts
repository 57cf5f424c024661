/**
 * Reports outcomes in batches. Completions, failures and releases submitted within
 * `reportCoalesceMs` of each other travel together: one Complete, one Fail and one Release call at
 * most, each answering per item. A batch that fails in transit waits for the link to recover and is
 * sent again (the daemon fences every item by its lease token, so a late report of a lease that
 * meanwhile expired is refused, not applied twice). One item the daemon rejects as invalid does not
 * sink its batch: the batch is split and sent item by item.
 */
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Logger } from "pino";
import { backoffDelay, sleep } from "./backoff.js";
import type { ItemOutcome as WireOutcome } from "./gen/aiflow/cluster/v1/work_item_pb.js";
import { errorText, type Link } from "./link.js";
import type { ResolvedOptions } from "./options.js";
import type { Report } from "./run.js";

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

/** Release first: at a drain deadline, giving items back is what must land. */
const KINDS: readonly Report["kind"][] = ["release", "complete", "fail"];

export class Reporter {
  #queue: Pending[] = [];
  #timer: NodeJS.Timeout | undefined;
  readonly #sending = new Set<Promise<void>>();
  readonly #giveUp = new AbortController();

  constructor(
    private readonly link: Link,
    private readonly opts: ResolvedOptions,
    private readonly log: Logger,
  ) {}

  /** Queues a report; resolves with the daemon's answer for it. */
  submit(report: Report): Promise<ReportResult> {
    if (this.#giveUp.signal.aborted) return Promise.resolve(gaveUp("the agent stopped reporting"));
    return new Promise((resolve) => {
      this.#queue.push({ report, resolve });
      if (this.#queue.length >= this.opts.reportMaxBatch) this.#flushNow();
      else this.#timer ??= setTimeout(() => this.#flushNow(), this.opts.reportCoalesceMs);
    });
  }

  /**
   * Sends what is queued and waits until every report is answered. After `timeoutMs` it gives up:
   * what is still unanswered resolves as not reported, and later submissions too.
   */
  async flush(timeoutMs: number): Promise<void> {
    const timer = setTimeout(() => this.close(), timeoutMs);
    try {
      while (this.#queue.length > 0 || this.#sending.size > 0) {
        this.#flushNow();
        await Promise.all(this.#sending);
      }
    } finally {
      clearTimeout(timer);
    }
  }

  /** Gives up on everything unanswered. */
  close(): void {
    this.#giveUp.abort();
    this.#flushNow();
  }

  #flushNow(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    while (this.#queue.length > 0) {
      const batch = this.#queue.splice(0, this.opts.reportMaxBatch);
      const sending = Promise.all(KINDS.map((k) => this.#send(batch.filter((p) => p.report.kind === k)))).then(() => undefined);
      this.#sending.add(sending);
      void sending.finally(() => this.#sending.delete(sending));
    }
  }

  async #send(batch: Pending[]): Promise<void> {
    if (batch.length === 0) return;
    for (let attempt = 0; ; attempt++) {
      if (this.#giveUp.signal.aborted) return settleAll(batch, gaveUp("the daemon did not answer before the agent stopped"));
      const generation = this.link.generation;
      try {
        const outcomes = await this.#call(batch);
        const byId = new Map(outcomes.map((o) => [o.workItemId, o]));
        for (const p of batch) {
          const o = byId.get(p.report.id);
          p.resolve(o ? { ok: o.ok, code: o.code as Code, message: o.message } : { ok: false, code: Code.Internal, message: "the daemon did not answer for this item" });
        }
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
        if (attempt > 0) await sleep(backoffDelay(attempt - 1, this.opts.reconnect), this.#giveUp.signal);
      }
    }
  }

  async #call(batch: Pending[]): Promise<WireOutcome[]> {
    const name = this.opts.name;
    const options = { timeoutMs: this.opts.rpcTimeoutMs, signal: this.#giveUp.signal };
    const client = this.link.client;
    const kind = batch[0]!.report.kind;
    if (kind === "complete") {
      const items = batch.map(({ report: r }) => (r.kind === "complete" ? { workItemId: r.id, leaseToken: r.token, resultJson: r.resultJson } : unexpected(r)));
      return (await client.complete({ name, items }, options)).outcomes;
    }
    if (kind === "fail") {
      const items = batch.map(({ report: r }) =>
        r.kind === "fail"
          ? { workItemId: r.id, leaseToken: r.token, error: r.error, retryable: r.retryable, retryDelay: r.retryDelayMs === undefined ? undefined : durationFromMs(r.retryDelayMs) }
          : unexpected(r),
      );
      return (await client.fail({ name, items }, options)).outcomes;
    }
    const leases = batch.map(({ report: r }) => ({ workItemId: r.id, leaseToken: r.token }));
    return (await client.release({ name, leases }, options)).outcomes;
  }
}

const gaveUp = (message: string): ReportResult => ({ ok: false, code: Code.Unavailable, message });

function settleAll(batch: readonly Pending[], result: ReportResult): void {
  for (const p of batch) p.resolve(result);
}

function unexpected(r: Report): never {
  throw new Error(`a ${r.kind} report in the wrong batch`);
}
