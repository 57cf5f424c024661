/**
 * The daemon's Prometheus metrics: one prom-client Registry per daemon (never the global one, so
 * daemons in one process and an embedding application never mix), served at /metrics beside the
 * process metrics (@aiflow/wire/metrics) by ../server/http-endpoints.ts. docs/observability.md's
 * Metrics section lists every name and label; the Grafana dashboard (deploy/grafana/) is checked against
 * the names and labels defined here (test/grafana-dashboard.test.ts).
 *
 * Three kinds of source, so that no scrape costs the hot path anything:
 * - events, counted where they happen (the queue's services and sweeps call QueueEvents; the RPC
 *   interceptor in ./rpc-metrics.ts; the heartbeat flusher; the LISTEN connection);
 * - state read when scraped from objects that hold it anyway (the pools, the server's refusal
 *   counters);
 * - the queue's depth and the fleet's heartbeats, which only the database knows: ./fleet-gauges.ts
 *   reads them with one periodic snapshot that every scrape shares.
 *
 * Counters count what this daemon did: each event happens on exactly one daemon (an expiry sweep's
 * rows come back to the daemon whose statement took them), so summing over instances is right.
 *
 * The tenant and engine_kind labels take the values callers name, bounded by
 * --metrics-max-label-values (./label-values.ts): past it, a value is counted as "other".
 */
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { ServerStats } from "../server/stats.js";
import type { ClaimedRow, Completed, Requeued } from "../store/work-items.js";
import { metricLabels, type MetricLabels } from "./label-values.js";

/** What became of a dispatched item, for aiflow_queue_run_seconds' `outcome`. */
export type RunOutcome = "completed" | "failed" | "retried" | "lost" | "released" | "cancelled";

/** How an agent stream ended (see rpc/agent-service/stream.ts). */
export type StreamEnding = "goodbye" | "broken" | "shutdown" | "failed";

/** How a requeue happened: a lease ran out, its agent went inactive, or an operator gave it back (drain deadline, removal). */
export type RequeueCause = "expired" | "agent_gone" | "released";

/**
 * The queue's events, as its services and sweeps report them. Every method takes what the
 * statement already returned: reporting reads nothing more.
 */
export interface QueueEvents {
  /** A claim answered with `items` items (0: an empty claim). */
  claimAnswered(items: number): void;
  /** Items dispatched at `atMs` (by a claim or a hand-off), for the wait since each became due. */
  dispatched(rows: readonly ClaimedRow[], atMs: number): void;
  /** Items an Enqueue's insert handed straight to a waiting claim. */
  handedDirect(items: number): void;
  /** A claim statement whose batch a rate limit held rows back from (their key's slots were spent). */
  rateHeld(): void;
  /** Fenced completions: those that matched, and how many did not (a lost lease: a zombie's report). */
  completed(rows: readonly Completed[], refused: number): void;
  /** Fenced failures: the rows they wrote (retried or dead letters), and how many did not match. */
  failed(rows: readonly Requeued[], refused: number): void;
  /** Dispatched items taken back by a sweep or an operator. */
  requeued(rows: readonly Requeued[], cause: RequeueCause): void;
  /** Items cancelled by a producer or an operator (those that were dispatched have run_s). */
  cancelled(rows: readonly Requeued[]): void;
  /** Pending items made dead letters by their affinity key (never dispatched). */
  stranded(rows: readonly { engine_kind: string }[]): void;
  /** An agent stream opened on this daemon. */
  streamOpened(): void;
  /** An agent stream ended, as `how` says. */
  streamEnded(how: StreamEnding): void;
}

/** What changed a run in one transaction (src/engines/run-transaction.ts); only a DAG run resumes. */
export type EngineStepKind = "start" | "advance" | "signal" | "cancel" | "resume";

/** The engines' events, reported after each run transaction commits. */
export interface EngineEvents {
  /** A transaction of `engine`'s (dag, graph, statemachine) committed: what it was, how long it took, how many events it applied and items it queued. */
  engineStep(engine: string, kind: EngineStepKind, seconds: number, events: number, queued: number): void;
  /** A run of `engine` ended in it, as `status` says. */
  engineRunEnded(engine: string, status: string): void;
}

