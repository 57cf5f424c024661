/**
 * Failback (link.ts goHome): while the agent runs on a daemon other than its home one, it tries
 * to go back every failbackMs (±50 %, so a fleet that failed over together does not move back
 * together), on the stream only at a moment it holds nothing (intake.ts).
 *
 * It stops for good once the process is leaving (a drain, stop or signal) or the agent has stopped
 * or failed; a try that fails is logged at debug and tried again at the next turn.
 */
import type { Logger } from "pino";
import type { Intake } from "./intake.js";
import { isTerminal, type Lifecycle } from "./lifecycle.js";
import { errorText, type Link } from "./link.js";
import type { ResolvedOptions } from "./options.js";
import type { Work } from "./work.js";

export class Failback {
  #timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly o: ResolvedOptions,
    private readonly log: Logger,
    private readonly life: Lifecycle,
    private readonly link: Link,
    private readonly intake: Intake,
    private readonly work: Work,
    /** The process asked to stop: no failback from then on. */
    private readonly leaving: () => boolean,
  ) {}

  /** Arms the next try, when there is another daemon to have failed over to and failbackMs is on. */
  schedule(): void {
    const every = this.o.failbackMs;
    if (every <= 0 || this.o.addresses.length < 2 || this.leaving()) return;
    this.#timer = setTimeout(() => void this.#try(), every * (0.5 + Math.random()));
    this.#timer.unref();
  }

  stop(): void {
    clearTimeout(this.#timer);
  }

  async #try(): Promise<void> {
    const running = () => this.life.state === "running" && !this.leaving();
    try {
      if (running() && this.link.away) {
        const idle = () => this.work.busy === 0 && this.work.held().length === 0;
        // The heartbeat thread stays where it beats: any daemon takes heartbeats, and it moves on by itself when that one goes.
        await this.intake.failback(this.link, idle, running);
      }
    } catch (err) {
      this.log.debug({ err: errorText(err) }, "failback: not this time");
    }
    if (!isTerminal(this.life.state)) this.schedule();
  }
}
