/**
 * The chaos run: daemons, SDK agents (in the SDK's default stream mode, or unary) and a producer on
 * a Postgres cluster of the run's own, under a seeded schedule of faults (faults.ts), each one's
 * recovery measured (recovery.ts), then a verdict from the database, the agents' records and the
 * processes' exits (verify.ts). See HELP.
 * Output: one JSON line per figure set ({"figures":"…",…}), a summary table, exit 0 when every
 * invariant holds and 1 otherwise (2: bad options).
 */
import { mkdtempSync, chmodSync, rmSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { freePort } from "../env.js";
import { Fleet, KIND, TENANT, ENGINE_TOKEN, RUNS_TOKEN } from "./fleet.js";
import { ChaosPostgres } from "./postgres.js";
import { produce, type ProducerFigures } from "./producer.js";
import { DAG_CHAIN, DAG_FAN_OUT, DAG_NODES_PER_RUN, DagProducer, dagRunKey, type DagProducerFigures } from "./dag-producer.js";
import { broken, readAgentRecords, verify, type RunChecks } from "./verify.js";
import { DAEMON_TERM_BOUND_MS, FAULT_HELP, FAULT_KINDS, FAULTS, type FaultKind } from "./faults.js";
import { byKind, rateBefore, recovery, type KindRecovery, type Query, type Recovery } from "./recovery.js";
import { mulberry32 as prng } from "../../test/support/prng.js";

const HELP = `npm run chaos -- [options]
  --seed N        seed of the fault schedule and every random choice in it (default: the time)
  --mode M        how the agents take work: stream (the SDK's default, the agent stream) or unary
                  (stream: false, unary claims) (default stream)
  --daemons N     daemon processes (default 2)
  --agents N      SDK agent processes (default 6)
  --items N       items enqueued, each with an idempotency key (default 5000)
  --rate N        items enqueued per second while faults are injected; the rest goes at once after
                  the last fault (default 25)
  --dag-runs N    DAG runs started through DagService, each a ${DAG_CHAIN}-node chain beside a fan-out of ${DAG_FAN_OUT}
                  and a join (${DAG_NODES_PER_RUN} node items, of the agents' engine kind); a share starts before
                  each fault, so runs are advancing while it hits, the rest after the last fault;
                  each must complete, every node exactly once (default 40; 0: none)
  --faults N      faults of each kind (default 2)
  --kinds a,b,…   the fault kinds (default all):
${FAULT_KINDS.map((k) => `                    ${k.padEnd(15)} ${FAULT_HELP[k]}`).join("\n")}
  --keep          keep the run's directory (logs, agents' records) even when it passes
  --small         the CI-sized run: 2 daemons, 3 agents, 300 items at 2 a second, 10 DAG runs, one
                  fault of each kind, a 20 s recovery bound (about 100 s)
The run starts its own embedded Postgres on a spare port: a server it may stop and restart,
which a shared one must never be. Its data directory is removed at the end.`;

type Mode = "stream" | "unary";

interface Options {
  seed: number;
  mode: Mode;
  daemons: number;
  agents: number;
  items: number;
  rate: number;
  dagRuns: number;
  faults: number;
  kinds: FaultKind[];
  keep: boolean;
  small: boolean;
}

const NUMERIC = ["seed", "daemons", "agents", "items", "rate", "dag-runs", "faults"];

function parseOptions(argv: string[]): Options | "help" {
  const o: Options = {
    seed: Date.now() % 1_000_000,
    mode: "stream",
    daemons: 2,
    agents: 6,
    items: 5000,
    rate: 25,
    dagRuns: 40,
    faults: 2,
    kinds: [...FAULT_KINDS],
    keep: false,
    small: false,
  };
  if (argv.includes("--small")) Object.assign(o, { daemons: 2, agents: 3, items: 300, rate: 2, dagRuns: 10, faults: 1, small: true });
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--help" || a === "-h") return "help";
    if (a === "--small") continue;
    if (a === "--keep") {
      o.keep = true;
      continue;
    }
    if (a === "--mode") {
      const m = argv[++i];
      if (m !== "stream" && m !== "unary") throw new ArgError(`--mode is stream or unary, not '${m}'`);
      o.mode = m;
      continue;
    }
    if (a === "--kinds") {
      const ks = (argv[++i] ?? "").split(",").filter(Boolean);
      const bad = ks.filter((k) => !(FAULT_KINDS as readonly string[]).includes(k));
      if (ks.length === 0 || bad.length > 0)
        throw new ArgError(`--kinds takes some of ${FAULT_KINDS.join(", ")}${bad.length ? `, not ${bad.join(", ")}` : ""}`);
      o.kinds = FAULT_KINDS.filter((k) => ks.includes(k));
      continue;
    }
    const name = a.replace(/^--/, "");
    if (!a.startsWith("--") || !NUMERIC.includes(name)) throw new ArgError(`unknown option ${a}`);
    const key = name.replace(/-(\w)/g, (_, c: string) => c.toUpperCase()) as keyof Options;
    const v = Number(argv[++i]);
    if (!Number.isInteger(v) || v < (key === "faults" || key === "seed" || key === "dagRuns" ? 0 : 1))
      throw new ArgError(`${a} needs a whole number, not '${argv[i]}'`);
    (o as unknown as Record<string, number>)[key] = v;
  }
  return o;
}

