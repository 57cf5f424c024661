/** The benchmark's measurements. Each returns a flat figure set; run.ts prints them. */
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { baselineDrainSpan, dropBaseline, fillBaseline, releaseBaseline, resetBaseline, waitBaselineDone } from "./baseline.js";
import { dropGraphile, fillGraphile, GRAPHILE_LOCAL_QUEUE_SIZE, resetGraphile } from "./graphile.js";
import { nowMs } from "./clock.js";
import { clientTlsEnv, committedTransactions, KIND, NODE_TUNING, TENANT, TOKENS, type Database, type DaemonProc } from "./env.js";
import { pollUntil, sql } from "./pg.js";
import { cpuMeter, pidsNamed, runLengthMeter, startChild, watchProc, type Child } from "./proc.js";
import { gcFigures, perSecond, round, summarize, tenantShares } from "./stats.js";

export interface Options {
  items: number;
  agents: number;
  slots: number;
  /** The agents' prefetch; undefined leaves the SDK's default. */
  prefetch?: number;
  daemons: number;
  rate: number;
  durationMs: number;
  warmupMs: number;
  hbAgents: number;
  hbDurationMs: number;
  /** Heartbeats before the counted window, so the registrations' late-published counts stay out of it. */
  hbSettleMs: number;
  /** The idle window before the heartbeats, whose statement rate is subtracted from theirs. */
  hbIdleMs: number;
  /** Items the drain's agents take first, uncounted, so the counted drain runs on warm processes. */
  drainWarmup: number;
  baselineWorkers: number;
  /** Agents holding idle streams in the streams section, and how long it watches them wait. */
  streamAgents: number;
  streamIdleMs: number;
  /** Run graphile-worker's drain and steady sections beside the raw baseline's (--no-graphile: off). */
  graphile: boolean;
  /** The SDK agents' fastTransport (the daemon's --grpc-fast-path is set where it starts). */
  fastTransport?: boolean;
  /** The SDK agents take work over the agent stream (the SDK's default) or, false, by unary claims. */
  agentStream?: boolean;
  /** How many of the agents are Python ones (bench/child_agent.py), the first of them; default none. */
  pythonAgents?: number;
  /** Run the drain and the steady rate over TLS too (run.ts). */
  tls?: boolean;
  /** Run the steady rate with traces exported and metrics scraped too (run.ts, observability.ts). */
  observability?: boolean;
  /** The DAG section (dag.ts): its plain items, its 10-node chain runs, its fan-out runs and their width. */
  dagItems: number;
  dagChains: number;
  dagFanOuts: number;
  dagWidth: number;
  /** The triggers section's starts of each kind. */
  triggerStarts: number;
  /** The console section's agents, items and CPU window. */
  consoleAgents: number;
  consoleItems: number;
  consoleWindowMs: number;
}

type Figures = Record<string, number | string>;

const headers = { authorization: `Bearer ${TOKENS.engine}` };
const workTable = (db: Database) => `"${db.schema}".aiflow_work_item`;

/** Batch Enqueue of the drain backlog: items per second through the daemon. */
/**
 * The mixed section's fleet and work: agents of several sizes (simulated GPUs, GB each, by agent
 * index), and items of which a quarter are plain, a quarter need 1 GB of one GPU, a quarter 3 GB
 * under a concurrency key, and a quarter only a key (64 keys, 8 in flight each). Every item fits
 * every agent, so the drain ends with any number of agents; and the fleet's GPUs and keys hold
 * about as much as its slots, so what the section measures is what placing and counting cost the
 * claim, not how long work waits for a full GPU or key (which the handlers' no-op work would make
 * the whole figure).
 */
export const MIXED_GPUS = [[24], [48], [80, 80], [24, 24]];
const MIXED_KEYS = 64;
const mixedItem = (i: number) => {
  const key = { concurrencyKey: `mixed-${i % MIXED_KEYS}`, maxInFlight: 8 };
  const gpu = (gb: number) => ({ requirements: { gpus: 1, gpuMemoryMb: BigInt(gb * 1024) } });
  const params = [undefined, gpu(1), { ...gpu(3), ...key }, key][i % 4];
  return { engineKind: KIND, payloadJson: "{}", workerParams: params };
};

