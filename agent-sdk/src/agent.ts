/**
 * The agent: registers (with the capacity it detects at start: liveness/capacity.ts), heartbeats
 * and renews its leases from a thread of their own (leases.ts), claims work for its free slots,
 * runs the handlers, reports outcomes in batches, follows the daemon's directives, and survives the
 * daemon going away (see link.ts).
 *
 * Work and directives arrive over the agent stream, or by unary claims against a daemon without it
 * (intake.ts).
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
import { EventEmitter } from "node:events";
import { durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import type { Logger } from "pino";
import { ClaimAhead } from "./claim-ahead.js";
import { readHeartbeatReply } from "./directives.js";
import { Intake } from "./intake.js";
import { AgentFailedError } from "./errors.js";
import { AgentType, type Directive, type HeartbeatResponse } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { capacityToWire, detectCapacity, heartbeatMounts, type Capacity } from "./liveness/capacity.js";
import { HeartbeatThread } from "./liveness/heartbeat.js";
import { LeaseKeeper } from "./leases.js";
import type { AgentMetrics } from "./metrics.js";
import { isTerminal, Lifecycle, within, type AgentState } from "./lifecycle.js";
import { errorText, Link, type AgentClient } from "./link.js";
import { resolveOptions, type AgentOptions, type ResolvedOptions } from "./options.js";
import { Reporter } from "./reporter.js";
import { onShutdownSignals } from "./signals.js";
import { flushTracing, setupTracing } from "./tracing.js";
import type { Interceptor } from "@connectrpc/connect";
import type { ItemOutcome, WorkItem } from "./types.js";
import { statusFromWire, type DaemonStatus } from "./wire.js";
import { Work } from "./work.js";

/** What a registration told the agent. */
export interface Registration {
  /** The agent's id (a ULID), stable across registrations of its name. */
  id: string;
  /** The daemon it registered with. */
  address: string;
  /** True when this registration created the agent. */
  created: boolean;
  heartbeatIntervalMs: number;
  leaseTtlMs: number;
  /** The daemon's view of the agent: `draining` when a drain survived a reconnect. */
  status: DaemonStatus;
}

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

