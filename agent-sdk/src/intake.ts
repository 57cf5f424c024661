/**
 * How work and the daemon's word reach the agent. By default over the agent stream (channel.ts):
 * credits out, items, outcomes, status and directives in, on one call. Against a daemon without
 * the stream, or with the `stream` option off, by unary claims (claimer.ts) and the WatchDirectives
 * stream (directives.ts). The agent sees one interface either way; which one is in use changes at
 * most once, from the stream to unary calls, when the daemon says it has no stream.
 */
import type { Logger } from "pino";
import type { Directive } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import type { WorkItem as WireItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { Channel } from "./channel.js";
import { Claimer } from "./claimer.js";
import { DirectiveFollower } from "./directives.js";
import type { Link } from "./link.js";
import type { ClaimResult } from "./metrics.js";
import type { ResolvedOptions } from "./options.js";
import type { Reporter } from "./reporter.js";
import { statusFromWire, type DaemonStatus } from "./wire.js";

export interface IntakeHooks {
  /** How many items the agent can take now. */
  room(): number;
  /** A claim (or a push) brought all that was asked for, `ms` after asking: a round trip. */
  answeredAtOnce(ms: number): void;
  claimed?(result: ClaimResult): void;
  onItems(items: WireItem[]): void;
  /** The agent's status as a reply or the stream said it (`source` names which, for the log). */
  onStatus(status: DaemonStatus, source: string): void;
  onDirective(d: Directive): void;
}

export class Intake {
  readonly #claimer: Claimer;
  readonly #directives: DirectiveFollower;
  readonly #channel: Channel | undefined;
  #streaming: boolean;
  #following = false;

  constructor(link: Link, opts: ResolvedOptions, log: Logger, reporter: Reporter, hooks: IntakeHooks) {
    this.#directives = new DirectiveFollower(link, opts, (d) => hooks.onDirective(d), log);
    this.#claimer = new Claimer(link, opts, {
      room: () => hooks.room(),
      answeredAtOnce: (ms) => hooks.answeredAtOnce(ms),
      claimed: (result) => hooks.claimed?.(result),
      onItems: (items) => hooks.onItems(items),
      onStatus: (status) => hooks.onStatus(status, "claim reply"),
      lend: (max) => reporter.lend(max),
    });
    this.#streaming = opts.stream;
    this.#channel = opts.stream
      ? new Channel(link, opts, log, {
          room: () => hooks.room(),
          answeredAtOnce: (ms) => hooks.answeredAtOnce(ms),
          claimed: (result) => hooks.claimed?.(result),
          onItems: (items) => hooks.onItems(items),
          onStatus: (status) => {
            this.#directives.hear(status);
            hooks.onStatus(status, "stream");
          },
          onDirective: (d) => {
            if (d.kind.case === "status") this.#directives.hear(statusFromWire(d.kind.value.status));
            hooks.onDirective(d);
          },
          unsupported: (taking) => this.#fallBack(taking),
        })
      : undefined;
    reporter.holdForClaim(() => !this.#streaming && this.#claimer.refilling);
    reporter.viaStream(() => (this.#streaming && this.#channel!.ready ? this.#channel : undefined));
  }

  /** Begins hearing the daemon's word: opens the stream, or the directive stream. */
  follow(): void {
    this.#following = true;
    if (this.#streaming) this.#channel!.open();
    else this.#directives.start();
  }

  /** Takes work: grants credits, or starts the claim loop (again, after stop()). */
  start(): void {
    if (this.#streaming) this.#channel!.start();
    else this.#claimer.start();
  }

  /** Takes no more; resolves once nothing more is coming (items still on their way are handed over first). */
  stop(): Promise<void> {
    return this.#streaming ? this.#channel!.stop() : this.#claimer.stop();
  }

  /** Room came free. */
  nudge(): void {
    if (this.#streaming) this.#channel!.nudge();
    else this.#claimer.nudge();
  }

  /** Whether a reply's `status` is older news than what a stream said less than `withinMs` ago. */
  contradicts(status: DaemonStatus, withinMs: number): boolean {
    return this.#directives.contradicts(status, withinMs);
  }

  /** The agent leaves: a goodbye on the stream (within `timeoutMs`), the directive stream closed. */
  async leave(timeoutMs: number): Promise<void> {
    await Promise.all([this.#channel?.goodbye(timeoutMs), this.#claimer.stop(), this.#directives.stop()]);
  }

  /** The agent failed: everything ends where it stands. */
  close(): void {
    this.#channel?.close();
    void this.#claimer.stop();
    void this.#directives.stop();
  }

  #fallBack(taking: boolean): void {
    this.#streaming = false;
    if (this.#following) this.#directives.start();
    if (taking) this.#claimer.start();
  }
}
