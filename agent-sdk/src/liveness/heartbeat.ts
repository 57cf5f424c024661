/**
 * The main thread's side of the heartbeat thread (thread.js): spawns it before the agent registers
 * and waits until it is ready (loading its modules can take seconds on a loaded host, longer than a
 * short liveness window), tells it to start beating once registered, keeps it told of the interval,
 * the number of items in flight and the leases the agent holds, and hands its replies and lost
 * leases to the agent. Which thread renews the leases is the LeaseKeeper's call (leases.ts).
 *
 * A thread that dies is started again, after saying so (`onDown`), and handed every lease the agent
 * holds at that moment; it says when it is ready (`onReady`) like the first. Liveness must not end
 * because of one bad beat.
 *
 * Leases taken reach the thread at once, before any handler of theirs starts (one that blocks the
 * event loop from its first line must find its lease renewed); leases dropped go together once per
 * turn of the event loop, since a drop that is late costs only a renewal refused as lost.
 */
import { create, fromBinary, toBinary, type DescFile } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import { Worker } from "node:worker_threads";
import type { Logger } from "pino";
import { file_aiflow_cluster_v1_agent, HeartbeatResponseSchema, type HeartbeatResponse } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import type { ResolvedOptions } from "../options.js";
import type { FromThread, Lease, LostLease, ThreadInit, ToThread } from "./protocol.js";

export interface HeartbeatHooks {
  onReply(reply: HeartbeatResponse): void;
  /** The daemon does not know this agent (its row is gone): register again. */
  onNotFound(): void;
  /** A thread (the first, or one started again) is ready to beat and renew. */
  onReady(): void;
  /** The thread died; another is starting. */
  onDown(): void;
  /** The daemon said these leases are no longer held. */
  onLeasesLost(leases: LostLease[]): void;
  /** Every lease the agent holds now, for a thread started again. */
  held(): Lease[];
}

const THREAD = new URL("./thread.js", import.meta.url);
const RESTART_DELAY_MS = 1_000;

export class HeartbeatThread {
  #worker: Worker | undefined;
  #init: ThreadInit | undefined;
  #started: { intervalMs: number; addressIndex: number } | undefined;
  readonly #inFlight = new Int32Array(new SharedArrayBuffer(4));
  #stopped = false;
  /** Consecutive failed beats, to warn once per outage rather than on every beat. */
  #failures = 0;
  /** Consecutive failed renewal rounds, likewise. */
  #renewalFailures = 0;
  #drops: Lease[] = [];
  #dropFlush: NodeJS.Immediate | undefined;

  constructor(
    private readonly opts: ResolvedOptions,
    private readonly log: Logger,
    private readonly hooks: HeartbeatHooks,
  ) {}