/** A trigger fired and its firing was recorded (src/triggers/firer.ts). */
export interface TriggerEvents {
  triggerFired(type: string, outcome: string): void;
}

/**
 * A webhook delivery was refused (src/triggers/webhook.ts), for `reason` (one of a fixed set: the
 * webhook's refusals and its action's error kinds), recorded as a firing or only counted here.
 */
export interface WebhookEvents {
  webhookRefused(reason: string, recorded: boolean): void;
}

/** Seconds an item waits for dispatch, and runs: from a millisecond to hours. */
const WAIT_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600];
const RUN_BUCKETS = [0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 12 * 3600];

/** ServerStats' fields as aiflow_server_refused_total's `reason` (auth failures add their own kind). */
const REFUSAL_REASONS: readonly (keyof Omit<ServerStats, "authFailures">)[] = [
  "authThrottled",
  "tlsRefused",
  "inflightRefused",
  "healthWatchRefused",
  "connectionsRefused",
  "connectionsEvicted",
  "prefaceTimeouts",
  "headersTimeouts",
  "bodyTimeouts",
  "idleClosed",
  "keepaliveTimeouts",
  "resetFloods",
  "goawayDestroyed",
];
const snake = (s: string) => s.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/** Connections of a pool, as aiflow_db_pool_connections reports them. */
export interface PoolUsage {
  inUse: number;
  idle: number;
  waiting: number;
}

/** A histogram's child for label values, made on first use and kept. */
function childrenOf(h: Histogram<string>): (...values: string[]) => { observe(v: number): void } {
  const children = new Map<string, { observe(v: number): void }>();
  return (...values) => {
    const key = values.join("\0");
    let c = children.get(key);
    if (!c) children.set(key, (c = h.labels(...values)));
    return c;
  };
}

export class DaemonMetrics implements QueueEvents, EngineEvents, TriggerEvents, WebhookEvents {
  readonly registry = new Registry();
  /** The tenant and engine_kind values of this daemon's series, shared with ./fleet-gauges.ts. */
  readonly labels: MetricLabels;

  constructor(opts: { maxLabelValues?: number } = {}) {
    this.labels = metricLabels(opts.maxLabelValues);
  }

