/**
 * The agent: registers (with the capacity it detects at start: liveness/capacity.ts), heartbeats
 * and renews its leases from a thread of their own (leases.ts), claims work for its free slots,
 * runs the handlers, reports outcomes in batches, follows the daemon's directives, and survives the
 * daemon going away (see link.ts).
 *
 * Work and directives arrive over the agent stream, or by unary claims against a daemon without it
 * (intake.ts).
 *
 * Shutdown (drain(), stop(), a signal, the daemon's drain) runs in one order, each step bounded,
 * and a drain the daemon orders pauses the agent instead of stopping it: shutdown.ts says how.
 */
import { EventEmitter } from "node:events";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import type { Logger } from "pino";
import { ClaimAhead } from "./claim-ahead.js";
import { readHeartbeatReply } from "./directives.js";
import { Intake } from "./intake.js";
import { AgentFailedError } from "./errors.js";
import type { Directive, HeartbeatResponse } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { Failback } from "./failback.js";
import { heartbeatMounts, type Capacity } from "./liveness/capacity.js";
import { HeartbeatThread } from "./liveness/heartbeat.js";
import { LeaseKeeper } from "./leases.js";
import type { AgentMetrics } from "./metrics.js";
import { isTerminal, Lifecycle, type AgentState } from "./lifecycle.js";
import { errorText, Link, type AgentClient } from "./link.js";
import { resolveOptions, type AgentOptions, type ResolvedOptions } from "./options.js";
import { DEFAULT_HEARTBEAT_MS, register, type Registration } from "./registration.js";
import { Reporter } from "./reporter.js";
import { Shutdown } from "./shutdown.js";
import { onShutdownSignals } from "./signals.js";
import { capacityToRegister, serveMetrics } from "./startup.js";
import { setupTracing } from "./tracing.js";
import type { Interceptor } from "@connectrpc/connect";
import type { ItemOutcome, WorkItem } from "./types.js";
import { statusFromWire, type DaemonStatus } from "./wire.js";
import { Work } from "./work.js";

export type { Registration } from "./registration.js";

/** The agent's events (it is an EventEmitter of these). */
export type AgentEvents = {
  state: [state: AgentState, previous: AgentState];
  /** After every registration: the first, and each one after reconnecting. */
  registered: [registration: Registration];
  /** The connection to the daemon was lost; the agent is reconnecting. */
  disconnected: [error: unknown];
  itemStarted: [item: WorkItem];
  /** An item's outcome; also for one claimed ahead that finished before it started (given back by a drain, cancelled, lease lost). */
  itemFinished: [item: WorkItem, outcome: ItemOutcome];
};

export interface DrainOptions {
  /**
   * When items still running are aborted and given back: a Date, or milliseconds from now.
   * @default gracefulShutdownMs from now
   */
  deadline?: Date | number;
}

export class Agent extends EventEmitter<AgentEvents> {
  readonly name: string;
  readonly #o: ResolvedOptions;
  readonly #log: Logger;
  readonly #life = new Lifecycle();
  readonly #link: Link;
  readonly #reporter: Reporter;
  readonly #leases: LeaseKeeper;
  readonly #intake: Intake;
  readonly #heartbeat: HeartbeatThread;
  readonly #work: Work;
  readonly #shutdown: Shutdown;
  readonly #failback: Failback;
  /** Set by start() when `metricsPort` is given. */
  #metrics: AgentMetrics | undefined;
  #registration: Registration | undefined;
  /** Detected by start(), before the first registration; every registration sends the same. */
  #capacity: Capacity | undefined;
  #error: Error | undefined;
  #starting: Promise<void> | undefined;
  #removeSignalHandlers: (() => void) | undefined;

