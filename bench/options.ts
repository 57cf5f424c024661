/**
 * The benchmark's options: parsed and checked before anything starts, so a typo is a one-line error
 * (exit 2) rather than a run that measures nothing (a bare `--duration 10` is 10 ms, as everywhere
 * in aiflowd, and a steady phase that short has no items to measure).
 */
import { ConfigError, parseDuration } from "../src/config.js";
import type { Options } from "./sections.js";

export const HELP = `npm run bench -- [options]
  --items N          drain backlog (default 100000)
  --agents N         agent processes (default 4)
  --slots N          slots per agent (default 32)
  --prefetch N       items an agent may claim ahead of its free slots (default: the SDK's, 3 × slots here)
  --daemons N        daemon instances (default 1)
  --rate N           steady enqueue rate per second (default 1000)
  --duration D       steady phase length (default 10s)
  --warmup D         warm-up before measuring latency, sent but not measured (default 20s: docs/performance.md)
  --hb-agents N      simulated agents for the heartbeat cost (default 1000)
  --hb-duration D    heartbeat phase length (default 10s)
  --stream-agents N  simulated agents holding idle agent streams in the streams section (default 1000)
  --stream-idle D    how long the streams section watches them wait (default 10s)
  --drain-warmup N   items the drain's agents take first, uncounted (default 4000)
  --dag-items N      the DAG section's plain items (default 10000)
  --dag-chains N     the DAG section's 10-node chain runs, started at once (default 200)
  --dag-fanouts N    the DAG section's fan-out runs, started at once (default 5)
  --dag-width N      each fan-out's iterations (default 1000)
  --trigger-starts N runs the triggers section starts by StartRun and as many by webhook (default 2000)
  --console-agents N the console section's heartbeating agents (default 1000)
  --console-items N  the console section's pending items (default 100000)
  --console-window D how long the console section measures the daemon's CPU, closed and open (default 20s)
  --only LIST        comma list of: enqueue,drain,mixed,tenants,latency,streams,heartbeat,dag,triggers (default
                     all), fast-path, agent-path, sdk-transport, claim_cost, console, python;
                     mixed drains --items again, a mix of plain items, items that need GPU memory and
                     items under concurrency keys, with agents of several (simulated) GPU sizes, and
                     prints its rate ÷ the plain drain's (implies drain);
                     tenants drains --items again over 10 tenants with skewed backlogs (40 % down
                     to 2 %), weights t1=3 t2=2 (the rest 1) and no credit, by agents serving all
                     ten, and prints its rate ÷ the plain drain's and each tenant's share of the
                     dispatches while all had a backlog next to its weight's (implies drain);
                     latency includes the HTTP/2 floor (a bare Node HTTP/2 exchange at --rate);
                     dag, on a database, daemons and agents of its own: plain items drained,
                     then 10-node chains and fan-outs (split, --dag-width iterations, join) run
                     by the same agents; runs and nodes a second, the hand-offs between nodes,
                     and CPU per node ÷ CPU per plain item;
                     triggers, on a daemon and database of its own: runs started by signed
                     webhooks against as many StartRun calls, starts a second and CPU per start;
                     fast-path (only when named) drains twice in the run, with the daemon's
                     --grpc-fast-path and the SDK's fastTransport on, then both off;
                     sdk-transport (only when named) drains twice on the same daemons, the SDK
                     agents over its default transport (connect-node) and then over its own
                     (fastTransport): items/s and the agents' CPU per item of each, own ÷ default;
                     agent-path (only when named) drains and runs the steady rate twice, the
                     agents over the agent stream (the SDK's default), then by unary claims;
                     console (only when named; needs Debian's chromium) opens the web console in
                     headless Chromium over --console-agents heartbeating agents and
                     --console-items pending items: the first views' milliseconds and the
                     daemon's CPU with the console open ÷ closed;
                     python (only when named; needs Debian's python3-grpcio) drains --items three
                     times on the same daemons: --agents SDK agents, as many Python agents
                     (agent-sdk/python) of the same slots, then half of each; items/s and CPU
                     per item of each, Python ÷ TypeScript;
                     claim_cost (only when named) times the claim statement in this process, no
                     daemon: an agent of 1, 10, 100, 1000 backlogged tenants (fair share) against
                     an agent of one tenant, 200 claims of 32 over 20,000 items each
  --tls              also run the drain and the steady rate over TLS (daemons of their own, with a
                     certificate from scripts/dev-certs.sh), after the same sections over h2c, and
                     print TLS ÷ h2c (implies --only's drain and latency)
  --observability    also run the steady rate twice more with each daemon's /metrics scraped every
                     second: alone, then with traces exported (daemons and agents, OTLP to a local
                     collector stub); print the daemon CPU per item of each ÷ both off
                     (implies --only's latency)
  --no-graphile      skip the graphile-worker baseline (its drain and steady runs beside the raw
                     SQL baseline's, and the ours_over_graphile ratios)
  --smoke            a tiny run (seconds) to check the benchmark works`;

/**
 * The steady section's warm-up. Its processes are fresh (the agents and the producer start for it),
 * and after 3 s V8 was still optimising their hot paths: TurboFan's threads took 12 % of the
 * machine's samples (perf, system-wide) during the measured 10 s, against 4–5 % after 20 s or 30 s.
 * That is start-up cost, not what a long-running daemon and its agents pay per item.
 */
export const WARMUP_MS = 20_000;

