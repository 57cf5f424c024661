/**
 * How work and the daemon's word reach the agent. By default over the agent stream (channel.ts):
 * credits out, items, outcomes, status and directives in, on one call. Against a daemon without
 * the stream, or with the `stream` option off, by unary claims (claimer.ts) and the WatchDirectives
 * stream (directives.ts). The agent sees one interface either way; which one is in use changes at
 * most once, from the stream to unary calls, when the daemon says it has no stream.
 *
 * stop() and leave() are steps of every shutdown, so each has a bound and says in the log what it
 * stopped waiting for: the stream's own (channel.ts stop()), and here the claim loop's and the
 * goodbye's. What the agent holds when one gives up goes the way it goes for a connection that
 * broke: nothing is dropped by giving up.
 */
import type { Logger } from "pino";
import type { Directive } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import type { WorkItem as WireItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { Channel } from "./channel.js";
import { Claimer } from "./claimer.js";
import { DirectiveFollower } from "./directives.js";
import { within } from "./lifecycle.js";
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
  readonly #opts: ResolvedOptions;
  readonly #log: Logger;
  readonly #claimer: Claimer;
  readonly #directives: DirectiveFollower;
  readonly #channel: Channel | undefined;
  #streaming: boolean;
  #following = false;

  constructor(link: Link, opts: ResolvedOptions, log: Logger, reporter: Reporter, hooks: IntakeHooks) {
    this.#opts = opts;
    this.#log = log;
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

  /**
   * Takes no more; resolves once nothing more is coming (items still on their way are handed over
   * first), or once it stopped waiting for that: the stream gives up after rpcTimeoutMs (channel.ts),
   * the claim loop after the longest its claim in flight may take by its own deadline.
   */
  async stop(): Promise<void> {
    if (this.#streaming) return this.#channel!.stop();
    await this.#claimerStopped();
  }

  /**
   * Moves to the home daemon (Link.goHome) while the agent is on another one. By unary claims the
   * next claim simply goes there (leases are good at any daemon). On the stream the agent first
   * withdraws its credits and moves only if it then holds nothing (`idle`), since the goodbye that
   * ends the old call releases what that call pushed and was not reported; otherwise it takes work
   * again where it is (unless `running` says the agent stopped meanwhile) and tries later.
   * Resolves with whether it moved.
   */
  async failback(link: Link, idle: () => boolean, running: () => boolean): Promise<boolean> {
    const channel = this.#streaming ? this.#channel : undefined;
    if (!channel) return link.goHome();
    if (!channel.taking || !idle()) return false;
    await channel.stop();
    let moved = false;
    try {
      moved = idle() && (await link.goHome());
      if (moved) channel.reopen();
    } finally {
      if (running()) channel.start();
    }
    return moved;
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

  /**
   * The agent leaves: a goodbye on the stream, the claim loop and the directive stream stopped.
   * A daemon that has not ended the stream `timeoutMs` after the goodbye is not waited for: the
   * stream is closed where it stands (the daemon then requeues what it pushed and was not reported;
   * every report was answered or given up on before the goodbye).
   */
  async leave(timeoutMs: number): Promise<void> {
    const channel = this.#channel;
    // The goodbye's own bound (twice ours) is only a backstop: ours fires first, says so, and closes.
    const goodbye =
      channel &&
      within(channel.goodbye(2 * timeoutMs), timeoutMs, () => {
        this.#log.warn({ timeoutMs }, `the daemon did not end the agent stream within ${timeoutMs} ms of the goodbye: closing it without waiting more`);
        channel.close();
      });
    const directives = within(this.#directives.stop(), timeoutMs, () =>
      this.#log.warn({ timeoutMs }, `the directive stream did not end within ${timeoutMs} ms of its cancel: stopping without waiting more`),
    );
    await Promise.all([goodbye, this.#claimerStopped(), directives]);
  }

  /**
   * Stops the claim loop, waiting at most as long as a claim in flight may take by its own deadline
   * (claimWaitMs and rpcTimeoutMs: a long-poll is cancelled at once, but a claim carrying
   * completions is let finish, so that their outcomes are not lost to a cancel).
   */
  #claimerStopped(): Promise<boolean> {
    const ms = this.#opts.claimWaitMs + this.#opts.rpcTimeoutMs;
    return within(this.#claimer.stop(), ms, () =>
      this.#log.warn({ timeoutMs: ms }, `the claim in flight did not end within ${ms} ms: stopping without its answer`),
    );
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