  /**
   * Spawns the thread, whose heartbeats report the disks of `mounts` (the registered ones first, in
   * their order); resolves once it is ready to beat (it does not beat yet). Rejects when it cannot
   * start at all (thread.js missing from a bundle, say).
   */
  prepare(mounts: readonly string[]): Promise<void> {
    this.#init ??= {
      name: this.opts.name,
      baseUrls: this.opts.urls,
      // The thread reads the files itself (and again when they change), falling back on these.
      tls: this.opts.tls ? { source: this.opts.tlsSource ?? {}, initial: this.opts.tls.current() } : undefined,
      token: this.opts.token,
      rpcTimeoutMs: this.opts.rpcTimeoutMs,
      mounts: [...mounts],
      metricsOverride: this.opts.heartbeatMetrics,
      descriptorSet: descriptorSet(file_aiflow_cluster_v1_agent),
      inFlight: this.#inFlight.buffer as SharedArrayBuffer,
    };
    if (this.#stopped) return Promise.resolve();
    const worker = this.#worker ?? this.#spawn();
    return new Promise((resolve, reject) => {
      const onMessage = (m: FromThread) => m.type === "ready" && done();
      const onExit = (code: number) => done(new Error(`the heartbeat thread exited with code ${code} before it was ready (${THREAD.href})`));
      const done = (err?: Error) => {
        worker.off("message", onMessage).off("exit", onExit);
        if (err && !this.#stopped) reject(err);
        else resolve();
      };
      worker.on("message", onMessage).on("exit", onExit);
    });
  }

  /** Beats now, then every `intervalMs`, first to the daemon at `addressIndex`. */
  start(intervalMs: number, addressIndex: number): void {
    this.#started = { intervalMs, addressIndex };
    this.#post({ type: "start", intervalMs, addressIndex });
  }

  setInterval(ms: number): void {
    if (this.#started) this.#started.intervalMs = ms;
    this.#post({ type: "interval", ms });
  }

  setInFlight(count: number): void {
    Atomics.store(this.#inFlight, 0, count);
  }

  /** The thread renews the leases it holds every third of `ttlMs`, first at the daemon at `addressIndex`; 0 stops it. */
  renew(ttlMs: number, addressIndex: number): void {
    this.#post({ type: "renew", ttlMs, addressIndex });
  }

  /** Leases claimed: posted at once. */
  hold(leases: Lease[]): void {
    if (leases.length === 0) return;
    // Drops first: one of them may name an earlier dispatch of an item these hold again.
    this.#flushDrops();
    this.#post({ type: "hold", leases });
  }

  /** A lease no longer held (its item finished or was given back). */
  drop(lease: Lease): void {
    this.#drops.push(lease);
    this.#dropFlush ??= setImmediate(() => this.#flushDrops());
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    clearImmediate(this.#dropFlush);
    const w = this.#worker;
    this.#worker = undefined;
    await w?.terminate();
  }

  #post(m: ToThread): void {
    this.#worker?.postMessage(m);
  }

  #flushDrops(): void {
    clearImmediate(this.#dropFlush);
    this.#dropFlush = undefined;
    if (this.#drops.length === 0) return;
    this.#post({ type: "drop", leases: this.#drops });
    this.#drops = [];
  }

  #spawn(): Worker {
    const worker = new Worker(THREAD, { workerData: this.#init, name: `aiflow-heartbeat-${this.opts.name}` });
    this.#worker = worker;
    if (this.#started) this.#post({ type: "start", ...this.#started });
    // What the agent holds now; what it takes and drops from here on follows in order.
    this.#drops = [];
    this.hold(this.hooks.held());
    worker.on("message", (m: FromThread) => this.#receive(m));
    worker.on("error", (err) => this.log.error({ err }, "heartbeat thread crashed"));
    worker.on("exit", (code) => {
      if (this.#worker !== worker || this.#stopped) return;
      this.#worker = undefined;
      this.log.error({ code }, "heartbeat thread exited: starting it again");
      this.hooks.onDown();
      setTimeout(() => this.#stopped || this.#spawn(), RESTART_DELAY_MS).unref();
    });
    return worker;
  }

  #receive(m: FromThread): void {
    if (this.#stopped) return;
    if (m.type === "ready") {
      this.hooks.onReady();
      return;
    }
    if (m.type === "lost") {
      this.hooks.onLeasesLost(m.leases);
      return;
    }
    if (m.type === "renewed") {
      if (this.#renewalFailures > 0) this.log.info({ failedRounds: this.#renewalFailures }, "lease renewals reach the daemon again");
      this.#renewalFailures = 0;
      return;
    }
    if (m.type === "renewalFailed") {
      if (this.#renewalFailures++ === 0) this.log.warn({ address: m.address, err: m.message, leases: m.leases }, "lease renewal failed: retrying next tick");
      return;
    }
    if (m.type === "reply") {
      if (this.#failures > 0) this.log.info({ failedBeats: this.#failures }, "heartbeats reach the daemon again");
      this.#failures = 0;
      this.hooks.onReply(fromBinary(HeartbeatResponseSchema, m.bytes));
      return;
    }
    if (m.code === Code.NotFound) {
      this.hooks.onNotFound();
      return;
    }
    if (this.#failures++ === 0) this.log.warn({ address: m.address, err: m.message }, "heartbeat failed: trying the next daemon");
  }
}

/** A FileDescriptorSet of `file` and everything it imports, dependencies first. */
function descriptorSet(file: DescFile): Uint8Array {
  const files = new Map<string, DescFile>();
  const visit = (f: DescFile) => {
    if (files.has(f.proto.name)) return;
    f.dependencies.forEach(visit);
    files.set(f.proto.name, f);
  };
  visit(file);
  return toBinary(FileDescriptorSetSchema, create(FileDescriptorSetSchema, { file: [...files.values()].map((f) => f.proto) }));
}