  constructor(options: AgentOptions) {
    super();
    this.#o = resolveOptions(options);
    this.name = this.#o.name;
    this.#log = this.#o.logger.child({ agent: this.name });
    this.#life.onChange((state, previous) => {
      this.#log.info({ state, previous }, `agent ${state}`);
      this.#emit("state", state, previous);
    });
    // The transports are made here, the metrics (if any) in start(): this one defers to them.
    const counted: Interceptor = (next) => (req) => (this.#metrics ? this.#metrics.interceptor(next)(req) : next(req));
    this.#link = new Link(
      this.#o,
      this.#log,
      {
        register: (client, address) => this.#register(client, address),
        onDisconnected: (err) => {
          this.#metrics?.reconnecting();
          this.#emit("disconnected", err);
        },
        onFatal: (err) => this.#fail(err),
      },
      [counted],
    );
    this.#reporter = new Reporter(this.#link, this.#o, this.#log);
    const ahead = new ClaimAhead(this.#o.slots, this.#o.prefetch);
    this.#work = new Work(
      this.#o,
      this.#reporter,
      this.#log,
      {
        itemStarted: (item) => this.#emit("itemStarted", item),
        itemFinished: (item, outcome) => {
          this.#metrics?.itemFinished(item, outcome);
          this.#emit("itemFinished", item, outcome);
        },
        handlerSettled: (item, ms) => this.#metrics?.handlerSettled(item, ms),
        slotTaken: (busy) => this.#heartbeat.setInFlight(busy),
        slotFreed: (busy) => {
          this.#heartbeat.setInFlight(busy);
          this.#intake.nudge();
        },
        leasesTaken: (runs) => this.#leases.taken(runs),
        leaseDropped: (run) => this.#leases.dropped(run),
      },
      ahead,
    );
    this.#heartbeat = new HeartbeatThread(this.#o, this.#log, {
      onReply: (reply) => this.#onHeartbeatReply(reply),
      onNotFound: () => this.#reregister("the daemon does not know this agent"),
      onReady: () => this.#leases.threadReady(),
      onDown: () => this.#leases.threadDown(),
      onLeasesLost: (leases) => this.#leases.lost(leases),
      held: () => this.#leases.leases(),
    });
    this.#leases = new LeaseKeeper(
      this.#link,
      this.#o,
      this.#heartbeat,
      () => this.#work.held(),
      (run, message) => this.#work.leaseLost(run, message),
      this.#log,
    );
    this.#intake = new Intake(this.#link, this.#o, this.#log, this.#reporter, {
      room: () => this.#work.room,
      answeredAtOnce: (ms) => ahead.claimTook(ms),
      claimed: (result) => this.#metrics?.claimed(result),
      onItems: (items) => this.#work.accept(items, this.#life.state === "running"),
      onStatus: (status, source) => this.#onDaemonStatus(status, undefined, source),
      onDirective: (d) => this.#onDirective(d),
    });
    this.#shutdown = new Shutdown({
      o: this.#o,
      log: this.#log,
      life: this.#life,
      link: this.#link,
      intake: this.#intake,
      work: this.#work,
      reporter: this.#reporter,
      leases: this.#leases,
      heartbeat: this.#heartbeat,
      metrics: () => this.#metrics,
      onLeaving: () => this.#failback.stop(),
      close: () => this.#close(),
    });
    this.#failback = new Failback(this.#o, this.#log, this.#life, this.#link, this.#intake, this.#work, () => this.#shutdown.leaving);
  }

  get state(): AgentState {
    return this.#life.state;
  }

  /** Why the agent failed (state `failed`). */
  get error(): Error | undefined {
    return this.#error;
  }

  /** The latest registration; undefined before the first. */
  get registration(): Registration | undefined {
    return this.#registration;
  }

  /**
   * What the agent registers as its resources (see the `capacity` option): undefined until start()
   * has detected it, and with `capacity: false`.
   */
  get capacity(): Capacity | undefined {
    return this.#capacity;
  }

  /** Handlers running now. */
  get inFlight(): number {
    return this.#work.busy;
  }

  /** `host:port` of the metrics endpoint once start() opened it (see `metricsPort`); undefined otherwise. */
  get metricsAddress(): string | undefined {
    return this.#metrics?.endpoint.address;
  }

  /** The current state, then every transition; ends after `stopped` or `failed`. */
  states(): AsyncGenerator<AgentState, void, undefined> {
    return this.#life.states();
  }

  /**
   * Registers and starts working. Resolves once running (or once stopped, when drain() or stop()
   * came first): a daemon that cannot be reached is retried with backoff meanwhile. Rejects with an
   * AgentFailedError when the daemon refuses the agent.
   */
  start(): Promise<void> {
    return (this.#starting ??= this.#start());
  }

  /** Starts, and resolves when the agent has stopped (rejects when it failed): a worker binary's main. */
  async run(): Promise<void> {
    await this.start();
    if ((await this.#life.settled()) === "failed") throw this.#error;
  }

  /** Shuts down gracefully (see the order in shutdown.ts). Resolves when stopped (or failed). */
  drain(options: DrainOptions = {}): Promise<void> {
    const d = options.deadline;
    const at = d === undefined ? Date.now() + this.#o.gracefulShutdownMs : d instanceof Date ? d.getTime() : Date.now() + d;
    return this.#shutdown.begin(at, "drain requested");
  }

  /** Shuts down now: in-flight items are aborted and given back, then the agent deregisters. */
  stop(): Promise<void> {
    return this.#shutdown.begin(Date.now(), "stop requested");
  }

  async #start(): Promise<void> {
    if (!this.#life.to("starting")) throw new Error(`agent '${this.name}' cannot start: it is ${this.#life.state}`);
    if (this.#o.handleSignals)
      this.#removeSignalHandlers = onShutdownSignals((signal) => {
        this.#log.info({ signal }, "signal received: draining (a second one exits at once)");
        void this.drain();
      }, this.#log);
    try {
      await serveMetrics(
        this.#o,
        this.#log,
        () => this.#work.busy,
        (metrics) => (this.#metrics = metrics),
      );
    } catch (err) {
      this.#fail(err as AgentFailedError);
      throw err;
    }
    this.#capacity = await capacityToRegister(this.#o, this.#log);
    try {
      await this.#heartbeat.prepare(this.#capacity ? heartbeatMounts(this.#capacity, this.#o.mounts) : this.#o.mounts);
    } catch (err) {
      const failed = new AgentFailedError(`agent '${this.name}' cannot heartbeat: ${errorText(err)}`, { cause: err });
      this.#fail(failed);
      throw failed;
    }
    // Before the first claim, whose items' spans need the provider; it never throws (./tracing.ts).
    await setupTracing(this.#log);
    await this.#link.connect();
    // Stopped (or failed) while still connecting: nothing to start.
    if (this.#life.state !== "starting") return;
    const reg = this.#registration!;
    this.#heartbeat.start(reg.heartbeatIntervalMs, this.#link.index);
    this.#intake.follow();
    this.#leases.start(reg.leaseTtlMs);
    this.#life.to("running");
    this.#intake.start();
    if (reg.status === "draining") this.#onDaemonStatus("draining", undefined, "registration");
    this.#failback.schedule();
  }

  async #register(client: AgentClient, address: string): Promise<void> {
    const reg = await register(client, address, this.#o, this.#capacity);
    const again = this.#registration !== undefined;
    this.#registration = reg;
    this.#log.info(
      { id: reg.id, address, status: reg.status, heartbeatIntervalMs: reg.heartbeatIntervalMs, leaseTtlMs: reg.leaseTtlMs },
      again ? "registered again" : "registered",
    );
    if (again) {
      this.#heartbeat.setInterval(reg.heartbeatIntervalMs);
      this.#leases.retime(reg.leaseTtlMs);
    }
    this.#emit("registered", reg);
    if (again && (reg.status === "draining" || reg.status === "active")) this.#onDaemonStatus(reg.status, undefined, "registration");
  }

  // ── The daemon's word ───────────────────────────────────────────────────────────────────────────

  #onDirective(d: Directive): void {
    const k = d.kind;
    if (k.case === "cancel") this.#work.cancel(k.value.workItemId, k.value.leaseToken, k.value.reason || "cancelled");
    else if (k.case === "status")
      this.#onDaemonStatus(
        statusFromWire(k.value.status),
        k.value.drainDeadline ? timestampMs(k.value.drainDeadline) : undefined,
        k.value.reason || "directive",
      );
  }

  #onHeartbeatReply(reply: HeartbeatResponse): void {
    const { status, drainDeadlineAt, cancels } = readHeartbeatReply(reply);
    for (const d of cancels) this.#onDirective(d);
    if (this.#intake.contradicts(status, this.#registration?.heartbeatIntervalMs ?? DEFAULT_HEARTBEAT_MS)) return;
    this.#onDaemonStatus(status, drainDeadlineAt, "heartbeat reply");
  }

  #onDaemonStatus(status: DaemonStatus, deadlineAt: number | undefined, source: string): void {
    const state = this.#life.state;
    const why = `the daemon is draining this agent (${source})`;
    if (status === "draining") {
      if (state === "running") {
        if (this.#o.onDaemonDrain === "exit") void this.#shutdown.begin(deadlineAt ?? Number.POSITIVE_INFINITY, why);
        else void this.#shutdown.pauseForDaemon(deadlineAt ?? Number.POSITIVE_INFINITY, why);
      } else if (state === "draining" && deadlineAt !== undefined) this.#shutdown.tighten(deadlineAt);
    } else if (status === "active" && (state === "paused" || (state === "draining" && !this.#shutdown.leaving))) this.#shutdown.resume(source);
    else if (status === "inactive" && (state === "running" || state === "paused")) this.#reregister(`the daemon marked this agent inactive (${source})`);
  }

  #reregister(why: string): void {
    if (this.#life.state !== "running" && this.#life.state !== "paused") return;
    this.#link.recover(this.#link.generation, new Error(why)).catch(() => undefined);
  }

  // ── The end ─────────────────────────────────────────────────────────────────────────────────────

  #fail(err: AgentFailedError): void {
    if (isTerminal(this.#life.state)) return;
    this.#failback.stop();
    this.#error = err;
    this.#log.error({ err }, "agent failed");
    this.#life.to("failed");
    this.#work.abandonAll(err.message);
    this.#reporter.close();
    this.#leases.stop();
    this.#intake.close();
    void this.#heartbeat.stop();
    this.#close();
    void this.#metrics?.endpoint.close();
  }

  #close(): void {
    this.#shutdown.disarm();
    this.#link.close();
    this.#removeSignalHandlers?.();
    this.#removeSignalHandlers = undefined;
  }

  /** Emits without letting a throwing listener break the agent. */
  #emit<K extends keyof AgentEvents>(event: K, ...args: AgentEvents[K]): void {
    try {
      (this.emit as (e: K, ...a: AgentEvents[K]) => boolean)(event, ...args);
    } catch (err) {
      this.#log.error({ err, event }, "an event listener threw");
    }
  }
}
