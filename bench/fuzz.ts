/**
 * The fuzzers by hand, as long as asked: the same cases as test/fuzz-server.test.ts and
 * test/fuzz-codec.test.ts (test/support/fuzz*.ts), at any count and seed. The daemon target starts
 * a daemon process of its own (this tree, against DATABASE_URL, in a schema of its own that is
 * dropped afterwards), so a crash is seen as the process exiting, with the case that was in flight.
 *   DATABASE_URL=postgres://… npx tsx bench/fuzz.ts --cases 100000 --seed 7
 *   npx tsx bench/fuzz.ts --target codec --seed 7 --case 1234      (replays one case, and prints it)
 * Prints JSON lines: each failure as it is found, progress every --every cases, and a summary per
 * target (counts by answer, time, and the failing cases to replay with --case).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import net from "node:net";
import { performance } from "node:perf_hooks";
import { createInterface } from "node:readline";
import { sql } from "./pg.js";
import { CI_LIMITS, type Limits } from "../test/support/fuzz.js";
import { checkDecode, decodeCase, runDecodeCases } from "../test/support/fuzz-codec.js";
import { checkCall, describeReply, HostileServer, playCase, replyCase, runClientCases } from "../test/support/fuzz-client.js";
import { describeCase, H2Client, judge, requestCase, RowDigest, runCases, send, type FuzzTokens } from "../test/support/fuzz-daemon.js";

const HELP = `DATABASE_URL=postgres://… npx tsx bench/fuzz.ts [options]
  --target T      daemon (default), codec, client, or all
  --cases N       cases per target (default 10000)
  --seed N        the run's seed (default: a random one, printed)
  --case I        replay case I of --seed alone, and print it whole
  --max-bytes N   the largest message a mutator makes (default ${CI_LIMITS.maxBytes})
  --every N       a progress line every N cases (default 10000)
A daemon case replayed alone runs on an empty schema: one whose answer depended on rows earlier
cases made may answer otherwise. codec and client need no database.`;

const args = process.argv.slice(2);
if (args.includes("--help") || args.includes("-h")) {
  console.log(HELP);
  process.exit(0);
}
const arg = (name: string): string | undefined => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const num = (name: string, fallback: number): number => {
  const raw = arg(name);
  if (raw === undefined) return fallback;
  if (!/^\d+$/.test(raw)) {
    console.error(`${name}: '${raw}' is not a whole number (see --help)`);
    process.exit(2);
  }
  return Number(raw);
};
const TARGETS = ["daemon", "codec", "client"] as const;
const target = arg("--target") ?? "daemon";
if (target !== "all" && !(TARGETS as readonly string[]).includes(target)) {
  console.error(`--target: '${target}' is not one of ${TARGETS.join(", ")}, all`);
  process.exit(2);
}
const SEED = num("--seed", Math.floor(Math.random() * 2 ** 32));
const CASES = num("--cases", 10_000);
const ONE = arg("--case") === undefined ? undefined : num("--case", 0);
const EVERY = Math.max(1, num("--every", 10_000));
const limits: Limits = { maxBytes: num("--max-bytes", CI_LIMITS.maxBytes) };
const print = (o: object) => console.log(JSON.stringify(o, (_k, v: unknown) => (typeof v === "bigint" ? String(v) : v)));

/** Runs `count` cases from `first` in chunks of EVERY, printing progress; `run` returns the chunk's failures. */
async function chunks(
  name: string,
  run: (first: number, count: number) => Promise<{ cases: number; failures: unknown[] }>,
): Promise<{ cases: number; failures: number; ms: number }> {
  const t0 = performance.now();
  let done = 0;
  let failures = 0;
  while (done < CASES) {
    const r = await run(done, Math.min(EVERY, CASES - done));
    failures += r.failures.length;
    done += r.cases;
    if (done < CASES) print({ fuzz: name, seed: SEED, done, failures, ms: Math.round(performance.now() - t0) });
    if (r.cases === 0) break;
  }
  return { cases: done, failures, ms: Math.round(performance.now() - t0) };
}

