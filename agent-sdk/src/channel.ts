/**
 * The agent's Connect stream (AgentService.Connect): one long-lived call to the daemon that carries
 * the agent's credits and reports one way and pushed items, outcomes, status and directives the
 * other. It takes the place of the claim loop and the directive stream while it is open; lease
 * renewals and heartbeats stay on the heartbeat thread, whose own connection a busy handler cannot
 * starve.
 *
 * What must stay true:
 * - Credits follow room: the credits granted on the current stream and not yet used by a push never
 *   exceed the room the agent had when it granted them, so the daemon never pushes more than the
 *   agent can take (it may take fewer later, when the claim-ahead allowance shrinks; those wait).
 * - stop() returns once the daemon has answered the withdrawal: every item pushed under the old
 *   credits has arrived by then (the stream is ordered), so a drain hands over what it still brings.
 *   A daemon that leaves it unanswered for rpcTimeoutMs has its stream ended as broken, and stop()
 *   returns then: a shutdown never waits on a stream without a bound.
 * - A report is answered on the stream it was sent on, or rejected when that stream ends without
 *   answering: the reporter then sends it again after the link recovered (reports are fenced by
 *   lease token, so one applied before the end and sent again is refused, not applied twice).
 * - The end the agent chooses is a goodbye (its unreported items go back spending nothing); any
 *   other end the daemon sees as a break and requeues what it pushed, one redelivery spent.
 * - A daemon without Connect (UNIMPLEMENTED on the first open) is told once (`unsupported`), and the
 *   agent claims by unary calls for the rest of its life.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Logger } from "pino";
import type { ConnectRequestSchema, ConnectResponse, Directive } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { ItemOutcome as WireOutcome, WorkItem as WireItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { retryDelay, sleep } from "./backoff.js";
import { errorText, type Link } from "./link.js";
import type { ClaimResult } from "./metrics.js";
import type { ResolvedOptions } from "./options.js";
import { statusFromWire, type DaemonStatus } from "./wire.js";

type Request = MessageInitShape<typeof ConnectRequestSchema>;
type Completion = NonNullable<Request["completions"]>[number];
type Failure = NonNullable<Request["failures"]>[number];
type LeaseRef = NonNullable<Request["releases"]>[number];

/** The reports the stream carries, by the reporter's kinds. */
export type StreamReport = { kind: "complete"; items: Completion[] } | { kind: "fail"; items: Failure[] } | { kind: "release"; items: LeaseRef[] };

export interface ChannelHooks {
  /** How many items the agent can take now (free slots and the claim-ahead allowance, less those waiting). */
  room(): number;
  onItems(items: WireItem[]): void;
  /** The agent's status, when a response carries it without a status directive (the first one does). */
  onStatus(status: DaemonStatus): void;
  onDirective(d: Directive): void;
  /**
   * Reports were answered `ms` after they were sent: the stream's round trip through one of the
   * daemon's statements, as long as a credit takes to come back as an item when work is queued.
   * (A push itself says nothing about the trip: its credits may have waited for work for any time.)
   */
  answeredAtOnce(ms: number): void;
  claimed?(result: ClaimResult): void;
  /** The daemon does not serve Connect; `taking` says whether the agent was taking work. */
  unsupported(taking: boolean): void;
}

const KIND_FIELD = { complete: "completionOutcomes", fail: "failureOutcomes", release: "releaseOutcomes" } as const;
const REQUEST_FIELD = { complete: "completions", fail: "failures", release: "releases" } as const;

interface Waiter {
  ids: Set<string>;
  sentAt: number;
  outcomes: WireOutcome[];
  resolve(outcomes: WireOutcome[]): void;
  reject(err: unknown): void;
}

/** One open call: its requests, the reports it owes answers for, the withdrawals it owes an answer. */
class Call {
  readonly abort = new AbortController();
  readonly waiting = { complete: new Map<string, Waiter>(), fail: new Map<string, Waiter>(), release: new Map<string, Waiter>() };
  readonly withdrawals: (() => void)[] = [];
  /** The daemon answered (its first response is the agent's status). */
  ready = false;
  /** Anything beyond the first response arrived: the stream works, whatever ends it later. */
  useful = false;
  readonly #queue: Request[] = [];
  #wake: (() => void) | undefined;
  #ended = false;

  push(req: Request): void {
    this.#queue.push(req);
    this.#wake?.();
  }

  /** Half-closes after what is queued. */
  end(): void {
    this.#ended = true;
    this.#wake?.();
  }

