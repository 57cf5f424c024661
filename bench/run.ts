/**
 * npm run bench — throughput, dispatch latency and heartbeat cost of aiflowd, against a raw Postgres
 * queue on the same database in the same run. Prints one JSON line per figure set, then a table.
 * Starts everything it needs and stops it all. Options: see --help.
 */
import { parseDuration } from "../src/config.js";
import { dropBaseline } from "./baseline.js";
import { openDatabase, startDaemonProc, type DaemonProc } from "./env.js";
import { drainBaseline, drainOurs, enqueueRate, settleDatabase, heartbeatCost, latencyBaseline, latencyOurs, rpcFigures, startAgents, stopAgents, type Options } from "./sections.js";
import { http2Floor, perItem } from "./floor.js";
import { gcFigures, ratio } from "./stats.js";

const HELP = `npm run bench -- [options]
  --items N          drain backlog (default 20000)
  --agents N         agent processes (default 4)
  --slots N          slots per agent (default 32)
  --prefetch N       items an agent may claim ahead of its free slots (default: the SDK's, 3 × slots here)
  --daemons N        daemon instances (default 1)
  --rate N           steady enqueue rate per second (default 1000)
  --duration D       steady phase length (default 10s)
  --warmup D         warm-up before measuring latency (default 20s: see README, JIT warm-up)
  --hb-agents N      simulated agents for the heartbeat cost (default 1000)
  --hb-duration D    heartbeat phase length (default 10s)
  --drain-warmup N   items the drain's agents take first, uncounted (default 4000)
  --only LIST        comma list of: enqueue,drain,latency,heartbeat (default all);
                     latency includes the HTTP/2 floor (a bare Node HTTP/2 exchange at --rate)
  --smoke            a tiny run (seconds) to check the benchmark works`;

/**
 * The steady section's warm-up. Its processes are fresh (the agents and the producer start for it),
 * and after 3 s V8 was still optimising their hot paths: TurboFan's threads took 12 % of the
 * machine's samples (perf, system-wide) during the measured 10 s, against 4–5 % after 20 s or 30 s.
 * That is start-up cost, not what a long-running daemon and its agents pay per item.
 */
const WARMUP_MS = 20_000;

function parseOptions(argv: string[]): { o: Options; only: Set<string> } {
  const o: Options = { items: 20_000, agents: 4, slots: 32, daemons: 1, rate: 1000, durationMs: 10_000, warmupMs: WARMUP_MS, hbAgents: 1000, hbDurationMs: 10_000, hbSettleMs: 11_000, drainWarmup: 4_000, baselineWorkers: 32 };
  let only = new Set(["enqueue", "drain", "latency", "heartbeat"]);
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i]!.split("=", 2);
    const value = () => inline ?? argv[++i] ?? "";
    switch (flag) {
      case "--help":
        console.log(HELP);
        process.exit(0);
      case "--items": o.items = Number(value()); break;
      case "--agents": o.agents = Number(value()); break;
      case "--slots": o.slots = Number(value()); break;
      case "--prefetch": o.prefetch = Number(value()); break;
      case "--daemons": o.daemons = Number(value()); break;
      case "--rate": o.rate = Number(value()); break;
      case "--duration": o.durationMs = parseDuration(value(), "--duration"); break;
      case "--warmup": o.warmupMs = parseDuration(value(), "--warmup"); break;
      case "--hb-agents": o.hbAgents = Number(value()); break;
      case "--hb-duration": o.hbDurationMs = parseDuration(value(), "--hb-duration"); break;
      case "--drain-warmup": o.drainWarmup = Number(value()); break;
      case "--only": only = new Set(value().split(",")); break;
      case "--smoke":
        Object.assign(o, { items: 300, agents: 2, slots: 8, rate: 100, durationMs: 1000, warmupMs: 300, hbAgents: 50, hbDurationMs: 2000, hbSettleMs: 500, drainWarmup: 100, baselineWorkers: 4 });
        break;
      default:
        console.error(`bench: unknown option ${flag} (see --help)`);
        process.exit(2);
    }
  }
  return { o, only };
}

const { o, only } = parseOptions(process.argv.slice(2));
const progress = (msg: string) => process.stderr.write(`bench: ${msg}\n`);
const results: { name: string; figures: Record<string, number | string> }[] = [];
const emit = (name: string, figures: Record<string, number | string>) => {
  results.push({ name, figures });
  console.log(JSON.stringify({ bench: name, ...figures }));
};

const db = await openDatabase(progress);
const daemons: DaemonProc[] = [];
try {
  progress(`starting ${o.daemons} daemon(s)`);
  for (let i = 0; i < o.daemons; i++) daemons.push(await startDaemonProc(db, i));
  let agents: Awaited<ReturnType<typeof startAgents>> | undefined;

  if (only.has("enqueue") || only.has("drain")) {
    progress(`enqueueing ${o.items} items in batches`);
    emit("enqueue", await enqueueRate(db, daemons, o.items));
  }
  if (only.has("drain")) {
    progress(`draining with ${o.agents} agents × ${o.slots} slots`);
    const ours = await drainOurs(db, daemons, o);
    // The drain's agents report their RPC figures when stopped; the latency run starts its own.
    const { rpcs, gc } = await stopAgents(ours.agents);
    emit("drain", { ...ours.figures, ...rpcFigures(rpcs), ...gcFigures("agents", gc) });
    progress(`baseline drain with ${o.baselineWorkers} raw SQL workers`);
    const base = await drainBaseline(db, o);
    emit("drain_baseline", base);
    emit("drain_ratio", { ours_items_per_s: ours.figures.items_per_s!, baseline_items_per_s: base.items_per_s!, ours_over_baseline: ratio(Number(ours.figures.items_per_s), Number(base.items_per_s)) });
  }
  if (only.has("latency")) {
    await settleDatabase(db);
    agents ??= await startAgents(daemons, o, "latency");
    progress(`steady ${o.rate}/s for ${o.durationMs / 1000}s after ${o.warmupMs / 1000}s warm-up`);
    const ours = await latencyOurs(daemons, agents, o);
    agents = undefined;
    emit("latency", ours);
    progress("baseline latency");
    const base = await latencyBaseline(db, o);
    emit("latency_baseline", base);
    emit("latency_ratio", { ours_p50_ms: ours.p50_ms!, baseline_p50_ms: base.p50_ms!, p50_ours_over_baseline: ratio(Number(ours.p50_ms), Number(base.p50_ms)), p99_ours_over_baseline: ratio(Number(ours.p99_ms), Number(base.p99_ms)) });
    progress(`HTTP/2 floor: a bare Node server and client at ${o.rate}/s`);
    emit("http2_floor", { ...(await http2Floor(o)), ...perItem(ours, o.rate) });
  }
  if (agents) await Promise.all(agents.map((a) => a.stop()));
  if (only.has("heartbeat")) {
    progress(`heartbeats of ${o.hbAgents} simulated agents for ${o.hbDurationMs / 1000}s`);
    emit("heartbeat", await heartbeatCost(db, daemons[0]!, o));
  }
} finally {
  await Promise.all(daemons.map((d) => d.child.stop()));
  await dropBaseline(db.url).catch(() => {});
  await db.close();
}

console.log("");
for (const r of results) console.log(`${r.name.padEnd(18)} ${Object.entries(r.figures).map(([k, v]) => `${k}=${v}`).join("  ")}`);
