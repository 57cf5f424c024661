/**
 * Follows the daemon's WatchDirectives stream: status changes and cancellations arrive the moment
 * they are issued. The stream ends when its daemon shuts down, and fails when the connection does;
 * either way it is opened again (after the link recovered, with backoff while it keeps failing).
 * Heartbeat replies carry the same directives, so a gap costs at most one heartbeat interval.
 */
import type { Logger } from "pino";
import { backoffDelay, sleep } from "./backoff.js";
import type { Directive } from "./gen/aiflow/cluster/v1/agent_pb.js";
import { errorText, type Link } from "./link.js";
import type { ResolvedOptions } from "./options.js";

export class DirectiveFollower {
  readonly #stop = new AbortController();
  #loop: Promise<void> | undefined;

  constructor(
    private readonly link: Link,
    private readonly opts: ResolvedOptions,
    private readonly onDirective: (d: Directive) => void,
    private readonly log: Logger,
  ) {}

  start(): void {
    this.#loop ??= this.#run();
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
      try {
        for await (const res of this.link.client.watchDirectives({ name: this.opts.name }, { signal })) {
          failures = 0;
          if (res.directive) this.onDirective(res.directive);
        }
        this.log.debug("directive stream ended by the daemon: reopening");
      } catch (err) {
        if (signal.aborted) return;
        this.log.debug({ err: errorText(err) }, "directive stream failed");
        try {
          await this.link.recover(generation, err, signal);
        } catch {
          return;
        }
      }
      await sleep(backoffDelay(failures++, this.opts.reconnect), signal);
    }
  }
}
