/**
 * Follows the daemon's WatchDirectives stream: status changes and cancellations arrive the moment
 * they are issued. The stream ends when its daemon shuts down, and fails when the connection does;
 * either way it is opened again (after the link recovered, with backoff while it keeps failing).
 * Heartbeat replies carry the same directives, so a gap costs at most one heartbeat interval.
 *
 * The stream is the freshest word on the agent's status: a heartbeat reply comes on another
 * connection, through the heartbeat thread, and may have been answered before a drain or undrain
 * the stream has since told of. `contradicts()` says when a reply's status is such older news.
 */
import type { Logger } from "pino";
import { retryDelay, sleep } from "./backoff.js";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import type { Directive, HeartbeatResponse } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { errorText, type Link } from "./link.js";
import type { ResolvedOptions } from "./options.js";
import { statusFromWire, type DaemonStatus } from "./wire.js";

/**
 * A heartbeat reply's status is current; the status directives it carries are history (kept for
 * agents without a stream), so only their drain deadline is used. Its cancels apply as they come.
 */
export function readHeartbeatReply(reply: HeartbeatResponse): { status: DaemonStatus; drainDeadlineAt: number | undefined; cancels: Directive[] } {
  let drainDeadlineAt: number | undefined;
  const cancels: Directive[] = [];
  for (const d of reply.directives) {
    if (d.kind.case === "cancel") cancels.push(d);
    else if (d.kind.case === "status" && d.kind.value.drainDeadline) drainDeadlineAt = timestampMs(d.kind.value.drainDeadline);
  }
  return { status: statusFromWire(reply.status), drainDeadlineAt, cancels };
}

export class DirectiveFollower {
  readonly #stop = new AbortController();
  #loop: Promise<void> | undefined;
  /** The status the stream last said, and when. */
  #heard: { status: DaemonStatus; at: number } | undefined;

  constructor(
    private readonly link: Link,
    private readonly opts: ResolvedOptions,
    private readonly onDirective: (d: Directive) => void,
    private readonly log: Logger,
  ) {}

  start(): void {
    this.#loop ??= this.#run();
  }

  /** The agent stream (channel.ts) said `status`: as fresh a word as this follower's own stream. */
  hear(status: DaemonStatus): void {
    this.#heard = { status, at: Date.now() };
  }

  /** Whether `status` (from a reply) differs from what the stream said less than `withinMs` ago. */
  contradicts(status: DaemonStatus, withinMs: number): boolean {
    return this.#heard !== undefined && this.#heard.status !== status && Date.now() - this.#heard.at < withinMs;
  }

  async stop(): Promise<void> {
    this.#stop.abort();
    await this.#loop;
  }

  async #run(): Promise<void> {
    const signal = this.#stop.signal;
    let failures = 0;
    while (!signal.aborted) {
      const generation = this.link.generation;
      let failed: unknown;
      try {
        for await (const res of this.link.client.watchDirectives({ name: this.opts.name }, { signal })) {
          failures = 0;
          const d = res.directive;
          if (!d) continue;
          if (d.kind.case === "status") this.hear(statusFromWire(d.kind.value.status));
          this.onDirective(d);
        }
        this.log.debug("directive stream ended by the daemon: reopening");
      } catch (err) {
        if (signal.aborted) return;
        failed = err;
        this.log.debug({ err: errorText(err) }, "directive stream failed");
        try {
          await this.link.recover(generation, err, signal);
        } catch {
          return;
        }
      }
      await sleep(retryDelay(failed, failures++, this.opts.reconnect), signal);
    }
  }
}
