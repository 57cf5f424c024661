/**
 * The agent's shutdown, and the daemon's drain that stops short of it.
 *
 * Shutdown always runs in this order, whatever started it (drain(), stop(), a signal, the daemon
 * with `onDaemonDrain: "exit"`):
 *   1. stop claiming: the stream's credits are withdrawn (or the pending long-poll is cancelled),
 *      and items still on their way are given back;
 *   2. wait for in-flight items until the deadline; then abort what still runs (its signal fires
 *      with a `drain-deadline` reason) and give those items back without spending an attempt;
 *   3. report every outcome (bounded by rpcTimeoutMs when the daemon does not answer);
 *   4. say goodbye on the stream, stop heartbeats and the directive stream, deregister (the
 *      daemon marks the agent inactive at once), close the connections.
 * Heartbeats and lease renewals go on until step 4, so a long drain never looks like a dead agent.
 *
 * A shutdown always finishes: no step waits on the daemon without a bound (rpcTimeoutMs, or one
 * derived from it), and a step that gives up says at warn what it gave up on (the withdrawal, a
 * claim, the goodbye, a report, the deregistration). What the agent holds then goes the way it goes
 * when the connection breaks: an item still running runs on and is reported by unary calls, or
 * given back at the deadline; nothing is dropped for having given up. Step 2 is bounded by the
 * deadline (a daemon's drain without one waits for the items, as the operator asked, until the
 * process's own drain or stop sets one). With `handleSignals`, a second signal exits at once.
 *
 * A drain the daemon orders (by default, `onDaemonDrain: "pause"`) runs steps 1 to 3 and then
 * pauses: the agent stays registered, heartbeating and following directives, and an undrain makes
 * it claim again, also midway through the drain. The process's own drain, stop or signal still
 * stops it from any of those states.
 */
import type { Logger } from "pino";
import type { HeartbeatThread } from "./liveness/heartbeat.js";
import type { Intake } from "./intake.js";
import type { LeaseKeeper } from "./leases.js";
import { isTerminal, within, type Lifecycle } from "./lifecycle.js";
import type { Link } from "./link.js";
import type { AgentMetrics } from "./metrics.js";
import type { ResolvedOptions } from "./options.js";
import type { Reporter } from "./reporter.js";
import { flushTracing } from "./tracing.js";
import type { Work } from "./work.js";

/** The agent's parts a shutdown stops, and what it asks of the agent itself. */
export interface ShutdownParts {
  readonly o: ResolvedOptions;
  readonly log: Logger;
  readonly life: Lifecycle;
  readonly link: Link;
  readonly intake: Intake;
  readonly work: Work;
  readonly reporter: Reporter;
  readonly leases: LeaseKeeper;
  readonly heartbeat: HeartbeatThread;
  /** Set by start() when `metricsPort` is given. */
  metrics(): AgentMetrics | undefined;
  /** The process is leaving: what would carry the agent on stops (the failback). */
  onLeaving(): void;
  /** Closes the connections and removes the signal handlers (step 4). */
  close(): void;
}

export class Shutdown {
  #shutdown: Promise<void> | undefined;
  #deadlineAt = Number.POSITIVE_INFINITY;
  #deadlineTimer: NodeJS.Timeout | undefined;
  /** The process asked to stop (drain(), stop(), a signal): nothing the daemon says resumes it. */
  #leaving = false;
  /** Counts the daemon's drains: a pause whose drain an undrain undid finds a newer count. */
  #drainEpoch = 0;

  constructor(private readonly p: ShutdownParts) {}

  get leaving(): boolean {
    return this.#leaving;
  }

