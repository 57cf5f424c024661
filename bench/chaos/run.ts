/**
 * The chaos run (issue 29): daemons, SDK agents and a producer on a Postgres cluster of the run's
 * own, under a seeded schedule of faults, then a verdict from the database. See HELP.
 * Output: one JSON line per figure set ({"figures":"…",…}), a summary table, exit 0 when every
 * invariant holds and 1 otherwise (2: bad options).
 */
import { mkdtempSync, chmodSync, rmSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pg from "pg";
import { freePort } from "../env.js";
import { Fleet, KIND, TENANT, ENGINE_TOKEN } from "./fleet.js";
import { ChaosPostgres } from "./postgres.js";
import { produce, type ProducerFigures } from "./producer.js";
import { broken, readAgentRecords, verify } from "./verify.js";
import { mulberry32 as prng } from "../../test/support/prng.js";

const HELP = `npm run chaos -- [options]
  --seed N        seed of the fault schedule and every random choice in it (default: the time)
  --daemons N     daemon processes (default 2)
  --agents N      SDK agent processes (default 6)
  --items N       items enqueued, each with an idempotency key (default 5000)
  --rate N        items enqueued per second (default 100)
  --faults N      faults of each kind (default 2): agent-kill, daemon-kill, pg-fast, pg-immediate, pg-outage
  --keep          keep the run's directory (logs, agents' records) even when it passes
  --small         the CI-sized run: 2 daemons, 2 agents, 300 items, one fault of each kind (< 60 s)
The run starts its own embedded Postgres on a spare port: a server it may stop and restart,
which a shared one must never be. Its data directory is removed at the end.`;

const FAULT_KINDS = ["agent-kill", "daemon-kill", "pg-fast", "pg-immediate", "pg-outage"] as const;
type FaultKind = (typeof FAULT_KINDS)[number];

interface Options {
  seed: number;
  daemons: number;
  agents: number;
  items: number;
  rate: number;
  faults: number;
  keep: boolean;
  small: boolean;
}

function parseOptions(argv: string[]): Options | "help" {
  const o: Options = { seed: Date.now() % 1_000_000, daemons: 2, agents: 6, items: 5000, rate: 100, faults: 2, keep: false, small: false };
  if (argv.includes("--small")) Object.assign(o, { daemons: 2, agents: 2, items: 300, rate: 15, faults: 1, small: true });
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === "--help" || a === "-h") return "help";
    if (a === "--small") continue;
    if (a === "--keep") {
      o.keep = true;
      continue;
    }
    const key = a.replace(/^--/, "") as keyof Options;
    if (!a.startsWith("--") || !["seed", "daemons", "agents", "items", "rate", "faults"].includes(key)) throw new ArgError(`unknown option ${a}`);
    const v = Number(argv[++i]);
    if (!Number.isInteger(v) || v < (key === "faults" || key === "seed" ? 0 : 1)) throw new ArgError(`${a} needs a whole number, not '${argv[i]}'`);
    (o as unknown as Record<string, number>)[key] = v;
  }
  return o;
}

class ArgError extends Error {}


/** Daemon timings: short, so that faults recover within seconds; the liveness window is 3 × 1 s. */
const HEARTBEAT_MS = 1000;
const LIVENESS_INTERVALS = 3;
const LIVENESS_WINDOW_MS = HEARTBEAT_MS * LIVENESS_INTERVALS;
const DAEMON_ENV = {
  AIFLOW_HEARTBEAT_INTERVAL: `${HEARTBEAT_MS}ms`,
  AIFLOW_LIVENESS_INTERVALS: String(LIVENESS_INTERVALS),
  AIFLOW_LEASE_TTL: "5s",
  AIFLOW_SWEEP_INTERVAL: "500ms",
  AIFLOW_SHUTDOWN_GRACE: "3s",
};
/** The outage outlasts the liveness window by this much: every agent's last beat is older than the window when Postgres returns. */
const OUTAGE_EXTRA_MS = 1500;
const RECOVERY_TIMEOUT_MS = 30_000;