/**
 * The tenants section's tenants, each one's share of the backlog (percent: a skew, the largest
 * first) and the weights its daemons are given (AIFLOW_TENANT_WEIGHTS; the others weigh 1). By
 * backlog ÷ weight, t8 and t9 run out first, after about a quarter of the items.
 */
export const SHARE_TENANTS = Array.from({ length: 10 }, (_, i) => `t${i}`);
const SHARE_BACKLOG_PCT = [40, 20, 10, 8, 6, 5, 4, 3, 2, 2];
const HEAVIER: Readonly<Record<string, number>> = { t1: 3, t2: 2 };
export const SHARE_WEIGHTS: Readonly<Record<string, number>> = Object.fromEntries(SHARE_TENANTS.map((t) => [t, HEAVIER[t] ?? 1]));
/** The tenants section's daemon settings: its weights, and no credit, so the shares are clean from the first dispatch. */
export const SHARE_DAEMON_ENV = {
  AIFLOW_TENANTS: SHARE_TENANTS.join(","),
  AIFLOW_TENANT_WEIGHTS: Object.entries(SHARE_WEIGHTS)
    .filter(([, w]) => w !== 1)
    .map(([t, w]) => `${t}=${w}`)
    .join(","),
  AIFLOW_FAIR_SHARE_CREDIT: "0",
};

/** `items` split over the tenants by SHARE_BACKLOG_PCT (the rounding's remainder to t0). */
export function shareBacklog(items: number): [string, number][] {
  const counts = SHARE_BACKLOG_PCT.map((pct) => Math.floor((items * pct) / 100));
  counts[0]! += items - counts.reduce((s, n) => s + n, 0);
  return SHARE_TENANTS.map((t, i) => [t, counts[i]!]);
}

/**
 * What a section drains: plain items of one tenant; the mixed section's (mixedItem, MIXED_GPUS);
 * or plain items of the tenants section's tenants (SHARE_TENANTS), by agents serving all of them.
 */
export type Fleet = "plain" | "mixed" | "tenants";

export async function enqueueRate(daemons: DaemonProc[], items: number, fleet: Fleet = "plain"): Promise<Figures> {
  const clients = daemons.map((d) => createClient(QueueService, createGrpcTransport({ baseUrl: d.url, nodeOptions: d.tls ? { ca: d.tls.caPem } : undefined })));
  const batch = 1000;
  const start = nowMs();
  // Batches of one tenant each (an Enqueue names one tenant), a tenant's in a row.
  const batches = (fleet === "tenants" ? shareBacklog(items) : ([[TENANT, items]] as [string, number][])).flatMap(([tenant, count]) =>
    Array.from({ length: Math.ceil(count / batch) }, (_, i) => ({ tenant, n: Math.min(batch, count - i * batch) })),
  );
  let next = 0;
  await Promise.all(
    Array.from({ length: 4 }, async (_, w) => {
      while (next < batches.length) {
        const { tenant, n } = batches[next++]!;
        const items = Array.from({ length: n }, (_, i) => (fleet === "mixed" ? mixedItem(i) : { engineKind: KIND, payloadJson: "{}" }));
        await clients[w % clients.length]!.enqueue({ tenantKey: tenant, items }, { headers });
      }
    }),
  );
  const ms = nowMs() - start;
  return { items, batch, seconds: round(ms / 1000, 3), items_per_s: round(items / (ms / 1000), 0) };
}

