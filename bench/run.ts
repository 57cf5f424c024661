/**
 * npm run bench — throughput, dispatch latency and heartbeat cost of aiflowd, against a raw Postgres
 * queue and graphile-worker (unless --no-graphile) on the same database in the same run. Prints one
 * JSON line per figure set, then a table. Starts everything it needs and stops it all. Options: see --help.
 */
import { dropBaseline } from "./baseline.js";
import { dropGraphile, GRAPHILE_LOCAL_QUEUE_SIZE, GRAPHILE_VERSION, graphileSchema } from "./graphile.js";
import { freePort, makeBenchTls, NODE_TUNING, openDatabase, openOwnDatabase, startDaemonProc, type DaemonProc, type Database } from "./env.js";
import { sql } from "./pg.js";
import {
  clearCompleted,
  drainBaseline,
  drainGraphile,
  drainOurs,
  enqueueRate,
  settleDatabase,
  heartbeatCost,
  latencyBaseline,
  latencyGraphile,
  latencyOurs,
  rpcFigures,
  SHARE_DAEMON_ENV,
  startAgents,
  stopAgents,
  tenantShareFigures,
} from "./sections.js";
import { CLAIM_COST, claimCost } from "./claim-cost.js";
import { idleStreams } from "./streams.js";
import { dagSection } from "./dag.js";
import { triggersSection } from "./triggers.js";
import { consoleSection } from "./console.js";
import { http2Floor, perItem } from "./floor.js";
import { pythonAvailable } from "./python.js";
import { drainRatio, gcFigures, latencyRatio, ratio, type DrainHeadline } from "./stats.js";
import { BenchArgError, HELP, parseOptions } from "./options.js";
import { scrapeEverySecond, startCollectorStub, tracingEnv } from "./observability.js";

const parsed = (() => {
  try {
    return parseOptions(process.argv.slice(2));
  } catch (err) {
    if (!(err instanceof BenchArgError)) throw err;
    console.error(`bench: ${err.message}`);
    process.exit(2);
  }
})();
if (parsed.help) {
  console.log(HELP);
  process.exit(0);
}
const { o, only } = parsed;
if (only.has("python") && !pythonAvailable()) {
  console.error("bench: --only python needs Debian's python3-grpcio and python3-protobuf (.ci/run installs them)");
  process.exit(2);
}
const progress = (msg: string) => process.stderr.write(`bench: ${msg}\n`);
const results: { name: string; figures: Record<string, number | string> }[] = [];
const emit = (name: string, figures: Record<string, number | string>) => {
  results.push({ name, figures });
  console.log(JSON.stringify({ bench: name, ...figures }));
};