class ArgError extends Error {}

/** Daemon timings: short, so that faults recover within seconds; the liveness window is 3 × 1 s. */
const DAEMON_ENV = {
  AIFLOW_HEARTBEAT_INTERVAL: "1000ms",
  AIFLOW_LIVENESS_INTERVALS: "3",
  AIFLOW_LEASE_TTL: "5s",
  AIFLOW_SWEEP_INTERVAL: "500ms",
  AIFLOW_SHUTDOWN_GRACE: "3s",
};
/** An agent given SIGTERM at the end must exit within this: 3 × its rpcTimeoutMs, the SDK's bound on each step of a shutdown. */
const AGENT_TERM_BOUND_MS = 15_000;

const line = (o: object) => console.log(JSON.stringify(o));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function main(o: Options): Promise<number> {
  const random = prng(o.seed);
  const dir = mkdtempSync(join(tmpdir(), "aiflowd-chaos-"));
  chmodSync(dir, 0o755);
  const pgPort = await freePort();
  const postgres = new ChaosPostgres(join(dir, "pg"), pgPort);
  const recoveryTimeoutMs = o.small ? 20_000 : 30_000;
  line({ figures: "setup", dir, postgresPort: pgPort, why: "an embedded Postgres of the run's own: a server it may stop and restart", ...o });
  let fleet: Fleet | undefined;
  let passed = false;
  // Ctrl-C: kill every child, stop Postgres (immediate) and remove the run's directory, all
  // synchronously, before proc.ts's own handler (which only kills children) could exit first.
  const onSignal = () => {
    fleet?.killAllNow();
    try {
      const pid = Number.parseInt(readFileSync(join(dir, "pg", "postmaster.pid"), "utf8"), 10);
      process.kill(pid, "SIGQUIT");
      const until = Date.now() + 5000;
      while (Date.now() < until && existsProc(pid)) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 25);
    } catch {
      // Postgres was not running.
    }
    rmSync(dir, { recursive: true, force: true });
    process.exit(130);
  };
  process.prependListener("SIGINT", onSignal);
  process.prependListener("SIGTERM", onSignal);
  const abort = new AbortController();
  const unpaced = new AbortController();
  try {
    await postgres.start();
    const ports = await Promise.all(Array.from({ length: o.daemons }, () => freePort()));
    // Handlers long enough that a fault finds items mid-handler even at the small run's pace.
    fleet = new Fleet({ dir, dbUrl: postgres.url, ports, agents: o.agents, slots: 4, handlerMs: [20, 300], daemonEnv: DAEMON_ENV, mode: o.mode });
    // The first daemon migrates alone; the rest start beside each other.
    await fleet.startDaemon(0);
    await Promise.all(ports.slice(1).map((_, i) => fleet!.startDaemon(i + 1)));
    await Promise.all(fleet.agentNames.map((_, i) => fleet!.startAgent(i)));
    const db = new pg.Pool({ connectionString: postgres.url, max: 2, connectionTimeoutMillis: 1000 });
    db.on("error", () => {}); // A restart drops idle connections; the pool makes new ones.
    const query: Query = async <T extends pg.QueryResultRow>(text: string) => {
      try {
        return (await db.query<T>(text)).rows;
      } catch {
        return undefined; // Postgres is down: the caller polls again.
      }
    };

    const startedAt = Date.now();
    const batch = o.small ? 2 : 10;
    const producing = produce({
      addresses: fleet.addresses,
      token: ENGINE_TOKEN,
      tenant: TENANT,
      kind: KIND,
      items: o.items,
      ratePerSec: o.rate,
      batch,
      signal: abort.signal,
      unpaced: unpaced.signal,
    });
    let producer: ProducerFigures | undefined;
    void producing.then((p) => (producer = p)).catch(() => {});
    const dag = new DagProducer({ addresses: fleet.addresses, token: RUNS_TOKEN, tenant: TENANT, kind: KIND, runs: o.dagRuns, signal: abort.signal });
    dag.done.catch(() => {});

    const schedule: FaultKind[] = o.kinds.flatMap((k) => Array.from({ length: o.faults }, () => k));
    for (let i = schedule.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      [schedule[i], schedule[j]] = [schedule[j]!, schedule[i]!];
    }
    const recoveries: (Recovery & { kind: FaultKind; target: string; at: string; dagRunsRunning: number | null })[] = [];
    const hung: RunChecks["hung"] = [];
    for (const [f, kind] of schedule.entries()) {
      // This fault's share of the DAG runs starts now, so that they are in the middle of their chains when it hits.
      dag.release(Math.ceil((o.dagRuns * (f + 1)) / schedule.length));
      await sleep(o.small ? 300 + random() * 500 : 1000 + random() * 2000);
      // A fault should find work in flight; wait for some (briefly) rather than hit an idle fleet.
      for (let t = 0; t < 100; t++) {
        const r = await query<{ n: string }>(`SELECT count(*) AS n FROM aiflow_work_item WHERE status = 'dispatched'`);
        if (Number(r?.[0]?.n ?? 0) > 0) break;
        await sleep(50);
      }
      const before = await rateBefore(query, Date.now());
      // The DAG runs this fault finds in the middle (a figure: the runs are meant to be advancing through the faults).
      const running = await query<{ n: string }>(`SELECT count(*) AS n FROM aiflow_run WHERE runtype = 'dag' AND states -> -1 ->> 'state' = 'running'`);
      const faultAt = Date.now();
      const { target, term } = await FAULTS[kind]({ fleet, postgres, random, query });
      const liftedAt = Date.now();
      const at = new Date(faultAt).toISOString();
      if (term?.hung) hung.push({ process: term.process, at, boundMs: DAEMON_TERM_BOUND_MS });
      const r = await recovery(query, {
        agents: o.agents,
        faultAt,
        liftedAt,
        timeoutMs: recoveryTimeoutMs,
        rateBefore: before,
        producing: () => producer === undefined || dag.producing,
      });
      recoveries.push({ kind, target, at, dagRunsRunning: running ? Number(running[0]!.n) : null, ...r });
      line({ figures: "fault", ...recoveries.at(-1), ...(term ? { sigtermExitMs: term.ms } : {}) });
    }

    // The end: the rest enqueued (and the rest of the DAG runs started) at once, then every item
    // finished, plain or a DAG node's, and every DAG run ended (or the timeout).
    unpaced.abort();
    dag.releaseAll();
    producer = await producing;
    const dagFigures: DagProducerFigures = await dag.done;
    const drainDeadline = Date.now() + (o.small ? 45_000 : 120_000);
    while (Date.now() < drainDeadline) {
      const r = await query<{ open: string; plain: string; running: string }>(
        `SELECT count(*) FILTER (WHERE status IN ('pending', 'dispatched')) AS open, count(*) FILTER (WHERE run_id IS NULL) AS plain,
                (SELECT count(*) FROM aiflow_run WHERE runtype = 'dag' AND states -> -1 ->> 'state' = 'running') AS running
           FROM aiflow_work_item`,
      );
      if (r && Number(r[0]!.open) === 0 && Number(r[0]!.plain) >= o.items && Number(r[0]!.running) === 0) break;
      await sleep(200);
    }
    const drainedAt = Date.now();
    // Agents must be seen active again after the last fault (a reconnect after an outage takes a beat).
    for (let t = 0; t < 50; t++) {
      const r = await query<{ n: string }>(`SELECT count(*) AS n FROM aiflow_agent WHERE status = 'active'`);
      if (Number(r?.[0]?.n ?? 0) >= o.agents) break;
      await sleep(100);
    }
    const observedUntil = Date.now();
    const { verdict, marks } = await verify(
      postgres.url,
      o.items,
      { runs: o.dagRuns, key: dagRunKey },
      fleet.agentNames,
      readAgentRecords(fleet.recordFiles()),
      fleet.auditFiles(),
      fleet.agentGaps,
      observedUntil,
    );
    await db.end();
    // SIGTERM to every agent, each bounded; then their records again, with what they wrote on the way out.
    const stops = await fleet.stopAgents(AGENT_TERM_BOUND_MS);
    const endAt = new Date().toISOString();
    for (const s of stops) if (s.hung) hung.push({ process: s.process, at: endAt, boundMs: AGENT_TERM_BOUND_MS });
    const records = readAgentRecords(fleet.recordFiles());
    const crashes = [...fleet.crashes];
    const checks: RunChecks = {
      crashes: crashes.length,
      refused: records.refusedZombie,
      internal: (records.rpcErrorsByCode.Internal ?? 0) + (producer.errorsByCode.Internal ?? 0) + (dagFigures.errorsByCode.Internal ?? 0),
      unrecovered: recoveries.filter((r) => r.unrecovered).map((r) => ({ kind: r.kind, at: r.at, open: r.open })),
      recoveryTimeoutMs,
      hung,
    };
    const failures = broken(verdict, checks);
    passed = failures.length === 0;

    const kinds = byKind(o.kinds, recoveries);
    line({ figures: "recovery", mode: o.mode, timeoutMs: recoveryTimeoutMs, byKind: kinds });
    line({
      figures: "work",
      mode: o.mode,
      durationMs: drainedAt - startedAt,
      executions: verdict.executions,
      redeliveries: verdict.redeliveries,
      retries: verdict.retries,
      dagExecutions: verdict.dagExecutions,
      dagRedeliveries: verdict.dagRedeliveries,
      dagRetries: verdict.dagRetries,
      refusedZombieCompletions: records.refusedZombie,
      refusedExamples: records.refusedIds,
      outcomes: records.outcomes,
      producer,
      dagProducer: dagFigures,
    });
    line({
      figures: "answers",
      agentErrorsByCode: records.rpcErrorsByCode,
      producerErrorsByCode: producer.errorsByCode,
      dagProducerErrorsByCode: dagFigures.errorsByCode,
      internal: checks.internal,
    });
    line({
      figures: "liveness",
      livenessSweepMarks: marks.length,
      inactiveMarkedLive: verdict.inactiveMarkedLive,
      agentsNotActiveAtEnd: verdict.agentsNotActiveAtEnd,
      crashes,
    });
    line({ figures: "shutdown", agentStopMs: Object.fromEntries(stops.map((s) => [s.process, s.ms])), boundMs: AGENT_TERM_BOUND_MS, hung });
    const { examples, ...counts } = verdict;
    line({
      figures: "invariants",
      seed: o.seed,
      mode: o.mode,
      passed,
      broken: failures,
      ...counts,
      crashes: crashes.length,
      unrecovered: checks.unrecovered.length,
      unrecoveredKinds: checks.unrecovered.map((u) => u.kind),
      refused: checks.refused,
      internal: checks.internal,
      hung: hung.length,
      hungProcesses: hung.map((h) => h.process),
      examples: { ...examples, ...(records.refusedIds.length ? { refused: records.refusedIds } : {}) },
    });
    const dagHit = recoveries.filter((r) => (r.dagRunsRunning ?? 0) > 0).length;
    line({
      figures: "dag",
      runs: o.dagRuns,
      faultsThatFoundRunsRunning: dagHit,
      faults: recoveries.length,
      runningAtEachFault: recoveries.map((r) => r.dagRunsRunning),
    });
    summary(o, verdict, checks, producer, dagFigures, kinds, failures, drainedAt - startedAt, `${dagHit} of ${recoveries.length}`);
    return passed ? 0 : 1;
  } finally {
    abort.abort();
    await fleet?.stop().catch(() => {});
    await postgres.close().catch(() => {});
    process.removeListener("SIGINT", onSignal);
    process.removeListener("SIGTERM", onSignal);
    if (passed && !o.keep) rmSync(dir, { recursive: true, force: true });
    else {
      rmSync(join(dir, "pg"), { recursive: true, force: true });
      console.error(`chaos: logs and agents' records kept in ${dir}`);
    }
  }
}