// ---- daemon ----------------------------------------------------------------------------------

const TOKENS: FuzzTokens = { agent: "fuzz-agent-token", engine: "fuzz-engine-token", ops: "fuzz-ops-token" };

interface Child {
  proc: ChildProcess;
  address: string;
  /** Error lines the daemon logged (its --log-level is error). */
  errors: string[];
  /** The last lines of its stderr (a crash's stack), and how many warnings it printed there. */
  stderr: string[];
  warnings: number;
}

async function freePort(): Promise<number> {
  const s = net.createServer().listen(0, "127.0.0.1");
  await once(s, "listening");
  const port = (s.address() as net.AddressInfo).port;
  s.close();
  return port;
}

async function startDaemon(url: string, schema: string): Promise<Child> {
  const port = await freePort();
  // As the test's daemon: no caller throttled for its bad tokens, long-polls short, and no sweep,
  // flush or lease expiry within a run, so rows change only by what the cases do.
  const flags = [
    "--auth-failure-limit",
    "1000000000",
    "--claim-max-wait",
    "200ms",
    "--heartbeat-flush",
    "1h",
    "--sweep-interval",
    "1h",
    "--heartbeat-interval",
    "1h",
    "--lease-ttl",
    "1h",
  ];
  const tokens = Object.entries(TOKENS).flatMap(([role, token]) => ["--token", `${role}:${token}`]);
  const proc = spawn(
    process.execPath,
    [
      "--import",
      "tsx",
      "src/cli/aiflowd.ts",
      "serve",
      "--listen",
      `127.0.0.1:${port}`,
      "--http-listen",
      "off",
      "--database-url",
      url,
      "--schema",
      schema,
      "--log-level",
      "error",
      ...tokens,
      ...flags,
    ],
    {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, NODE_ENV: "production" },
    },
  );
  const child: Child = { proc, address: `127.0.0.1:${port}`, errors: [], stderr: [], warnings: 0 };
  createInterface({ input: proc.stdout! }).on("line", (line) => child.errors.push(line));
  createInterface({ input: proc.stderr! }).on("line", (line) => {
    if (/Warning:/.test(line)) child.warnings++;
    child.stderr.push(line);
    if (child.stderr.length > 50) child.stderr.shift();
  });
  const probe = new H2Client(child.address);
  try {
    const deadline = performance.now() + 60_000;
    for (;;) {
      if (proc.exitCode !== null) throw new Error(`the daemon exited ${proc.exitCode} while starting`);
      if (performance.now() > deadline) throw new Error("the daemon did not start within 60 s");
      const a = await send(probe, {
        headers: { ":method": "POST", ":path": "/grpc.health.v1.Health/Check", "content-type": "application/grpc", te: "trailers" },
        chunks: [Buffer.alloc(5)],
        waitMs: 1000,
      });
      if (a.grpcStatus === "0") return child;
      await new Promise((r) => setTimeout(r, 200));
    }
  } finally {
    probe.close();
  }
}