const db = await openDatabase(progress);
/** graphile-worker's schema: created afresh by each of its sections and dropped after it. */
const graphile = graphileSchema();
const graphileRuns = `graphile-worker ${GRAPHILE_VERSION} (concurrency ${o.agents * o.slots}, local queue ${GRAPHILE_LOCAL_QUEUE_SIZE})`;
const headline = (f: Record<string, number | string>): DrainHeadline => ({ itemsPerS: Number(f.items_per_s), cpuUsPerItem: Number(f.machine_cpu_us_per_item) });
const daemons: DaemonProc[] = [];
try {
  // claim_cost runs in this process, dag and triggers on daemons of their own: a run of them alone starts none here.
  if ([...only].some((s) => s !== "claim_cost" && s !== "dag" && s !== "triggers" && s !== "console")) {
    progress(`starting ${o.daemons} daemon(s)`);
    for (let i = 0; i < o.daemons; i++) daemons.push(await startDaemonProc(db, i));
  }
  let agents: Awaited<ReturnType<typeof startAgents>> | undefined;
  /** The h2c figures the TLS and observability sections are compared with. */
  let h2c: { drain?: number; p50?: number; p99?: number; daemonUsPerItem?: number } = {};

  if (only.has("enqueue") || only.has("drain")) {
    progress(`enqueueing ${o.items} items in batches`);
    emit("enqueue", await enqueueRate(daemons, o.items));
  }
  if (only.has("drain")) {
    progress(`draining with ${o.agents} agents × ${o.slots} slots`);
    const ours = await drainOurs(db, daemons, o);
    // The drain's agents report their RPC figures when stopped; the latency run starts its own.
    const { rpcs, gc } = await stopAgents(ours.agents);
    emit("drain", { ...ours.figures, ...rpcFigures(rpcs), ...gcFigures("agents", gc) });
    h2c.drain = Number(ours.figures.items_per_s);
    progress(`baseline drain with ${o.baselineWorkers} raw SQL workers`);
    const base = await drainBaseline(db, o);
    emit("drain_baseline", base);
    const against: Record<string, DrainHeadline> = { baseline: headline(base) };
    if (o.graphile) {
      progress(`${graphileRuns} drain`);
      const gw = await drainGraphile(db, o, graphile);
      emit("drain_graphile", gw);
      against.graphile = headline(gw);
    }
    emit("drain_ratio", drainRatio(headline(ours.figures), against));
  }
  if (only.has("mixed")) {
    progress(`mixed: enqueueing ${o.items} items (GPU needs, concurrency keys, plain), draining with ${o.agents} agents of several GPU sizes`);
    await clearCompleted(db);
    await enqueueRate(daemons, o.items, "mixed");
    const mixed = await drainOurs(db, daemons, o, "mixed");
    const { rpcs } = await stopAgents(mixed.agents);
    emit("drain_mixed", { ...mixed.figures, ...rpcFigures(rpcs) });
    emit("mixed_ratio", {
      mixed_items_per_s: mixed.figures.items_per_s!,
      plain_items_per_s: h2c.drain!,
      mixed_over_plain: ratio(Number(mixed.figures.items_per_s), h2c.drain!),
    });
  }
  if (only.has("tenants")) {
    // The drain again over ten tenants with skewed backlogs, on daemons of their own that carry the
    // weights (an item's turn is stamped by the daemon that enqueues it) and no credit, so the
    // shares hold from the first dispatch; the agents serve all ten, so they claim by fair share.
    const set = await Promise.all(daemons.map((_, i) => startDaemonProc(db, 400 + i, SHARE_DAEMON_ENV)));
    try {
      progress(`tenants: enqueueing ${o.items} items over 10 tenants (skewed), draining with ${o.agents} agents × ${o.slots} slots serving all of them`);
      await clearCompleted(db);
      await enqueueRate(set, o.items, "tenants");
      const run = await drainOurs(db, set, o, "tenants");
      const { rpcs } = await stopAgents(run.agents);
      emit("drain_tenants", { ...run.figures, ...rpcFigures(rpcs) });
      emit("tenant_shares", await tenantShareFigures(db));
      emit("tenants_ratio", {
        tenants_items_per_s: run.figures.items_per_s!,
        plain_items_per_s: h2c.drain!,
        tenants_over_plain: ratio(Number(run.figures.items_per_s), h2c.drain!),
      });
    } finally {
      await Promise.all(set.map((d) => d.child.stop()));
    }
  }
  if (only.has("latency")) {
    await settleDatabase(db);
    agents ??= await startAgents(daemons, o, "latency");
    progress(`steady ${o.rate}/s for ${o.durationMs / 1000}s after ${o.warmupMs / 1000}s warm-up`);
    const ours = await latencyOurs(daemons, agents, o);
    agents = undefined;
    emit("latency", ours);
    h2c = { ...h2c, p50: Number(ours.p50_ms), p99: Number(ours.p99_ms), daemonUsPerItem: perItem(ours, o.rate).daemons_us_per_item };
    progress("baseline latency");
    const base = await latencyBaseline(db, o);
    emit("latency_baseline", base);
    const tail = (f: Record<string, number | string>) => ({ p50: Number(f.p50_ms), p99: Number(f.p99_ms) });
    let vsGraphile: Record<string, number> = {};
    if (o.graphile) {
      progress(`${graphileRuns} latency`);
      const gw = await latencyGraphile(db, o, graphile);
      emit("latency_graphile", gw);
      vsGraphile = latencyRatio(tail(ours), tail(gw), "graphile");
    }
    emit("latency_ratio", { ...latencyRatio(tail(ours), tail(base)), ...vsGraphile });
    progress(`HTTP/2 floor: a bare Node server and client at ${o.rate}/s`);
    emit("http2_floor", { ...(await http2Floor(o)), ...perItem(ours, o.rate) });
  }
  if (agents) await Promise.all(agents.map((a) => a.stop()));
  if (only.has("sdk-transport")) {
    // The SDK's two client transports on the same daemons: what the opt-in one saves an agent.
    const figures: Record<string, Record<string, number | string>> = {};
    for (const transport of ["default", "fast"] as const) {
      progress(`SDK transport ${transport}: enqueueing ${o.items} items, draining with ${o.agents} agents × ${o.slots} slots`);
      await clearCompleted(db);
      await enqueueRate(daemons, o.items);
      const run = await drainOurs(db, daemons, { ...o, fastTransport: transport === "fast" ? true : undefined });
      await stopAgents(run.agents);
      emit(`drain_sdk_transport_${transport}`, run.figures);
      figures[transport] = run.figures;
      await settleDatabase(db);
    }
    const [d, f] = [figures.default!, figures.fast!];
    emit("sdk_transport_ratio", {
      fast_over_default_items_per_s: ratio(Number(f.items_per_s), Number(d.items_per_s)),
      fast_over_default_agents_cpu_per_item: ratio(Number(f.agents_cpu_us_per_item), Number(d.agents_cpu_us_per_item)),
      fast_over_default_machine_cpu_per_item: ratio(Number(f.machine_cpu_us_per_item), Number(d.machine_cpu_us_per_item)),
    });
  }
  if (only.has("agent-path")) {
    // The same drain and steady rate with the agents over the stream (the SDK's default), then
    // claiming by unary calls, on the same daemons.
    const figures: Record<string, Record<string, number | string>> = {};
    for (const path of ["stream", "unary"] as const) {
      const po = { ...o, agentStream: path === "stream" };
      progress(
        `agents ${path === "stream" ? "over the stream" : "by unary claims"}: enqueueing ${o.items} items, draining with ${o.agents} agents × ${o.slots} slots`,
      );
      await clearCompleted(db);
      await enqueueRate(daemons, o.items);
      const run = await drainOurs(db, daemons, po);
      const { rpcs } = await stopAgents(run.agents);
      emit(`drain_agent_path_${path}`, { ...run.figures, ...rpcFigures(rpcs) });
      await settleDatabase(db);
      progress(`agents ${path === "stream" ? "over the stream" : "by unary claims"}: steady ${o.rate}/s for ${o.durationMs / 1000}s`);
      const steady = await latencyOurs(daemons, await startAgents(daemons, po, `latency-${path}`), po);
      emit(`latency_agent_path_${path}`, steady);
      figures[path] = { items_per_s: run.figures.items_per_s!, cpu: run.figures.machine_cpu_us_per_item!, p50: steady.p50_ms!, p99: steady.p99_ms! };
    }
    const [s, u] = [figures.stream!, figures.unary!];
    emit("agent_path_ratio", {
      drain_stream_over_unary: ratio(Number(s.items_per_s), Number(u.items_per_s)),
      cpu_stream_over_unary: ratio(Number(s.cpu), Number(u.cpu)),
      p50_stream_over_unary: ratio(Number(s.p50), Number(u.p50)),
      p99_stream_over_unary: ratio(Number(s.p99), Number(u.p99)),
    });
  }
  if (only.has("python")) {
    // The drain with Python agents (agent-sdk/python, same slots) beside the SDK's: all
    // TypeScript, all Python, then half and half, on the same daemons and database.
    const figures: Record<string, Record<string, number | string>> = {};
    const mixes = { typescript: 0, python: o.agents, mixed: Math.floor(o.agents / 2) } as const;
    for (const [mix, pythonAgents] of Object.entries(mixes)) {
      progress(`python: ${mix} fleet (${pythonAgents} of ${o.agents} agents in Python): enqueueing ${o.items} items, draining with ${o.slots} slots each`);
      await clearCompleted(db);
      await enqueueRate(daemons, o.items);
      const run = await drainOurs(db, daemons, { ...o, pythonAgents });
      await stopAgents(run.agents);
      emit(`drain_python_${mix}`, { ...run.figures, python_agents: pythonAgents });
      figures[mix] = run.figures;
      await settleDatabase(db);
    }
    const [ts, py, mixed] = [figures.typescript!, figures.python!, figures.mixed!];
    emit("python_ratio", {
      python_over_ts_items_per_s: ratio(Number(py.items_per_s), Number(ts.items_per_s)),
      python_over_ts_agents_cpu_per_item: ratio(Number(py.agents_cpu_us_per_item), Number(ts.agents_cpu_us_per_item)),
      python_over_ts_machine_cpu_per_item: ratio(Number(py.machine_cpu_us_per_item), Number(ts.machine_cpu_us_per_item)),
      mixed_over_ts_items_per_s: ratio(Number(mixed.items_per_s), Number(ts.items_per_s)),
    });
  }
  if (only.has("fast-path")) {
    // The same drain twice in this run: both fast paths on, then the daemons restarted with
    // --grpc-fast-path=off and the agents with fastTransport off (connect-node at both ends).
    const figures: Record<string, Record<string, number | string>> = {};
    for (const mode of ["on", "off"] as const) {
      const set = mode === "on" ? daemons : await Promise.all(daemons.map((_, i) => startDaemonProc(db, o.daemons + 1 + i, { AIFLOW_GRPC_FAST_PATH: "off" })));
      try {
        progress(`fast paths ${mode}: enqueueing ${o.items} items, draining with ${o.agents} agents × ${o.slots} slots`);
        await clearCompleted(db);
        await enqueueRate(set, o.items);
        const run = await drainOurs(db, set, { ...o, fastTransport: mode === "on" });
        const { rpcs } = await stopAgents(run.agents);
        figures[mode] = { ...run.figures, ...rpcFigures(rpcs) };
        emit(`drain_fast_path_${mode}`, figures[mode]!);
      } finally {
        if (mode === "off") await Promise.all(set.map((d) => d.child.stop()));
      }
    }
    emit("fast_path_ratio", {
      on_items_per_s: figures.on!.items_per_s!,
      off_items_per_s: figures.off!.items_per_s!,
      on_over_off: ratio(Number(figures.on!.items_per_s), Number(figures.off!.items_per_s)),
    });
  }
  if (o.tls) {
    // The drain and the steady rate again, over TLS: daemons of their own serving a certificate,
    // agents and producer trusting its CA. Compared with the h2c sections of this run.
    const certs = makeBenchTls();
    const set: DaemonProc[] = [];
    try {
      for (let i = 0; i < o.daemons; i++) set.push(await startDaemonProc(db, 100 + i, {}, certs));
      progress(`TLS: enqueueing ${o.items} items, draining with ${o.agents} agents × ${o.slots} slots`);
      await clearCompleted(db);
      await enqueueRate(set, o.items);
      const drain = await drainOurs(db, set, o);
      const { rpcs, gc } = await stopAgents(drain.agents);
      emit("drain_tls", { ...drain.figures, ...rpcFigures(rpcs), ...gcFigures("agents", gc) });
      await settleDatabase(db);
      const tlsAgents = await startAgents(set, o, "latency-tls");
      progress(`TLS: steady ${o.rate}/s for ${o.durationMs / 1000}s after ${o.warmupMs / 1000}s warm-up`);
      const latency = await latencyOurs(set, tlsAgents, o);
      emit("latency_tls", latency);
      const p50 = Number(latency.p50_ms);
      const p99 = Number(latency.p99_ms);
      emit("tls_ratio", {
        drain_tls_items_per_s: Number(drain.figures.items_per_s),
        drain_h2c_items_per_s: h2c.drain!,
        drain_tls_over_h2c: ratio(Number(drain.figures.items_per_s), h2c.drain!),
        p50_tls_ms: p50,
        p50_h2c_ms: h2c.p50!,
        p50_tls_minus_h2c_ms: Math.round((p50 - h2c.p50!) * 100) / 100,
        p99_tls_ms: p99,
        p99_h2c_ms: h2c.p99!,
        p99_tls_minus_h2c_ms: Math.round((p99 - h2c.p99!) * 100) / 100,
      });
    } finally {
      await Promise.all(set.map((d) => d.child.stop()));
      certs.remove();
    }
  }
  if (o.observability) {
    // The steady rate again, twice, each on daemons of their own with each daemon's /metrics
    // scraped every second (--http-listen, as AIFLOW_HTTP_LISTEN): first with metrics alone, then
    // with traces exported too (daemons and agents, to a local collector stub). Each is compared
    // with this run's steady section, where both were off; a failed scrape counts as scrapes_failed.
    const stub = await startCollectorStub();
    try {
      for (const variant of ["metrics", "metrics_and_traces"] as const) {
        const traced = variant === "metrics_and_traces" ? tracingEnv(stub) : {};
        const set: DaemonProc[] = [];
        const metricsUrls: string[] = [];
        try {
          for (let i = 0; i < o.daemons; i++) {
            const metricsPort = await freePort();
            metricsUrls.push(`http://127.0.0.1:${metricsPort}/metrics`);
            set.push(await startDaemonProc(db, (variant === "metrics" ? 200 : 300) + i, { ...traced, AIFLOW_HTTP_LISTEN: `127.0.0.1:${metricsPort}` }));
          }
          await settleDatabase(db);
          const obsAgents = await startAgents(set, o, `latency-${variant}`, traced);
          const scraper = scrapeEverySecond(metricsUrls);
          const exportsBefore = { requests: stub.requests, bytes: stub.bytes };
          progress(`${variant.replaceAll("_", " ")} on: steady ${o.rate}/s for ${o.durationMs / 1000}s after ${o.warmupMs / 1000}s warm-up`);
          const latency = await latencyOurs(set, obsAgents, o);
          const scrapes = scraper.stop();
          emit(`latency_${variant}`, {
            ...latency,
            ...scrapes,
            span_exports: stub.requests - exportsBefore.requests,
            span_export_kb: Math.round((stub.bytes - exportsBefore.bytes) / 1024),
          });
          const on = perItem(latency, o.rate).daemons_us_per_item!;
          emit(`${variant}_ratio`, {
            daemon_cpu_us_per_item_on: on,
            daemon_cpu_us_per_item_off: h2c.daemonUsPerItem!,
            daemon_cpu_on_over_off: ratio(on, h2c.daemonUsPerItem!),
            p50_on_ms: Number(latency.p50_ms),
            p50_off_ms: h2c.p50!,
            p99_on_ms: Number(latency.p99_ms),
            p99_off_ms: h2c.p99!,
          });
        } finally {
          await Promise.all(set.map((d) => d.child.stop()));
        }
      }
    } finally {
      await stub.close();
    }
  }
  if (only.has("streams")) {
    progress(`${o.streamAgents} agents holding idle streams for ${o.streamIdleMs / 1000}s`);
    // A daemon of its own, told a heartbeat interval longer than the section, so that no simulated
    // agent goes inactive for want of heartbeats while it is watched (their cost is the next
    // section's). Without the drain's --initial-old-space-size, which lets garbage grow to 256 MB
    // before a full collection: its RSS is then what the streams keep, not what they left behind.
    // Its own database (or, where the role may not create one, a schema of its own), so that the
    // other daemons' liveness sweeps, which go by their own heartbeat interval, leave its agents be.
    const ownDb = await openOwnDatabase(db);
    const where: Database = ownDb ?? {
      ...db,
      schema: `${db.schema}_streams`,
      close: async () => void (await sql(db.url, `DROP SCHEMA IF EXISTS "${db.schema}_streams" CASCADE`)),
    };
    let own: DaemonProc | undefined;
    try {
      own = await startDaemonProc(where, o.daemons + 10, { AIFLOW_HEARTBEAT_INTERVAL: "60s" }, undefined, NODE_TUNING);
      emit("streams", { ...(await idleStreams(where, own, o)), own_database: ownDb ? 1 : 0 });
    } finally {
      await own?.child.stop();
      await where.close();
    }
  }
  if (only.has("heartbeat")) {
    progress(`heartbeats of ${o.hbAgents} simulated agents for ${o.hbDurationMs / 1000}s`);
    // Its own database and daemon where the role may create one: the statements are counted
    // database-wide, and nothing else (another run, a test suite) should count with them.
    const own = await openOwnDatabase(db);
    let hbDaemon: DaemonProc | undefined;
    try {
      hbDaemon = own ? await startDaemonProc(own, o.daemons) : daemons[0]!;
      emit("heartbeat", { ...(await heartbeatCost(own ?? db, hbDaemon, o)), own_database: own ? 1 : 0 });
    } finally {
      // Its database is dropped even when its daemon failed to start.
      if (own) {
        await hbDaemon?.child.stop();
        await own.close();
      }
    }
  }
  if (only.has("dag")) await dagSection(db, o, emit, progress);
  if (only.has("triggers")) await triggersSection(db, o, emit, progress);
  if (only.has("console")) await consoleSection(db, o, emit, progress);
  if (only.has("claim_cost")) {
    // In this process on a schema of its own (claim-cost.ts): the claim statement alone, shared and plain.
    await claimCost(db, CLAIM_COST, (figures) => emit("claim_cost", figures), progress);
  }
} finally {
  await Promise.all(daemons.map((d) => d.child.stop()));
  await dropBaseline(db.url).catch(() => {});
  await dropGraphile(db.url, graphile).catch(() => {});
  await db.close();
}

console.log("");
for (const r of results)
  console.log(
    `${r.name.padEnd(18)} ${Object.entries(r.figures)
      .map(([k, v]) => `${k}=${v}`)
      .join("  ")}`,
  );