const DEFAULT_HEARTBEAT_MS = 5_000;
const DEFAULT_LEASE_TTL_MS = 30_000;

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
  /** Set by start() when `metricsPort` is given. */
  #metrics: AgentMetrics | undefined;
  #registration: Registration | undefined;
  /** Detected by start(), before the first registration; every registration sends the same. */
  #capacity: Capacity | undefined;
  #error: Error | undefined;
  #starting: Promise<void> | undefined;
  #shutdown: Promise<void> | undefined;
  #failbackTimer: NodeJS.Timeout | undefined;
  #deadlineAt = Number.POSITIVE_INFINITY;
  #deadlineTimer: NodeJS.Timeout | undefined;
  #removeSignalHandlers: (() => void) | undefined;
  /** The process asked to stop (drain(), stop(), a signal): nothing the daemon says resumes it. */
  #leaving = false;
  /** Counts the daemon's drains: a pause whose drain an undrain undid finds a newer count. */
  #drainEpoch = 0;

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
    this.#work = new Work(this.#o, this.#reporter, this.#log, {
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
    }, ahead);
    this.#heartbeat = new HeartbeatThread(this.#o, this.#log, {
      onReply: (reply) => this.#onHeartbeatReply(reply),
      onNotFound: () => this.#reregister("the daemon does not know this agent"),
      onReady: () => this.#leases.threadReady(),
      onDown: () => this.#leases.threadDown(),
      onLeasesLost: (leases) => this.#leases.lost(leases),
      held: () => this.#leases.leases(),
    });
    this.#leases = new LeaseKeeper(this.#link, this.#o, this.#heartbeat, () => this.#work.held(), (run, message) => this.#work.leaseLost(run, message), this.#log);
    this.#intake = new Intake(this.#link, this.#o, this.#log, this.#reporter, {
      room: () => this.#work.room,
      answeredAtOnce: (ms) => ahead.claimTook(ms),
      claimed: (result) => this.#metrics?.claimed(result),
      onItems: (items) => this.#work.accept(items, this.#life.state === "running"),
      onStatus: (status, source) => this.#onDaemonStatus(status, undefined, source),
      onDirective: (d) => this.#onDirective(d),
    });
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

  /** Shuts down gracefully (see the order above). Resolves when stopped (or failed). */
  drain(options: DrainOptions = {}): Promise<void> {
    const d = options.deadline;
    const at = d === undefined ? Date.now() + this.#o.gracefulShutdownMs : d instanceof Date ? d.getTime() : Date.now() + d;
    return this.#beginShutdown(at, "drain requested");
  }

  /** Shuts down now: in-flight items are aborted and given back, then the agent deregisters. */
  stop(): Promise<void> {
    return this.#beginShutdown(Date.now(), "stop requested");
  }

  async #start(): Promise<void> {
    if (!this.#life.to("starting")) throw new Error(`agent '${this.name}' cannot start: it is ${this.#life.state}`);
    if (this.#o.handleSignals)
      this.#removeSignalHandlers = onShutdownSignals((signal) => {
        this.#log.info({ signal }, "signal received: draining (a second one exits at once)");
        void this.drain();
      }, this.#log);
    try {
      await this.#serveMetrics();
    } catch (err) {
      const m = this.#o.metrics!;
      const failed = new AgentFailedError(`agent '${this.name}' cannot serve metrics on ${m.host}:${m.port}: ${listenError(err)}`, { cause: err });
      this.#fail(failed);
      throw failed;
    }
    await this.#detectCapacity();
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
    this.#scheduleFailback();
  }

  /**
   * Failback (link.ts goHome): while the agent runs on a daemon other than its home one, it tries
   * to go back every failbackMs (±50 %, so a fleet that failed over together does not move back
   * together), on the stream only at a moment it holds nothing (intake.ts).
   */
  #scheduleFailback(): void {
    const every = this.#o.failbackMs;
    if (every <= 0 || this.#o.addresses.length < 2 || this.#leaving) return;
    this.#failbackTimer = setTimeout(() => void this.#tryFailback(), every * (0.5 + Math.random()));
    this.#failbackTimer.unref();
  }

  async #tryFailback(): Promise<void> {
    const running = () => this.#life.state === "running" && !this.#leaving;
    try {
      if (running() && this.#link.away) {
        const idle = () => this.#work.busy === 0 && this.#work.held().length === 0;
        // The heartbeat thread stays where it beats: any daemon takes heartbeats, and it moves on by itself when that one goes.
        await this.#intake.failback(this.#link, idle, running);
      }
    } catch (err) {
      this.#log.debug({ err: errorText(err) }, "failback: not this time");
    }
    if (!isTerminal(this.#life.state)) this.#scheduleFailback();
  }

  /** Opens the metrics endpoint when `metricsPort` asks for one (prom-client is loaded only then). */
  async #serveMetrics(): Promise<void> {
    const at = this.#o.metrics;
    if (!at) return;
    const { AgentMetrics } = await import("./metrics.js");
    this.#metrics = new AgentMetrics({ slots: this.#o.slots, inFlight: () => this.#work.busy });
    await this.#metrics.endpoint.listen(at.host, at.port);
    this.#log.info({ address: this.#metrics.endpoint.address }, "serving metrics at /metrics");
  }

  /** Never fails: what cannot be detected is not offered (./liveness/capacity.ts). */
  async #detectCapacity(): Promise<void> {
    const given = this.#o.capacity;
    if (given === false) return;
    this.#capacity = await detectCapacity({ workDir: this.#o.workDir, mounts: this.#o.mounts, override: given, warn: (message) => this.#log.warn(message) });
    this.#log.info({ capacity: this.#capacity }, "capacity to register");
  }

  async #register(client: AgentClient, address: string): Promise<void> {
    const o = this.#o;
    const capacity = this.#capacity ? { capacity: capacityToWire(this.#capacity) } : {};
    const res = await client.register(
      {
        name: o.name,
        httpAddress: o.advertise.http,
        grpcAddress: o.advertise.grpc,
        infraAddress: o.advertise.infra,
        agentVersion: o.agentVersion,
        binaryPath: o.binaryPath,
        agentType: o.agentType === "local" ? AgentType.LOCAL : AgentType.REMOTE,
        metadata: { tags: o.tags, slots: o.slots, tenants: o.tenants, engineKinds: o.engineKinds, models: o.models, ...capacity },
      },
      { timeoutMs: o.rpcTimeoutMs },
    );
    const reg: Registration = {
      id: res.id,
      address,
      created: res.created,
      heartbeatIntervalMs: res.heartbeatInterval ? durationMs(res.heartbeatInterval) : DEFAULT_HEARTBEAT_MS,
      leaseTtlMs: res.leaseTtl ? durationMs(res.leaseTtl) : DEFAULT_LEASE_TTL_MS,
      status: statusFromWire(res.status),
    };
    const again = this.#registration !== undefined;
    this.#registration = reg;
    this.#log.info({ id: reg.id, address, status: reg.status, heartbeatIntervalMs: reg.heartbeatIntervalMs, leaseTtlMs: reg.leaseTtlMs }, again ? "registered again" : "registered");
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
      this.#onDaemonStatus(statusFromWire(k.value.status), k.value.drainDeadline ? timestampMs(k.value.drainDeadline) : undefined, k.value.reason || "directive");
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
        if (this.#o.onDaemonDrain === "exit") void this.#beginShutdown(deadlineAt ?? Number.POSITIVE_INFINITY, why);
        else void this.#pauseForDaemon(deadlineAt ?? Number.POSITIVE_INFINITY, why);
      } else if (state === "draining" && deadlineAt !== undefined) this.#tighten(deadlineAt);
    } else if (status === "active" && (state === "paused" || (state === "draining" && !this.#leaving))) this.#resume(source);
    else if (status === "inactive" && (state === "running" || state === "paused")) this.#reregister(`the daemon marked this agent inactive (${source})`);
  }

  #reregister(why: string): void {
    if (this.#life.state !== "running" && this.#life.state !== "paused") return;
    this.#link.recover(this.#link.generation, new Error(why)).catch(() => undefined);
  }

  // ── Shutdown ────────────────────────────────────────────────────────────────────────────────────

  #beginShutdown(deadlineAt: number, why: string): Promise<void> {
    this.#leaving = true;
    clearTimeout(this.#failbackTimer);
    this.#tighten(deadlineAt);
    return (this.#shutdown ??= this.#shutdownInOrder(why));
  }

  /** Moves the drain deadline earlier (never later), re-arming its timer while a drain runs. */
  #tighten(deadlineAt: number): void {
    if (deadlineAt >= this.#deadlineAt) return;
    this.#deadlineAt = deadlineAt;
    if (this.#life.state === "draining") this.#armDeadline();
  }

  /**
   * The daemon's drain, steps 1 to 3 of the shutdown, then `paused`. An undrain meanwhile (a newer
   * drain epoch) or the process's own shutdown takes over from wherever this has got to.
   */
  async #pauseForDaemon(deadlineAt: number, why: string): Promise<void> {
    const epoch = ++this.#drainEpoch;
    const current = () => epoch === this.#drainEpoch && !this.#leaving && this.#life.state === "draining";
    this.#life.to("draining");
    this.#tighten(deadlineAt);
    this.#startDraining(why);
    await this.#intake.stop();
    await this.#work.nothingRunning();
    if (!current()) return;
    clearTimeout(this.#deadlineTimer);
    // Bounded, but nothing is given up on: the agent stays registered and reports what is left
    // once the daemon answers (a flush that gave up would leave it unable to report after an undrain).
    if (!(await this.#reporter.answered(this.#o.rpcTimeoutMs))) this.#log.warn({ timeoutMs: this.#o.rpcTimeoutMs }, "pausing for the daemon's drain with reports unanswered: they go on being sent");
    if (!current()) return;
    this.#deadlineAt = Number.POSITIVE_INFINITY;
    this.#life.to("paused");
  }

  /** Undrained by the daemon: claims again, unless the process is leaving. */
  #resume(source: string): void {
    if (this.#leaving) return;
    this.#drainEpoch++;
    clearTimeout(this.#deadlineTimer);
    this.#deadlineAt = Number.POSITIVE_INFINITY;
    if (!this.#life.to("running")) return;
    this.#log.info({ source }, "undrained: claiming again");
    this.#intake.start();
  }

  /** What every drain does first: items claimed ahead would not start before it ends, so others run them now. */
  #startDraining(why: string): void {
    this.#work.releaseWaiting();
    const deadlineInMs = Number.isFinite(this.#deadlineAt) ? Math.max(0, this.#deadlineAt - Date.now()) : null;
    this.#log.info({ why, inFlight: this.#work.busy, deadlineInMs }, "draining: claiming nothing more");
    this.#armDeadline();
  }

  #armDeadline(): void {
    clearTimeout(this.#deadlineTimer);
    if (!Number.isFinite(this.#deadlineAt)) return;
    this.#deadlineTimer = setTimeout(() => this.#work.releaseRunning(), Math.max(0, this.#deadlineAt - Date.now()));
  }

  async #shutdownInOrder(why: string): Promise<void> {
    const from = this.#life.state;
    if (isTerminal(from)) return;
    if (from === "initialized") {
      this.#life.to("stopped");
      return;
    }
    // From running; a drain already under way (the daemon's) or a pause carries on from where it is.
    if (from !== "draining" && from !== "paused") this.#life.to("draining");
    this.#startDraining(why);
    // 1. Stop claiming.
    await this.#intake.stop();
    // 2. Wait for in-flight items; the deadline aborts and gives back what still runs.
    await this.#work.nothingRunning();
    clearTimeout(this.#deadlineTimer);
    // 3. Report.
    await this.#reporter.flush(this.#o.rpcTimeoutMs);
    if (!this.#life.to("drained")) return;
    // 4. Deregister, close.
    this.#leases.stop();
    const ms = this.#o.rpcTimeoutMs;
    const heartbeats = within(this.#heartbeat.stop(), ms, () => this.#log.warn({ timeoutMs: ms }, `the heartbeat thread did not end within ${ms} ms: stopping without it`));
    await Promise.all([this.#intake.leave(ms), heartbeats]);
    if (this.#link.generation > 0) await this.#link.deregister(this.name);
    this.#close();
    // The last items' spans leave before the process may exit.
    await flushTracing(this.#o.rpcTimeoutMs);
    await this.#metrics?.endpoint.close();
    this.#life.to("stopped");
  }

  #fail(err: AgentFailedError): void {
    if (isTerminal(this.#life.state)) return;
    clearTimeout(this.#failbackTimer);
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
    clearTimeout(this.#deadlineTimer);
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

/** A listen error in words: the port taken, not allowed, or an address this host does not have. */
function listenError(err: unknown): string {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === "EADDRINUSE") return "the port is in use (EADDRINUSE): give metricsPort a free one, or 0 for any";
  if (code === "EACCES") return "not allowed to listen there (EACCES)";
  if (code === "EADDRNOTAVAIL") return "this host has no such address (EADDRNOTAVAIL): check metricsHost";
  return errorText(err);
}