export class BenchArgError extends Error {}

const SECTIONS = ["enqueue", "drain", "mixed", "tenants", "latency", "streams", "heartbeat", "dag", "triggers"];
/** Sections run only when --only names them. */
const OPT_IN = ["fast-path", "agent-path", "sdk-transport", "claim_cost", "console", "python"];

const count = (raw: string, flag: string, min = 1): number => {
  if (!/^\d+$/.test(raw) || Number(raw) < min) throw new BenchArgError(`${flag} needs a whole number ≥ ${min}, not '${raw}'`);
  return Number(raw);
};

const span = (raw: string, flag: string, minMs: number): number => {
  let ms: number;
  try {
    ms = parseDuration(raw, flag);
  } catch (err) {
    throw new BenchArgError(err instanceof ConfigError ? err.message : String(err));
  }
  if (ms < minMs) throw new BenchArgError(`${flag} ${raw} is ${ms} ms, shorter than ${minMs} ms (a bare number is milliseconds: write 10s)`);
  return ms;
};

/** Throws BenchArgError for a bad option; `help` is set when --help was asked for. */
export function parseOptions(argv: readonly string[]): { o: Options; only: Set<string>; help: boolean } {
  const o: Options = {
    items: 100_000,
    agents: 4,
    slots: 32,
    daemons: 1,
    rate: 1000,
    durationMs: 10_000,
    warmupMs: WARMUP_MS,
    hbAgents: 1000,
    hbDurationMs: 10_000,
    hbSettleMs: 11_000,
    hbIdleMs: 5_000,
    drainWarmup: 4_000,
    baselineWorkers: 32,
    streamAgents: 1000,
    streamIdleMs: 10_000,
    graphile: true,
    dagItems: 10_000,
    dagChains: 200,
    dagFanOuts: 5,
    dagWidth: 1000,
    triggerStarts: 2000,
    consoleAgents: 1000,
    consoleItems: 100_000,
    consoleWindowMs: 20_000,
  };
  let only = new Set(SECTIONS);
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i]!.split("=", 2);
    const value = () => inline ?? argv[++i] ?? "";
    switch (flag) {
      case "--help":
        return { o, only, help: true };
      case "--items":
        o.items = count(value(), flag);
        break;
      case "--agents":
        o.agents = count(value(), flag);
        break;
      case "--slots":
        o.slots = count(value(), flag);
        break;
      case "--prefetch":
        o.prefetch = count(value(), flag, 0);
        break;
      case "--daemons":
        o.daemons = count(value(), flag);
        break;
      case "--rate":
        o.rate = count(value(), flag);
        break;
      case "--duration":
        o.durationMs = span(value(), flag, 1000);
        break;
      case "--warmup":
        o.warmupMs = span(value(), flag, 0);
        break;
      case "--hb-agents":
        o.hbAgents = count(value(), flag);
        break;
      case "--hb-duration":
        o.hbDurationMs = span(value(), flag, 1000);
        break;
      case "--stream-agents":
        o.streamAgents = count(value(), flag);
        break;
      case "--stream-idle":
        o.streamIdleMs = span(value(), flag, 1000);
        break;
      case "--drain-warmup":
        o.drainWarmup = count(value(), flag, 0);
        break;
      case "--dag-items":
        o.dagItems = count(value(), flag);
        break;
      case "--dag-chains":
        o.dagChains = count(value(), flag);
        break;
      case "--dag-fanouts":
        o.dagFanOuts = count(value(), flag);
        break;
      case "--dag-width":
        o.dagWidth = count(value(), flag);
        break;
      case "--trigger-starts":
        o.triggerStarts = count(value(), flag);
        break;
      case "--console-agents":
        o.consoleAgents = count(value(), flag);
        break;
      case "--console-items":
        o.consoleItems = count(value(), flag);
        break;
      case "--console-window":
        o.consoleWindowMs = span(value(), flag, 1000);
        break;
      case "--only": {
        only = new Set(value().split(","));
        const unknown = [...only].filter((s) => !SECTIONS.includes(s) && !OPT_IN.includes(s));
        if (unknown.length > 0) throw new BenchArgError(`--only takes a comma list of ${[...SECTIONS, ...OPT_IN].join(", ")}; not '${unknown.join(",")}'`);
        break;
      }
      case "--tls":
        o.tls = true;
        break;
      case "--observability":
        o.observability = true;
        break;
      case "--no-graphile":
        o.graphile = false;
        break;
      case "--smoke":
        Object.assign(o, {
          items: 300,
          agents: 2,
          slots: 8,
          rate: 100,
          durationMs: 1000,
          warmupMs: 300,
          hbAgents: 50,
          hbDurationMs: 2000,
          hbSettleMs: 500,
          hbIdleMs: 1000,
          drainWarmup: 100,
          baselineWorkers: 4,
          streamAgents: 20,
          streamIdleMs: 1000,
          dagItems: 300,
          dagChains: 10,
          dagFanOuts: 1,
          dagWidth: 50,
          triggerStarts: 50,
          consoleAgents: 20,
          consoleItems: 300,
          consoleWindowMs: 1000,
        });
        break;
      default:
        throw new BenchArgError(`unknown option ${flag} (see --help)`);
    }
  }
  if (o.tls) for (const s of ["drain", "latency"]) only.add(s);
  if (o.observability) only.add("latency");
  if (only.has("mixed") || only.has("tenants")) only.add("drain");
  return { o, only, help: false };
}