async function fuzzDaemon(): Promise<number> {
  const url = process.env.DATABASE_URL;
  if (!url) throw new Error("the daemon target needs DATABASE_URL (a Postgres it may create a schema in)");
  const schema = `fuzz_${SEED}_${process.pid}`;
  const d = await startDaemon(url, schema);
  let exited: number | string | null = null;
  d.proc.once("exit", (code, signal) => (exited = code ?? signal));
  const client = new H2Client(d.address);
  const rows = await RowDigest.open(url, schema);
  let failures = 0;
  try {
    if (ONE !== undefined) {
      const c = requestCase(SEED, ONE, TOKENS, limits);
      const a = await send(client, c);
      const why = judge(c, a);
      print({ fuzz: "daemon", replay: describeCase(c, a), why: why ?? "passes", daemonErrors: d.errors });
      return why ? 1 : 0;
    }
    let logged = 0;
    const answers: Record<string, number> = {};
    const summary = await chunks("daemon", async (first, count) => {
      const r = await runCases({ seed: SEED, first, count, client, tokens: TOKENS, limits, rows, stop: () => exited !== null, onFailure: print });
      for (const [k, v] of Object.entries(r.answers)) answers[k] = (answers[k] ?? 0) + v;
      // What the daemon logged at error level during the chunk, named by the chunk's cases.
      const errors = d.errors
        .slice(logged)
        .map((line) => ({ fuzz: "daemon", seed: SEED, cases: [first, first + r.cases - 1], why: "the daemon logged an error", line }));
      logged = d.errors.length;
      for (const e of errors) print(e);
      if (exited !== null) {
        const crash = {
          fuzz: "daemon",
          seed: SEED,
          case: first + r.cases - 1,
          why: `the daemon exited (${exited}) during this case or just before it`,
          stderr: d.stderr,
        };
        print(crash);
        return { cases: r.cases, failures: [...r.failures, ...errors, crash] };
      }
      return { cases: r.cases, failures: [...r.failures, ...errors] };
    });
    failures = summary.failures;
    // Warnings on its stderr (a TimeoutOverflowWarning, say) are counted, not failures.
    print({ fuzz: "daemon", seed: SEED, ...summary, answers, daemonWarnings: d.warnings });
  } finally {
    client.close();
    await rows.close();
    d.proc.kill("SIGTERM");
    const t = setTimeout(() => d.proc.kill("SIGKILL"), 15_000);
    if (d.proc.exitCode === null && d.proc.signalCode === null) await once(d.proc, "exit");
    clearTimeout(t);
    await sql(url, `DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
  }
  return failures;
}

// ---- codec and client ------------------------------------------------------------------------

async function fuzzCodec(): Promise<number> {
  if (ONE !== undefined) {
    const c = decodeCase(SEED, ONE, limits);
    const r = checkDecode(c);
    print({
      fuzz: "codec",
      replay: { seed: SEED, case: ONE, type: c.desc.typeName, mutations: c.mutations, bytes: Buffer.from(c.bytes).toString("hex") },
      outcome: r.outcome,
      why: r.why ?? "passes",
    });
    return r.why ? 1 : 0;
  }
  const outcomes: Record<string, number> = {};
  const summary = await chunks("codec", async (first, count) => {
    const r = runDecodeCases({ seed: SEED, first, count, limits });
    for (const [k, v] of Object.entries(r.outcomes)) outcomes[k] = (outcomes[k] ?? 0) + v;
    for (const f of r.failures) print({ fuzz: "codec", ...f });
    return r;
  });
  print({ fuzz: "codec", seed: SEED, ...summary, outcomes });
  return summary.failures;
}

async function fuzzClient(): Promise<number> {
  const server = await new HostileServer().start();
  try {
    if (ONE !== undefined) {
      const c = replyCase(SEED, ONE, limits);
      const { sdk, reference } = await playCase(server, c);
      const why = checkCall(c, sdk, reference);
      print({ fuzz: "client", replay: { seed: SEED, case: ONE, ...describeReply(c, sdk, reference) }, why: why ?? "passes" });
      return why ? 1 : 0;
    }
    const ends: Record<string, number> = {};
    const summary = await chunks("client", async (first, count) => {
      const r = await runClientCases({ seed: SEED, first, count, limits, server });
      for (const [k, v] of Object.entries(r.ends)) ends[k] = (ends[k] ?? 0) + v;
      for (const f of r.failures) print({ fuzz: "client", ...f });
      return r;
    });
    print({ fuzz: "client", seed: SEED, ...summary, ends });
    return summary.failures;
  } finally {
    await server.close();
  }
}

print({ fuzz: "start", seed: SEED, target, cases: ONE === undefined ? CASES : 1, maxBytes: limits.maxBytes });
const run = { daemon: fuzzDaemon, codec: fuzzCodec, client: fuzzClient };
let failed = 0;
for (const t of target === "all" ? TARGETS : [target as (typeof TARGETS)[number]]) failed += await run[t]();
process.exit(failed > 0 ? 1 : 0);