function summary(
  o: Options,
  v: Awaited<ReturnType<typeof verify>>["verdict"],
  x: RunChecks,
  producer: ProducerFigures,
  dag: DagProducerFigures,
  kinds: Record<string, KindRecovery>,
  failures: string[],
  durationMs: number,
  dagHit: string,
): void {
  const s = (n: number | null) => (n === null ? "—" : `${(n / 1000).toFixed(1)} s`);
  const rows: [string, string][] = [
    ["seed / mode", `${o.seed} / ${o.mode}`],
    ["daemons / agents", `${o.daemons} / ${o.agents}`],
    ["work / whole run", `${s(durationMs)} / ${s(performance.now())}`],
    ["plain items enqueued / rows / completed", `${v.enqueued} / ${v.rows} / ${v.completed}`],
    ["lost / doubled / stuck", `${v.lost} / ${v.doubled} / ${v.stuck}`],
    ["ran beyond redeliveries / holder without run", `${v.overRun} / ${v.holderDidNotRun}`],
    ["dead letters / cancelled", `${v.deadLetters} / ${v.cancelled}`],
    ["DAG runs asked / started / ended / not ended", `${v.dagRuns} / ${v.dagRunsStarted} / ${v.dagRunsEnded} / ${v.dagRunsNotEnded}`],
    ["faults that found DAG runs running", dagHit],
    ["DAG nodes / completed once / doubled / missing", `${v.dagNodes} / ${v.dagNodesCompleted} / ${v.dagNodesDoubled} / ${v.dagNodesMissing}`],
    ["DAG node items / completed / stuck / failed", `${v.dagItems} / ${v.dagItemsCompleted} / ${v.dagItemsStuck} / ${v.dagItemsFailed}`],
    ["DAG items doubled / beyond redeliveries / holder without run", `${v.dagItemsDoubled} / ${v.dagItemsOverRun} / ${v.dagItemsHolderDidNotRun}`],
    ["live agents marked inactive", String(v.inactiveMarkedLive)],
    ["agents not active at end", v.agentsNotActiveAtEnd.join(", ") || "none"],
    ["executions / redeliveries / retries (plain)", `${v.executions} / ${v.redeliveries} / ${v.retries}`],
    ["executions / redeliveries / retries (DAG)", `${v.dagExecutions} / ${v.dagRedeliveries} / ${v.dagRetries}`],
    ["unrecovered faults", x.unrecovered.length === 0 ? "0" : `${x.unrecovered.length} (${x.unrecovered.map((u) => u.kind).join(", ")})`],
    ["refused results (lease lost)", String(x.refused)],
    [
      "INTERNAL answers (agents + producers)",
      `${x.internal} (producer ${producer.errorsByCode.Internal ?? 0}, DAG producer ${dag.errorsByCode.Internal ?? 0})`,
    ],
    ["hung on SIGTERM", x.hung.length === 0 ? "0" : `${x.hung.length} (${x.hung.map((h) => h.process).join(", ")})`],
    ["processes that died on their own", String(x.crashes)],
    ...Object.entries(kinds).map(([k, r]): [string, string] => [
      `recovery ${k} (×${r.count})`,
      r.count === r.nothingLeft
        ? `down ${s(r.maxDownMs)}; nothing left to do`
        : `down ${s(r.maxDownMs)}; then first completion ${s(r.maxFirstCompletionMs)}, rate half ${r.maxRateHalfMs === null ? "not soon" : s(r.maxRateHalfMs)}, all agents active ${s(r.maxAllAgentsActiveMs)}${r.unrecovered ? `; UNRECOVERED ${r.unrecovered}` : ""}`,
    ]),
    ["verdict", failures.length === 0 ? "PASS" : `FAIL: ${failures.join("; ")}`],
  ];
  const w = Math.max(...rows.map(([k]) => k.length));
  for (const [k, val] of rows) console.log(`${k.padEnd(w)}  ${val}`);
}

function existsProc(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

let opts: Options | "help";
try {
  opts = parseOptions(process.argv.slice(2));
} catch (err) {
  if (!(err instanceof ArgError)) throw err;
  console.error(`chaos: ${err.message}\n\n${HELP}`);
  process.exit(2);
}
if (opts === "help") {
  console.log(HELP);
  process.exit(0);
}
main(opts).then(
  (code) => process.exit(code),
  (err) => {
    console.error("chaos: the run failed before its verdict:", err);
    process.exit(1);
  },
);