  async *requests(): AsyncGenerator<Request> {
    for (;;) {
      while (this.#queue.length > 0) yield this.#queue.shift()!;
      if (this.#ended) return;
      await new Promise<void>((r) => (this.#wake = r));
      this.#wake = undefined;
    }
  }

  /** The call is over: whatever it owes is rejected (reports) or released (withdrawals). */
  settle(err: unknown): void {
    for (const map of Object.values(this.waiting)) {
      for (const w of new Set(map.values())) w.reject(err);
      map.clear();
    }
    for (const w of this.withdrawals.splice(0)) w();
  }
}

export class Channel {
  readonly #closed = new AbortController();
  #loop: Promise<void> | undefined;
  #call: Call | undefined;
  /** The agent wants work (started and not stopped). */
  #taking = false;
  /** Leaving: the stream is not opened again. */
  #leaving = false;
  /** Credits granted on the current call and not yet used by a push. */
  #granted = 0;
  /** The message being gathered this tick. */
  #next: Request | undefined;

  constructor(
    private readonly link: Link,
    private readonly opts: ResolvedOptions,
    private readonly log: Logger,
    private readonly hooks: ChannelHooks,
  ) {}

  /** Opens the stream (and keeps it open) until goodbye() or close(). */
  open(): void {
    this.#loop ??= this.#run();
  }

  /** True while a call the daemon answered is open: reports can travel on it. */
  get ready(): boolean {
    return this.#call?.ready === true;
  }

  /** Takes work: grants credits for the room there is, and more as room frees (nudge). */
  start(): void {
    this.#taking = true;
    this.#topUp();
  }

  /** Room came free. */
  nudge(): void {
    this.#topUp();
  }

  /**
   * Takes no more work; resolves when the daemon has answered the withdrawal, or the call ended, or
   * rpcTimeoutMs passed without either. A shutdown waits on this, so it must not wait on a stream
   * that does not answer: one that leaves the withdrawal unanswered that long is ended as broken,
   * as if the daemon had dropped it, and what the agent holds goes the way it goes for any stream
   * that ends (running items run on and their reports go by unary calls, or on the next stream,
   * once the link recovered; the daemon requeues what it pushed and was not reported).
   */
  stop(): Promise<void> {
    this.#taking = false;
    const call = this.#call;
    if (!call) return Promise.resolve();
    this.#granted = 0;
    const next = this.#gather();
    delete next.credits;
    next.withdrawCredits = true;
    const ms = this.opts.rpcTimeoutMs;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        resolve();
        if (call.abort.signal.aborted) return;
        this.log.warn(
          { timeoutMs: ms },
          `the daemon did not answer the credit withdrawal within ${ms} ms: ending the agent stream as broken and stopping without the answer`,
        );
        call.abort.abort(new ConnectError(`the daemon did not answer the credit withdrawal within ${ms} ms`, Code.DeadlineExceeded));
      }, ms);
      call.withdrawals.push(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  /** Sends reports on the open call; resolves with their outcomes, rejects when the call ends first. */
  report(r: StreamReport): Promise<WireOutcome[]> {
    const call = this.#call;
    if (!call?.ready) return Promise.reject(new ConnectError("the agent stream is not open", Code.Unavailable));
    return new Promise((resolve, reject) => {
      const waiter: Waiter = { ids: new Set(r.items.map((i) => i.workItemId ?? "")), sentAt: performance.now(), outcomes: [], resolve, reject };
      const map = call.waiting[r.kind];
      for (const id of waiter.ids) map.set(id, waiter);
      const next = this.#gather();
      ((next[REQUEST_FIELD[r.kind]] ??= []) as unknown[]).push(...r.items);
    });
  }

  /**
   * Says goodbye and waits (at most `timeoutMs`) for the daemon to end the stream; the stream is
   * not opened again. Everything the agent reports must have been answered before this.
   */
  async goodbye(timeoutMs: number): Promise<void> {
    this.#leaving = true;
    this.#taking = false;
    const call = this.#call;
    if (!call) return this.close();
    this.#flush();
    call.push({ goodbye: true });
    call.end();
    const timer = setTimeout(() => call.abort.abort(), timeoutMs);
    try {
      await this.#loop;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Credits are being granted (start() and no stop() since). */
  get taking(): boolean {
    return this.#taking;
  }

  /**
   * Ends the current call with a goodbye and opens the stream again, on the link's current daemon
   * (after a failback, the home one). The goodbye releases what the old call pushed and was not
   * reported, so this is for an agent that withdrew its credits and holds nothing.
   */
  reopen(): void {
    const call = this.#call;
    if (!call || this.#leaving) return;
    this.#flush();
    call.push({ goodbye: true });
    call.end();
  }

  /** Ends the stream where it stands (the daemon sees a break) and opens it no more. */
  close(): void {
    this.#leaving = true;
    this.#closed.abort();
    this.#call?.abort.abort();
  }

  async #run(): Promise<void> {
    let failures = 0;
    while (!this.#leaving) {
      const generation = this.link.generation;
      const call = new Call();
      let failed: unknown;
      try {
        await this.#converse(call);
        failed = new ConnectError("the daemon ended the agent stream", Code.Unavailable);
      } catch (err) {
        failed = err;
      } finally {
        if (this.#call === call) this.#call = undefined;
        this.#next = undefined;
        this.#granted = 0;
        call.settle(ConnectError.from(failed ?? new ConnectError("the agent stream ended", Code.Unavailable)));
      }
      if (this.#leaving) return;
      if (!call.ready && ConnectError.from(failed).code === Code.Unimplemented) {
        this.log.info("the daemon does not serve the agent stream (Connect): claiming by unary calls");
        this.hooks.unsupported(this.#taking);
        return;
      }
      this.log.debug({ err: errorText(failed) }, "agent stream ended: reopening");
      failures = call.useful ? 0 : failures + 1;
      try {
        await this.link.recover(generation, failed, this.#closed.signal);
      } catch {
        return;
      }
      // A daemon that ends every stream at once (shutting down, say) is not hammered.
      if (failures > 0) await sleep(retryDelay(failed, failures - 1, this.opts.reconnect), this.#closed.signal);
    }
  }

  async #converse(call: Call): Promise<void> {
    this.#call = call;
    this.#granted = 0;
    // The first message names the agent and carries the credits there is room for.
    this.#gather().name = this.opts.name;
    this.#topUp();
    const responses = this.link.client.connect(call.requests(), { signal: AbortSignal.any([call.abort.signal, this.#closed.signal]) });
    try {
      for await (const res of responses) this.#receive(call, res);
    } finally {
      // The daemon's end of the response is the call's end: the request side is let go of too, or
      // the HTTP/2 stream stays half open and a daemon stopping gracefully waits for it.
      call.end();
    }
  }

  #receive(call: Call, res: ConnectResponse): void {
    if (call.ready) call.useful = true;
    call.ready = true;
    let statusDirective = false;
    for (const d of res.directives) {
      statusDirective ||= d.kind.case === "status";
      this.hooks.onDirective(d);
    }
    if (!statusDirective && res.status !== AgentStatus.UNSPECIFIED) this.hooks.onStatus(statusFromWire(res.status));
    if (res.refused !== "") this.log.warn({ refused: res.refused }, "the daemon refused part of a stream message");
    for (const kind of ["release", "fail", "complete"] as const) this.#answer(call.waiting[kind], res[KIND_FIELD[kind]]);
    if (res.creditsWithdrawn) call.withdrawals.shift()?.();
    if (res.items.length > 0) {
      this.#granted = Math.max(0, this.#granted - res.items.length);
      this.hooks.claimed?.("items");
      this.hooks.onItems(res.items);
      this.#topUp();
    }
  }

  #answer(map: Map<string, Waiter>, outcomes: readonly WireOutcome[]): void {
    for (const o of outcomes) {
      const w = map.get(o.workItemId);
      if (!w) continue;
      map.delete(o.workItemId);
      w.ids.delete(o.workItemId);
      w.outcomes.push(o);
      if (w.ids.size > 0) continue;
      this.hooks.answeredAtOnce(performance.now() - w.sentAt);
      w.resolve(w.outcomes);
    }
  }

  /** Grants credits for the room not yet covered by outstanding credits. */
  #topUp(): void {
    if (!this.#taking || !this.#call) return;
    const more = this.hooks.room() - this.#granted;
    if (more <= 0) return;
    this.#granted += more;
    const next = this.#gather();
    next.credits = (next.credits ?? 0) + more;
  }

  /** The message gathered this tick: what is added before it leaves travels in one message. */
  #gather(): Request {
    if (this.#next) return this.#next;
    const next: Request = {};
    this.#next = next;
    setImmediate(() => this.#flush());
    return next;
  }

  #flush(): void {
    const next = this.#next;
    this.#next = undefined;
    if (next && this.#call) this.#call.push(next);
  }
}