const line = (o: object) => console.log(JSON.stringify(o));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function main(o: Options): Promise<number> {
  const random = prng(o.seed);
  const dir = mkdtempSync(join(tmpdir(), "aiflowd-chaos-"));
  chmodSync(dir, 0o755);
  const pgPort = await freePort();
  const postgres = new ChaosPostgres(join(dir, "pg"), pgPort);
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
  try {
    await postgres.start();
    const ports = await Promise.all(Array.from({ length: o.daemons }, () => freePort()));
    fleet = new Fleet({ dir, dbUrl: postgres.url, ports, agents: o.agents, slots: 4, handlerMs: [5, 40], daemonEnv: DAEMON_ENV });
    // The first daemon migrates alone; the rest start beside each other.
    await fleet.startDaemon(0);
    await Promise.all(ports.slice(1).map((_, i) => fleet!.startDaemon(i + 1)));
    await Promise.all(fleet.agentNames.map((_, i) => fleet!.startAgent(i)));
    const db = new pg.Pool({ connectionString: postgres.url, max: 2, connectionTimeoutMillis: 1000 });
    db.on("error", () => {}); // A restart drops idle connections; the pool makes new ones.
    const query = async <T extends pg.QueryResultRow>(text: string): Promise<T[] | undefined> => {
      try {
        return (await db.query<T>(text)).rows;
      } catch {
        return undefined; // Postgres is down: the caller polls again.
      }
    };

    const startedAt = Date.now();
    const producing = produce({ addresses: fleet.addresses, token: ENGINE_TOKEN, tenant: TENANT, kind: KIND, items: o.items, ratePerSec: o.rate, batch: 10, signal: abort.signal });
    let producer: ProducerFigures | undefined;
    void producing.then((p) => (producer = p)).catch(() => {});

    const schedule: FaultKind[] = FAULT_KINDS.flatMap((k) => Array.from({ length: o.faults }, () => k));
    for (let i = schedule.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      [schedule[i], schedule[j]] = [schedule[j]!, schedule[i]!];
    }
    const recoveries: Record<string, unknown>[] = [];
    for (const kind of schedule) {
      await sleep(o.small ? 500 + random() * 1000 : 1000 + random() * 2000);
      // A fault should find work in flight; wait for some (briefly) rather than hit an idle fleet.
      for (let t = 0; t < 50; t++) {
        const r = await query<{ n: string }>(`SELECT count(*) AS n FROM aiflow_work_item WHERE status = 'dispatched'`);
        if (Number(r?.[0]?.n ?? 0) > 0) break;
        await sleep(100);
      }
      const faultAt = Date.now();
      let target = "postgres";
      if (kind === "agent-kill") {
        const busy = (await query<{ name: string }>(`SELECT DISTINCT a.name FROM aiflow_work_item w JOIN aiflow_agent a ON w.agent_id IN (a.id, a.name) WHERE w.status = 'dispatched' ORDER BY a.name`)) ?? [];
        const names = busy.length > 0 ? busy.map((b) => b.name) : fleet.agentNames;
        target = names[Math.floor(random() * names.length)]!;
        await fleet.killAgent(fleet.agentIndex(target));
      } else if (kind === "daemon-kill") {
        const i = Math.floor(random() * o.daemons);
        target = `chaos-daemon-${i}`;
        await fleet.killDaemon(i);
      } else {
        await postgres.stop(kind === "pg-fast" ? "fast" : "immediate");
        if (kind === "pg-outage") await sleep(LIVENESS_WINDOW_MS + OUTAGE_EXTRA_MS);
        await postgres.start();
      }
      const liftedAt = Date.now();
      recoveries.push({ kind, target, at: new Date(faultAt).toISOString(), ...(await recovery(query, o.agents, faultAt, liftedAt)) });
      line({ figures: "fault", ...recoveries.at(-1) });
    }

    // The end: everything enqueued, then every item finished (or the timeout).
    producer = await producing;
    const drainDeadline = Date.now() + (o.small ? 45_000 : 120_000);
    let open = -1;
    while (Date.now() < drainDeadline) {
      const r = await query<{ open: string; total: string }>(`SELECT count(*) FILTER (WHERE status IN ('pending', 'dispatched')) AS open, count(*) AS total FROM aiflow_work_item`);
      open = r ? Number(r[0]!.open) : -1;
      if (open === 0 && Number(r![0]!.total) >= o.items) break;
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
    const records = readAgentRecords(fleet.recordFiles());
    const { verdict, marks } = await verify(postgres.url, o.items, fleet.agentNames, records, fleet.auditFiles(), fleet.agentGaps, observedUntil);
    await db.end();
    const crashes = [...fleet.crashes];
    const failures = broken(verdict, crashes.length);
    passed = failures.length === 0;

    const byKind = Object.fromEntries(
      FAULT_KINDS.map((k) => {
        const rs = recoveries.filter((r) => r.kind === k);
        const max = (f: string) => (rs.some((r) => r[f] === null) ? null : Math.max(...rs.map((r) => r[f] as number)));
        return [k, { count: rs.length, maxToNextCompletionMs: max("toNextCompletionMs"), maxToAllAgentsActiveMs: max("toAllAgentsActiveMs") }];
      }),
    );
    line({ figures: "recovery", byKind });
    line({ figures: "work", durationMs: drainedAt - startedAt, executions: verdict.executions, redeliveries: verdict.redeliveries, retries: verdict.retries, refusedZombieCompletions: records.refusedZombie, producer });
    line({ figures: "answers", agentErrorsByCode: records.rpcErrorsByCode, producerErrorsByCode: producer.errorsByCode, internal: (records.rpcErrorsByCode.Internal ?? 0) + (producer.errorsByCode.Internal ?? 0) });
    line({ figures: "liveness", livenessSweepMarks: marks.length, inactiveMarkedLive: verdict.inactiveMarkedLive, agentsNotActiveAtEnd: verdict.agentsNotActiveAtEnd, crashes });
    const { examples, ...counts } = verdict;
    line({ figures: "invariants", seed: o.seed, passed, broken: failures, ...counts, crashes: crashes.length, examples });
    summary(o, verdict, records.refusedZombie, producer, records.rpcErrorsByCode, byKind, crashes.length, failures);
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

/** From the fault to the first completion after it was lifted, and to every agent active again (null: not within the timeout). */
async function recovery(
  query: <T extends pg.QueryResultRow>(text: string) => Promise<T[] | undefined>,
  agents: number,
  faultAt: number,
  liftedAt: number,
): Promise<{ faultMs: number; toNextCompletionMs: number | null; toAllAgentsActiveMs: number | null }> {
  let toNextCompletionMs: number | null = null;
  let toAllAgentsActiveMs: number | null = null;
  const deadline = liftedAt + RECOVERY_TIMEOUT_MS;
  const liftedNs = BigInt(liftedAt) * 1_000_000n;
  while (Date.now() < deadline && (toNextCompletionMs === null || toAllAgentsActiveMs === null)) {
    const r = await query<{ done: boolean; active: string; open: string }>(
      `SELECT EXISTS (SELECT 1 FROM aiflow_work_item WHERE completed_at > ${liftedNs}) AS done,
              (SELECT count(*) FROM aiflow_agent WHERE status = 'active') AS active,
              (SELECT count(*) FROM aiflow_work_item WHERE status IN ('pending', 'dispatched')) AS open`,
    );
    if (r) {
      // With nothing left to do there is no next completion to wait for.
      if (toNextCompletionMs === null && (r[0]!.done || Number(r[0]!.open) === 0)) toNextCompletionMs = Date.now() - faultAt;
      if (toAllAgentsActiveMs === null && Number(r[0]!.active) >= agents) toAllAgentsActiveMs = Date.now() - faultAt;
    }
    await sleep(50);
  }
  return { faultMs: liftedAt - faultAt, toNextCompletionMs, toAllAgentsActiveMs };
}

function summary(
  o: Options,
  v: Awaited<ReturnType<typeof verify>>["verdict"],
  refused: number,
  producer: ProducerFigures,
  agentErrors: Record<string, number>,
  byKind: Record<string, { count: number; maxToNextCompletionMs: number | null; maxToAllAgentsActiveMs: number | null }>,
  crashes: number,
  failures: string[],
): void {
  const ms = (n: number | null) => (n === null ? "—" : `${(n / 1000).toFixed(1)} s`);
  const rows: [string, string][] = [
    ["seed", String(o.seed)],
    ["items enqueued / rows / completed", `${v.enqueued} / ${v.rows} / ${v.completed}`],
    ["lost / doubled / stuck", `${v.lost} / ${v.doubled} / ${v.stuck}`],
    ["ran beyond redeliveries / holder without run", `${v.overRun} / ${v.holderDidNotRun}`],
    ["dead letters / cancelled", `${v.deadLetters} / ${v.cancelled}`],
    ["live agents marked inactive", String(v.inactiveMarkedLive)],
    ["agents not active at end", v.agentsNotActiveAtEnd.join(", ") || "none"],
    ["executions / redeliveries / retries", `${v.executions} / ${v.redeliveries} / ${v.retries}`],
    ["refused zombie completions", String(refused)],
    ["INTERNAL answers (agents + producer)", String((agentErrors.Internal ?? 0) + (producer.errorsByCode.Internal ?? 0))],
    ["processes that died on their own", String(crashes)],
    ...Object.entries(byKind).map(([k, r]): [string, string] => [`recovery ${k} (×${r.count})`, `next completion ${ms(r.maxToNextCompletionMs)}, all agents active ${ms(r.maxToAllAgentsActiveMs)}`]),
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