export async function startAgents(
  daemons: DaemonProc[],
  o: Pick<Options, "agents" | "slots" | "prefetch" | "fastTransport" | "agentStream" | "pythonAgents">,
  tag: string,
  env: Record<string, string> = {},
  envOf: (i: number) => Record<string, string> = () => ({}),
  tenants: readonly string[] = [TENANT],
): Promise<Child[]> {
  const agents = Array.from({ length: o.agents }, (_, i) => {
    const d = daemons[i % daemons.length]!;
    if (i < (o.pythonAgents ?? 0))
      return startChild("bench/child_agent.py", [d.url, TOKENS.agent, `bench-${tag}-py-${i}`, String(o.slots), tenants.join(","), KIND], {
        env: { ...clientTlsEnv(d), ...env, ...envOf(i) },
        ready: (l) => l.includes('"ready"'),
      });
    return startChild(
      "bench/child-agent.ts",
      [
        d.url,
        TOKENS.agent,
        `bench-${tag}-${i}`,
        String(o.slots),
        tenants.join(","),
        KIND,
        o.prefetch === undefined ? "" : String(o.prefetch),
        o.fastTransport === undefined ? "default" : o.fastTransport ? "fast" : "slow",
        o.agentStream === false ? "unary" : "stream",
      ],
      {
        nodeArgs: NODE_TUNING,
        env: { ...clientTlsEnv(d), ...env, ...envOf(i) },
        ready: (l) => l.includes('"ready"'),
      },
    );
  });
  await Promise.all(agents.map((a) => a.ready));
  return agents;
}

/** Starts an agent child's figures afresh; resolves once it has. */
function resetFigures(agent: Child): Promise<void> {
  // A Python agent (no IPC channel) keeps no figures but its count of items handled.
  if (!agent.proc.send) return Promise.resolve();
  return new Promise((resolve) => {
    agent.onLine((line) => {
      if (line.includes('"reset"')) resolve();
    });
    agent.proc.send("reset");
  });
}

/** Stops agent children and gathers what they measured. */
type Rpcs = Record<string, { calls: number; ms: number; items: number }>;

export async function stopAgents(agents: Child[]): Promise<{ handled: number; latencies: number[]; rpcs: Rpcs; gc?: number[] }> {
  const results = await Promise.all(
    agents.map(
      (a) =>
        new Promise<{ handled: number; latencies: number[]; rpcs?: Rpcs; gc?: number[] }>((resolve) => {
          a.onLine((line) => {
            try {
              const r = JSON.parse(line) as { handled?: number; latencies?: number[]; rpcs?: Rpcs; gc?: number[] };
              if (r.latencies) resolve({ handled: r.handled ?? 0, latencies: r.latencies, rpcs: r.rpcs, gc: r.gc });
            } catch {
              // a log line
            }
          });
          void a.exited.then(() => resolve({ handled: 0, latencies: [] }));
          void a.stop(20_000);
        }),
    ),
  );
  const rpcs: Rpcs = {};
  for (const r of results)
    for (const [m, v] of Object.entries(r.rpcs ?? {})) {
      const t = (rpcs[m] ??= { calls: 0, ms: 0, items: 0 });
      t.calls += v.calls;
      t.ms += v.ms;
      t.items += v.items;
    }
  return {
    handled: results.reduce((n, r) => n + r.handled, 0),
    latencies: results.flatMap((r) => r.latencies),
    rpcs,
    gc: results.some((r) => r.gc) ? results.flatMap((r) => r.gc ?? []) : undefined,
  };
}

/**
 * Waits until nothing is pending or dispatched: two probes of the pending and in-flight partial
 * indexes, so the watching costs the drain next to nothing (a count over the table every poll took a
 * visible share of Postgres's CPU).
 */
function waitForDrained(db: Database, timeoutMs: number): Promise<void> {
  return pollUntil<{ busy: boolean }>(
    db.url,
    `SELECT EXISTS (SELECT 1 FROM ${workTable(db)} WHERE status = 'pending')
         OR EXISTS (SELECT 1 FROM ${workTable(db)} WHERE status = 'dispatched') AS busy`,
    (r) => !r.busy,
    timeoutMs,
    "the drain",
  );
}