  /** The process's own shutdown (the order above), once; a later call can only tighten its deadline. */
  begin(deadlineAt: number, why: string): Promise<void> {
    this.#leaving = true;
    this.p.onLeaving();
    this.tighten(deadlineAt);
    return (this.#shutdown ??= this.#inOrder(why));
  }

  /** Moves the drain deadline earlier (never later), re-arming its timer while a drain runs. */
  tighten(deadlineAt: number): void {
    if (deadlineAt >= this.#deadlineAt) return;
    this.#deadlineAt = deadlineAt;
    if (this.p.life.state === "draining") this.#armDeadline();
  }

  /**
   * The daemon's drain, steps 1 to 3 of the shutdown, then `paused`. An undrain meanwhile (a newer
   * drain epoch) or the process's own shutdown takes over from wherever this has got to.
   */
  async pauseForDaemon(deadlineAt: number, why: string): Promise<void> {
    const { life, o } = this.p;
    const epoch = ++this.#drainEpoch;
    const current = () => epoch === this.#drainEpoch && !this.#leaving && life.state === "draining";
    life.to("draining");
    this.tighten(deadlineAt);
    this.#startDraining(why);
    await this.p.intake.stop();
    await this.p.work.nothingRunning();
    if (!current()) return;
    clearTimeout(this.#deadlineTimer);
    // Bounded, but nothing is given up on: the agent stays registered and reports what is left
    // once the daemon answers (a flush that gave up would leave it unable to report after an undrain).
    if (!(await this.p.reporter.answered(o.rpcTimeoutMs)))
      this.p.log.warn({ timeoutMs: o.rpcTimeoutMs }, "pausing for the daemon's drain with reports unanswered: they go on being sent");
    if (!current()) return;
    this.#deadlineAt = Number.POSITIVE_INFINITY;
    life.to("paused");
  }

  /** Undrained by the daemon: claims again, unless the process is leaving. */
  resume(source: string): void {
    if (this.#leaving) return;
    this.#drainEpoch++;
    clearTimeout(this.#deadlineTimer);
    this.#deadlineAt = Number.POSITIVE_INFINITY;
    if (!this.p.life.to("running")) return;
    this.p.log.info({ source }, "undrained: claiming again");
    this.p.intake.start();
  }

  /** Stops the deadline's timer: the agent is closing (or has failed). */
  disarm(): void {
    clearTimeout(this.#deadlineTimer);
  }

  /** What every drain does first: items claimed ahead would not start before it ends, so others run them now. */
  #startDraining(why: string): void {
    const { work } = this.p;
    work.releaseWaiting();
    const deadlineInMs = Number.isFinite(this.#deadlineAt) ? Math.max(0, this.#deadlineAt - Date.now()) : null;
    this.p.log.info({ why, inFlight: work.busy, deadlineInMs }, "draining: claiming nothing more");
    this.#armDeadline();
  }

  #armDeadline(): void {
    clearTimeout(this.#deadlineTimer);
    if (!Number.isFinite(this.#deadlineAt)) return;
    this.#deadlineTimer = setTimeout(() => this.p.work.releaseRunning(), Math.max(0, this.#deadlineAt - Date.now()));
  }

  async #inOrder(why: string): Promise<void> {
    const { life, o, log } = this.p;
    const from = life.state;
    if (isTerminal(from)) return;
    if (from === "initialized") {
      life.to("stopped");
      return;
    }
    // From running; a drain already under way (the daemon's) or a pause carries on from where it is.
    if (from !== "draining" && from !== "paused") life.to("draining");
    this.#startDraining(why);
    // 1. Stop claiming.
    await this.p.intake.stop();
    // 2. Wait for in-flight items; the deadline aborts and gives back what still runs.
    await this.p.work.nothingRunning();
    clearTimeout(this.#deadlineTimer);
    // 3. Report.
    await this.p.reporter.flush(o.rpcTimeoutMs);
    if (!life.to("drained")) return;
    // 4. Deregister, close.
    this.p.leases.stop();
    const ms = o.rpcTimeoutMs;
    const heartbeats = within(this.p.heartbeat.stop(), ms, () =>
      log.warn({ timeoutMs: ms }, `the heartbeat thread did not end within ${ms} ms: stopping without it`),
    );
    await Promise.all([this.p.intake.leave(ms), heartbeats]);
    if (this.p.link.generation > 0) await this.p.link.deregister(o.name);
    this.p.close();
    // The last items' spans leave before the process may exit.
    await flushTracing(o.rpcTimeoutMs);
    await this.p.metrics()?.endpoint.close();
    life.to("stopped");
  }
}