  readonly #emptyClaims = this.#counter("aiflow_queue_empty_claims_total", "Claims answered with no item (a long-poll that ended empty)");
  readonly #directDispatches = this.#counter(
    "aiflow_queue_direct_dispatches_total",
    "Items an Enqueue handed straight to a waiting claim, with no claim statement",
  );
  readonly #streamEnds = this.#counter(
    "aiflow_agent_stream_ends_total",
    "Agent streams (AgentService.Connect) that ended, by how: goodbye, broken, shutdown, failed",
    ["how"],
  );
  readonly #streams = new Gauge({ name: "aiflow_agent_streams", help: "Agent streams (AgentService.Connect) open on this daemon", registers: [this.registry] });
  readonly #rateHeld = this.#counter(
    "aiflow_queue_rate_limited_claims_total",
    "Claim statements that a rate limit held picked items back from (their key's slots were spent)",
  );
  readonly #refusedCompletions = this.#counter(
    "aiflow_queue_refused_completions_total",
    "Completions and failures refused because their lease was no longer held (a zombie agent's late report)",
  );
  readonly #leaseExpiries = this.#counter("aiflow_queue_lease_expiries_total", "Dispatched items whose lease ran out (the expiry sweep took them back)");
  readonly #redeliveries = this.#counter(
    "aiflow_queue_redeliveries_total",
    "Items back to pending after their holder lost them (lease expired, agent inactive): one redelivery spent",
  );
  readonly #retries = this.#counter("aiflow_queue_retries_total", "Items an agent failed that went back to pending for another attempt", ["engine_kind"]);
  readonly #deadLetters = this.#counter(
    "aiflow_queue_dead_letters_total",
    "Items that failed for good (attempts or redeliveries spent, or stranded by their affinity key)",
    ["engine_kind"],
  );
  readonly #dispatchWait = new Histogram({
    name: "aiflow_queue_dispatch_wait_seconds",
    help: "Seconds from when an item became due (enqueued, or its backoff or not-before passed) to its dispatch",
    labelNames: ["tenant", "engine_kind"],
    buckets: WAIT_BUCKETS,
    registers: [this.registry],
  });
  readonly #runSeconds = new Histogram({
    name: "aiflow_queue_run_seconds",
    help: "Seconds from an item's dispatch to its outcome: completed, failed (a dead letter), retried, lost (its holder lost the lease), released (given back by an operator) or cancelled",
    labelNames: ["engine_kind", "outcome"],
    buckets: RUN_BUCKETS,
    registers: [this.registry],
  });
  readonly #flushRows = new Histogram({
    name: "aiflow_heartbeat_flush_rows",
    help: "Agents written per heartbeat flush (one statement each)",
    buckets: [1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000],
    registers: [this.registry],
  });
  readonly #flushSeconds = new Histogram({
    name: "aiflow_heartbeat_flush_seconds",
    help: "Seconds a heartbeat flush took",
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [this.registry],
  });
  readonly #engineSteps = new Histogram({
    name: "aiflow_engine_step_seconds",
    help: "Seconds a run's transaction (under the run's lock) took, by engine (dag, graph, statemachine) and kind: start, advance, signal, cancel, resume",
    labelNames: ["engine", "kind"],
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [this.registry],
  });
  readonly #engineEnded = this.#counter(
    "aiflow_engine_runs_ended_total",
    "Runs that ended, by engine and status (dag: completed, failed, cancelled; graph: completed, stopped, failed, cancelled; statemachine: terminal, failed, cancelled)",
    ["engine", "status"],
  );
  readonly #engineEvents = this.#counter(
    "aiflow_engine_events_total",
    "Events engine advances applied, by engine (a work item a run waited on ended; a DAG attempt's timeout came due)",
    ["engine"],
  );
  readonly #engineQueued = this.#counter(
    "aiflow_engine_items_queued_total",
    "Work items run transactions queued, by engine (a DAG fan-out's iterations each count)",
    ["engine"],
  );
  readonly #triggerFirings = this.#counter(
    "aiflow_trigger_firings_total",
    "Trigger firings this daemon recorded, by trigger type (webhook, cron) and outcome (started, signalled, refused, failed)",
    ["type", "outcome"],
  );
  readonly #webhookRefusals = this.#counter(
    "aiflow_webhook_refusals_total",
    "Webhook deliveries refused, by reason (unsigned, stale, replayed, unknown_trigger, too_large, bad_body, throttled, or the action's refusal) and whether a firing was recorded (false: an unserved tenant, past the per-trigger limit a minute, or a throttled address)",
    ["reason", "recorded"],
  );
  readonly #listenReconnects = this.#counter(
    "aiflow_listen_reconnects_total",
    "Times the LISTEN connection was lost and made again (notifications may have been missed meanwhile)",
  );

  /** The per-item histograms' children by label values: labels() hashes its arguments on every use, and a claim observes each item. */
  readonly #waitOf = childrenOf(this.#dispatchWait);
  readonly #runOf = childrenOf(this.#runSeconds);

  #counter<L extends string>(name: string, help: string, labelNames: readonly L[] = []): Counter<L> {
    return new Counter({ name, help, labelNames, registers: [this.registry] });
  }

  claimAnswered(items: number): void {
    if (items === 0) this.#emptyClaims.inc();
  }

  rateHeld(): void {
    this.#rateHeld.inc();
  }

  dispatched(rows: readonly ClaimedRow[], atMs: number): void {
    for (const r of rows) {
      const due = r.next_attempt_at === null ? r.createdon_ms : Math.max(r.createdon_ms, Number(r.next_attempt_at / 1_000_000n));
      this.#waitOf(this.labels.tenant.of(r.tenant_key), this.#kind(r.engine_kind)).observe(Math.max(0, atMs - due) / 1000);
    }
  }

  handedDirect(items: number): void {
    if (items > 0) this.#directDispatches.inc(items);
  }

  completed(rows: readonly Completed[], refused: number): void {
    for (const r of rows) if (r.engine_kind !== null) this.#ran(r.engine_kind, "completed", r.run_s);
    if (refused > 0) this.#refusedCompletions.inc(refused);
  }

  failed(rows: readonly Requeued[], refused: number): void {
    for (const r of rows) {
      if (r.status === "failed") {
        this.#deadLetters.labels(this.#kind(r.engine_kind)).inc();
        this.#ran(r.engine_kind, "failed", r.run_s);
      } else {
        this.#retries.labels(this.#kind(r.engine_kind)).inc();
        this.#ran(r.engine_kind, "retried", r.run_s);
      }
    }
    if (refused > 0) this.#refusedCompletions.inc(refused);
  }

  requeued(rows: readonly Requeued[], cause: RequeueCause): void {
    if (cause === "expired" && rows.length > 0) this.#leaseExpiries.inc(rows.length);
    for (const r of rows) {
      this.#ran(r.engine_kind, cause === "released" ? "released" : "lost", r.run_s);
      if (r.status === "failed") this.#deadLetters.labels(this.#kind(r.engine_kind)).inc();
      else if (cause !== "released") this.#redeliveries.inc();
    }
  }

  cancelled(rows: readonly Requeued[]): void {
    for (const r of rows) this.#ran(r.engine_kind, "cancelled", r.run_s);
  }

  stranded(rows: readonly { engine_kind: string }[]): void {
    for (const r of rows) this.#deadLetters.labels(this.#kind(r.engine_kind)).inc();
  }

  streamOpened(): void {
    this.#streams.inc();
  }

  streamEnded(how: StreamEnding): void {
    this.#streams.dec();
    this.#streamEnds.labels(how).inc();
  }

  #ran(kind: string, outcome: RunOutcome, seconds: number | null): void {
    if (seconds !== null && seconds >= 0) this.#runOf(this.#kind(kind), outcome).observe(seconds);
  }

  #kind(kind: string): string {
    return this.labels.engineKind.of(kind);
  }

  /** A heartbeat flush wrote `rows` agents in `seconds`. */
  heartbeatFlush(rows: number, seconds: number): void {
    this.#flushRows.observe(rows);
    this.#flushSeconds.observe(seconds);
  }

  engineStep(engine: string, kind: EngineStepKind, seconds: number, events: number, queued: number): void {
    this.#engineSteps.labels(engine, kind).observe(seconds);
    if (events > 0) this.#engineEvents.labels(engine).inc(events);
    if (queued > 0) this.#engineQueued.labels(engine).inc(queued);
  }

  engineRunEnded(engine: string, status: string): void {
    this.#engineEnded.labels(engine, status).inc();
  }

  triggerFired(type: string, outcome: string): void {
    this.#triggerFirings.labels(type, outcome).inc();
  }

  webhookRefused(reason: string, recorded: boolean): void {
    this.#webhookRefusals.labels(reason, recorded ? "true" : "false").inc();
  }

  listenReconnected(): void {
    this.#listenReconnects.inc();
  }

  /** Reports the pools' connections when scraped: `main` (slonik) and `hot` (the prepared statements' pool). */
  watchPools(pools: Record<string, () => PoolUsage>): void {
    new Gauge({
      name: "aiflow_db_pool_connections",
      help: "Postgres connections of each pool: in use, idle, and callers waiting for one",
      labelNames: ["pool", "state"],
      registers: [this.registry],
      collect() {
        for (const [pool, usage] of Object.entries(pools)) {
          const u = usage();
          this.set({ pool, state: "in_use" }, u.inUse);
          this.set({ pool, state: "idle" }, u.idle);
          this.set({ pool, state: "waiting" }, u.waiting);
        }
      },
    });
  }

  /** Reports what the gRPC server refused or cut, by reason, when scraped (ServerStats only ever grows). */
  watchServer(stats: ServerStats): void {
    new Counter({
      name: "aiflow_server_refused_total",
      help: "Calls and connections the gRPC server refused or cut before a handler ran, by reason (auth_* are failed authentications by kind)",
      labelNames: ["reason"],
      registers: [this.registry],
      collect() {
        this.reset();
        for (const [kind, n] of Object.entries(stats.authFailures)) this.inc({ reason: `auth_${kind}` }, n);
        for (const field of REFUSAL_REASONS) this.inc({ reason: snake(field) }, stats[field]);
      },
    });
  }
}