/**
 * Agents (separate SDK processes) drain the backlog; first claim to last completion in the database.
 * The backlog is parked while the agent processes boot and register, then released in one statement:
 * otherwise the first agent up would drain while the others are still loading.
 *
 * It is parked outside the claim index (as cancelled, which no claim reads) and the table is vacuumed
 * before the release, so the drain starts from the index a freshly enqueued backlog has: one entry
 * per item, as the baseline's. Holding it as pending but not yet due instead left three entries per
 * item (as enqueued, as held, as released: each update of the due time writes one), and every claim
 * walks the dead entries of the items claimed before it.
 */
/** Deletes finished items, so that a drain counts only its own. */
export async function clearCompleted(db: Database): Promise<void> {
  await sql(db.url, `DELETE FROM ${workTable(db)} WHERE status = 'completed'`);
}

/**
 * CPU of processes the drain cannot name itself (the DAG section's Postgres backends): started as
 * the counted drain is released, read as it ends; each group's ms (null: not measurable here)
 * becomes `<group>_cpu_us_per_item`.
 */
export type ExtraMeter = () => Promise<() => Promise<Record<string, number | null>>>;

/**
 * A drain by fresh agents of what is pending; `fleet` "mixed": the agents of the mixed fleet
 * (MIXED_GPUS); "tenants": agents serving all of SHARE_TENANTS, warmed up on those tenants' items.
 */
export async function drainOurs(
  db: Database,
  daemons: DaemonProc[],
  o: Options,
  fleet: Fleet = "plain",
  extra?: ExtraMeter,
): Promise<{ figures: Figures; agents: Child[] }> {
  await sql(db.url, `UPDATE ${workTable(db)} SET status = 'cancelled' WHERE status = 'pending'`);
  const gpus = (i: number): Record<string, string> => (fleet === "mixed" ? { BENCH_GPUS: MIXED_GPUS[i % MIXED_GPUS.length]!.join(",") } : {});
  const agents = await startAgents(daemons, o, fleet === "plain" ? "drain" : fleet, {}, gpus, fleet === "tenants" ? SHARE_TENANTS : [TENANT]);
  if (o.drainWarmup > 0) {
    // A warm-up the agents drain first, not counted: agents are long-running processes, and in a
    // drain of a few seconds, freshly started ones spent a visible share of it compiling their hot
    // paths. Its rows are deleted before the counted drain starts.
    await enqueueRate(daemons, o.drainWarmup, fleet === "tenants" ? "tenants" : "plain");
    await waitForDrained(db, 600_000);
    await sql(db.url, `DELETE FROM ${workTable(db)} WHERE status = 'completed'`);
    await Promise.all(agents.map((a) => resetFigures(a)));
  }
  await sql(db.url, `VACUUM (ANALYZE) ${workTable(db)}`);
  const watches = daemons.map((d) => watchProc(d.child.pid));
  const meter = cpuMeter({ agents: agents.map((a) => a.pid) });
  const extraMeter = await extra?.();
  await sql(
    db.url,
    `UPDATE ${workTable(db)} SET status = 'pending', next_attempt_at = (extract(epoch from clock_timestamp()) * 1e9)::bigint WHERE status = 'cancelled'`,
  );
  await waitForDrained(db, 600_000);
  const cpu = meter();
  const extraMs = (await extraMeter?.()) ?? {};
  const usage = watches.map((w) => w.stop());
  const [row] = await sql<{ n: string; span: string }>(
    db.url,
    `SELECT count(*) AS n, max(completed_at) - min(dispatched_at) AS span FROM ${workTable(db)} WHERE status = 'completed'`,
  );
  const [retries] = await sql<{ n: string }>(db.url, `SELECT coalesce(sum(retry_count), 0) AS n FROM ${workTable(db)}`);
  const items_per_s = perSecond(Number(row!.n), BigInt(row!.span));
  return {
    agents,
    figures: {
      items: Number(row!.n),
      agents: o.agents,
      slots: o.slots,
      prefetch: o.prefetch ?? "default",
      daemons: o.daemons,
      seconds: round(Number(BigInt(row!.span)) / 1e9, 3),
      items_per_s: round(items_per_s, 0),
      retries: Number(retries!.n),
      daemon_cpu_pct: round(
        usage.reduce((s, u) => s + u.cpuPercent, 0),
        1,
      ),
      daemon_peak_rss_mb: round(Math.max(...usage.map((u) => u.peakRssMb)), 1),
      ...cpuPerItem(cpu.machineMs, Number(row!.n)),
      // Where the machine's time went, per item: the daemons, the agent processes, and the rest
      // (Postgres, and this process watching).
      daemon_cpu_us_per_item: round((usage.reduce((s, u) => s + (u.cpuPercent / 100) * u.wallMs, 0) * 1000) / Number(row!.n), 1),
      agents_cpu_us_per_item: round((cpu.groupMs.agents! * 1000) / Number(row!.n), 1),
      ...Object.fromEntries(
        Object.entries(extraMs).flatMap(([k, ms]) => (ms === null ? [] : [[`${k}_cpu_us_per_item`, round((ms * 1000) / Number(row!.n), 1)]])),
      ),
    },
  };
}

/**
 * The tenants section's shares, read back from the table after its drain: every completed item of
 * SHARE_TENANTS in dispatch order (dispatched_at; a claim's items, which share it, by turn), and
 * over the stretch while every tenant had a backlog (tenantShares), each tenant's share of the
 * dispatches next to its weight's share, and the largest difference between the two.
 *
 * The order is as fine as a claim: dispatched_at is the daemon's clock (ms) as the claim began, so
 * two claims whose statements ran in the other order than their clocks read swap their batches
 * (about a hundred items each here), and the stretch can end up to a batch late. Over the ~780
 * dispatches of a 3,000-item run that reads as up to ~0.01 of difference; the default 100,000 items
 * give a stretch of ~26,000.
 */
export async function tenantShareFigures(db: Database): Promise<Figures> {
  const rows = await sql<{ tenant_key: string }>(
    db.url,
    `SELECT tenant_key FROM ${workTable(db)} WHERE status = 'completed' AND tenant_key = ANY($1::text[]) ORDER BY dispatched_at, share_tag, id`,
    [SHARE_TENANTS],
  );
  const s = tenantShares(
    rows.map((r) => r.tenant_key),
    SHARE_WEIGHTS,
  );
  const out: Figures = { tenants: Object.keys(s.shares).length, items: rows.length, stretch_dispatches: s.dispatches, first_out: s.firstOut };
  for (const [t, v] of Object.entries(s.shares)) {
    out[`${t}_share`] = round(v.measured, 4);
    out[`${t}_expected`] = round(v.expected, 4);
  }
  out.max_abs_diff = round(s.maxAbsDiff, 4);
  return out;
}

export async function drainBaseline(db: Database, o: Options): Promise<Figures> {
  await resetBaseline(db.url);
  await fillBaseline(db.url, o.items);
  const workers = startChild("bench/child-baseline-workers.ts", [db.url, String(o.baselineWorkers)], { ready: (l) => l.includes('"ready"') });
  await workers.ready;
  const meter = cpuMeter();
  await releaseBaseline(db.url);
  await waitBaselineDone(db.url, o.items);
  const cpu = meter();
  await workers.stop();
  const { count, spanNs } = await baselineDrainSpan(db.url);
  // Its dead rows would otherwise be vacuumed during the next section.
  await dropBaseline(db.url);
  return {
    items: count,
    workers: o.baselineWorkers,
    seconds: round(Number(spanNs) / 1e9, 3),
    items_per_s: round(perSecond(count, spanNs), 0),
    ...cpuPerItem(cpu.machineMs, count),
  };
}

/**
 * graphile-worker's drain (graphile.ts, child-graphile.ts): the same backlog added first by addJobs,
 * then from its pool starting to the last completion committed, with concurrency agents × slots,
 * in a child process as the raw baseline's workers are; after a warm-up of o.drainWarmup jobs in
 * that same process, as our agents take one. Machine CPU over the same window; the table vacuumed
 * and analysed before it, as ours is.
 */
export async function drainGraphile(db: Database, o: Options, schema: string): Promise<Figures> {
  const concurrency = o.agents * o.slots;
  await resetGraphile(db.url, schema);
  try {
    if (o.drainWarmup > 0) await fillGraphile(db.url, schema, o.drainWarmup);
    const workers = startChild("bench/child-graphile.ts", [db.url, schema, String(concurrency), "drain", String(o.items), String(o.drainWarmup)], {
      ready: (l) => l.includes('"ready"'),
    });
    try {
      await workers.ready;
      const fillMs = await fillGraphile(db.url, schema, o.items);
      await sql(db.url, `VACUUM (ANALYZE) "${schema}"._private_jobs`);
      type Drained = { drained: number; start_ms: number; end_ms: number; boot_ms: number };
      const done = new Promise<Drained>((resolve, reject) => {
        workers.onLine((line) => {
          try {
            const r = JSON.parse(line) as Partial<Drained>;
            if (r.drained !== undefined) resolve(r as Drained);
          } catch {
            // a log line
          }
        });
        void workers.exited.then((code) => reject(new Error(`bench/child-graphile.ts exited (${code}) before its drain ended`)));
        setTimeout(() => reject(new Error("the graphile-worker drain did not end within 600000ms")), 600_000).unref();
      });
      const meter = cpuMeter({ workers: [workers.pid] });
      workers.proc.send("go");
      const r = await done;
      const cpu = meter();
      const ms = r.end_ms - r.start_ms;
      return {
        items: r.drained,
        concurrency,
        local_queue: GRAPHILE_LOCAL_QUEUE_SIZE,
        seconds: round(ms / 1000, 3),
        items_per_s: round(r.drained / (ms / 1000), 0),
        // Its addJobs of the backlog (batches of 1,000, four in flight), and how long its pool took to start (not in the span).
        enqueue_items_per_s: round(o.items / (fillMs / 1000), 0),
        boot_ms: round(r.boot_ms, 1),
        ...cpuPerItem(cpu.machineMs, r.drained),
        // Its worker process's share; the rest is Postgres (and this process watching).
        workers_cpu_us_per_item: round((cpu.groupMs.workers! * 1000) / r.drained, 1),
      };
    } finally {
      await workers.stop();
    }
  } finally {
    await dropGraphile(db.url, schema);
  }
}

/** Machine CPU (all processes) per item over the drain, in microseconds. */
function cpuPerItem(machineMs: number | null, items: number): Figures {
  return machineMs === null || items === 0 ? {} : { machine_cpu_us_per_item: round((machineMs * 1000) / items, 1) };
}

function producer(args: string[], env: Record<string, string> = {}): Child {
  return startChild("bench/child-producer.ts", args, { env, ready: (l) => l.includes('"ready"') });
}

async function produced(p: Child): Promise<number> {
  return new Promise((resolve) => {
    p.onLine((line) => {
      try {
        const r = JSON.parse(line) as { sent?: number };
        if (r.sent !== undefined) resolve(r.sent);
      } catch {
        // ignore
      }
    });
    void p.exited.then(() => resolve(0));
  });
}

const latencyFigures = (latencies: number[], sent: number, o: Options): Figures => {
  const s = summarize(latencies);
  return {
    rate: o.rate,
    seconds: o.durationMs / 1000,
    sent,
    measured: s.count,
    p50_ms: round(s.p50, 2),
    p90_ms: round(s.p90, 2),
    p99_ms: round(s.p99, 2),
    max_ms: round(s.max, 2),
    mean_ms: round(s.mean, 2),
  };
};

/** Mean latency and batch size per agent RPC, e.g. claim_ms / claim_items. */
export function rpcFigures(rpcs: Rpcs): Figures {
  const out: Figures = {};
  for (const [m, v] of Object.entries(rpcs)) {
    if (m === "streamSent" || m === "streamPushed") {
      // The agent stream's messages: those the agents sent (with the completions they carried), and those pushed to them (with their items).
      out[`${m}_messages`] = v.calls;
      out[`${m}_mean_items`] = round(v.items / Math.max(1, v.calls), 1);
      continue;
    }
    if (!["claim", "complete", "extendLease"].includes(m)) continue;
    out[`${m}_calls`] = v.calls;
    out[`${m}_mean_ms`] = round(v.ms / Math.max(1, v.calls), 2);
    out[`${m}_mean_items`] = round(v.items / Math.max(1, v.calls), 1);
  }
  return out;
}

/**
 * Puts the database back to a fresh state between sections, as the baseline's sections start (on a
 * new table): the queue table emptied (its indexes too) with fresh statistics, and a checkpoint, so
 * that the previous section's dead row versions and its WAL are not cleaned up (autovacuum, a
 * checkpoint) in the middle of what the next one measures.
 */
export async function settleDatabase(db: Database): Promise<void> {
  await sql(db.url, `TRUNCATE ${workTable(db)}`);
  await sql(db.url, `ANALYZE ${workTable(db)}`);
  // Needs superuser or pg_checkpoint; without them the section just runs as it would have.
  await sql(db.url, "CHECKPOINT").catch(() => {});
}

/** Steady open-loop single-item Enqueue at `rate`; from issuing Enqueue to the handler starting. */
export async function latencyOurs(daemons: DaemonProc[], agents: Child[], o: Options): Promise<Figures> {
  const p = producer(
    ["ours", daemons[0]!.url, String(o.rate), String(o.durationMs), String(o.warmupMs), TOKENS.engine, TENANT, KIND],
    clientTlsEnv(daemons[0]!),
  );
  await p.ready;
  const cpu = cpuShares({ daemons: daemons.map((d) => d.child.pid), agents: agents.map((a) => a.pid), producer: [p.pid] });
  const sent = await produced(p);
  const shares = cpu();
  // Let the last items reach their handlers before the agents stop and report.
  await new Promise((r) => setTimeout(r, 500));
  const { latencies, rpcs, gc } = await stopAgents(agents);
  // The agents' GC pauses, to read the tail against: its slowest items come in one or two stalls of
  // the whole machine per run, and in two of three traced runs those lined up with the agents'
  // young-generation collections, all four agents collecting within a few hundred milliseconds.
  return { ...latencyFigures(latencies, sent, o), ...shares, ...rpcFigures(rpcs), ...gcFigures("agents", gc) };
}

/**
 * Where the machine's CPU went while the producer ran, in percent of one core: all of it, and each
 * group of processes (the rest is Postgres and this process). At a steady rate a saturated machine
 * is what turns into queueing delay, so the latency figures are read with these. Where the host runs
 * DAMON, its kdamond threads are a group too (host_kdamond), with the mean length of their runs
 * (host_kdamond_run_ms): long runs are bursts that hold a core, and the tail follows them.
 */
function cpuShares(groups: Record<string, number[]>): () => Figures {
  const kdamond = pidsNamed("kdamond");
  const meter = cpuMeter(kdamond.length > 0 ? { ...groups, host_kdamond: kdamond } : groups);
  const kdamondRuns = runLengthMeter(kdamond);
  return () => {
    const { wallMs, machineMs, groupMs } = meter();
    const pct = (ms: number) => round((ms / wallMs) * 100, 0);
    const out: Figures = machineMs === null ? {} : { machine_cpu_pct: pct(machineMs) };
    for (const [k, ms] of Object.entries(groupMs)) out[`${k}_cpu_pct`] = pct(ms);
    const runMs = kdamondRuns();
    if (runMs !== null) out.host_kdamond_run_ms = round(runMs, 2);
    return out;
  };
}

export async function latencyBaseline(db: Database, o: Options): Promise<Figures> {
  await resetBaseline(db.url);
  return steadyBaseline({ script: "bench/child-baseline-workers.ts", args: [db.url, String(o.baselineWorkers)] }, { mode: "baseline", target: db.url }, o);
}

/**
 * A baseline's steady run: its workers' process, the producer in its mode (child-producer.ts) at
 * the steady rate; the latencies its workers measured, `settings` to report beside them, and where
 * the machine's CPU went meanwhile.
 */
async function steadyBaseline(
  workerProc: { script: string; args: string[] },
  feed: { mode: string; target: string; extra?: string[] },
  o: Options,
  settings: Figures = {},
): Promise<Figures> {
  const workers = startChild(workerProc.script, workerProc.args, { ready: (l) => l.includes('"ready"') });
  await workers.ready;
  const p = producer([feed.mode, feed.target, String(o.rate), String(o.durationMs), String(o.warmupMs), ...(feed.extra ?? [])]);
  await p.ready;
  const cpu = cpuShares({ workers: [workers.pid], producer: [p.pid] });
  const sent = await produced(p);
  const shares = cpu();
  // Let the last items reach their handlers before the workers stop and report.
  await new Promise((r) => setTimeout(r, 500));
  const { latencies } = await stopAgents([workers]);
  return { ...latencyFigures(latencies, sent, o), ...settings, ...shares };
}

/**
 * graphile-worker at the same steady rate, by the same definition (enqueue call issued → handler
 * started, after the same warm-up): one job per addJob call from the producer's process, into a
 * pool of agents × slots in its own process (child-graphile.ts), on a fresh schema.
 */
export async function latencyGraphile(db: Database, o: Options, schema: string): Promise<Figures> {
  const concurrency = o.agents * o.slots;
  await resetGraphile(db.url, schema);
  try {
    return await steadyBaseline(
      { script: "bench/child-graphile.ts", args: [db.url, schema, String(concurrency), "steady"] },
      { mode: "graphile", target: db.url, extra: [schema] },
      o,
      { concurrency },
    );
  } finally {
    await dropGraphile(db.url, schema);
  }
}

/** 1,000 simulated agents beating once a second: database statements per second, and daemon CPU. */
export async function heartbeatCost(db: Database, daemon: DaemonProc, o: Options): Promise<Figures> {
  const idleMs = o.hbIdleMs;
  const idleStart = await committedTransactions(db.url);
  await new Promise((r) => setTimeout(r, idleMs));
  const idleRate = ((await committedTransactions(db.url)) - idleStart - 2) / (idleMs / 1000);

  // The agents beat through a settling period before the window: a backend publishes its statement
  // counts when it goes idle, up to ten seconds late (PGSTAT_IDLE_INTERVAL), and the registrations'
  // 2,000 statements must land before the window opens, not inside it.
  const settleMs = o.hbSettleMs;
  const hb = startChild("bench/child-heartbeats.ts", [daemon.address, TOKENS.agent, String(o.hbAgents), String(settleMs + o.hbDurationMs + 1_000)], {
    ready: (l) => l.includes('"ready"'),
  });
  await hb.ready;
  const beatsDone = new Promise<{ beats: number; reregistered: number }>((resolve) => {
    hb.onLine((line) => {
      const r = JSON.parse(line) as { beats?: number; reregistered?: number };
      if (r.beats !== undefined) resolve({ beats: r.beats, reregistered: r.reregistered ?? 0 });
    });
  });
  await new Promise((r) => setTimeout(r, settleMs));
  const meter = cpuMeter({ daemon: [daemon.child.pid] });
  const x0 = await committedTransactions(db.url);
  await new Promise((r) => setTimeout(r, o.hbDurationMs));
  const x1 = await committedTransactions(db.url);
  const cpu = meter();
  const seconds = cpu.wallMs / 1000;
  const { beats, reregistered } = await beatsDone;
  await hb.exited;
  const rate = (x1 - x0 - 2) / seconds;
  return {
    agents: o.hbAgents,
    seconds: round(seconds, 1),
    heartbeats_per_s: round(beats / ((settleMs + o.hbDurationMs + 1_000) / 1000), 0),
    statements_per_s: round(rate, 1),
    idle_statements_per_s: round(idleRate, 1),
    heartbeat_statements_per_s: round(Math.max(0, rate - idleRate), 1),
    // Simulated agents that had been marked inactive and registered again (see child-heartbeats.ts).
    reregistered,
    daemon_cpu_pct: round((cpu.groupMs.daemon! / cpu.wallMs) * 100, 1),
  };
}
