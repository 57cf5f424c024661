/** What the benchmark stands on: a database (given or embedded), daemon processes, and helpers. */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, chmodSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { startEmbeddedPostgres } from "../src/db/embedded.js";
import { migrate } from "../src/db/migrate.js";
import { silentLogger } from "../src/log.js";
import { sql } from "./pg.js";
import { startChild, type Child } from "./proc.js";

export const TOKENS = { agent: "bench-agent-token", engine: "bench-engine-token", ops: "bench-ops-token", runs: "bench-runs-token" };
export const TENANT = "bench";
/**
 * V8 settings the daemon and the agent processes run with, as deployments are told to (Dockerfile,
 * docs/operations.md): a 32 MB young generation. With hundreds of small objects per call in flight across an
 * await, the default 16 MB scavenged often enough to promote live ones; this took 7–10 % off the
 * drain's CPU per item.
 */
export const NODE_TUNING = ["--max-semi-space-size=32"];
/**
 * The daemon also starts with a 256 MB old generation, as deployments are told to (the Dockerfile's
 * entry point; Node refuses the flag in NODE_OPTIONS). V8 then skips full collections until the old
 * generation reaches it. At a steady 1,000 items/s the daemon promotes 3–4 MB/s over a ~21 MB live
 * heap, so by default a full collection came every ~3 s (a 10–15 ms final pause plus incremental
 * steps), and the slow items of a run clustered on those pauses; now one comes about once a minute.
 */
export const DAEMON_NODE_TUNING = [...NODE_TUNING, "--initial-old-space-size=256"];
export const KIND = "bench";

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export interface Database {
  url: string;
  schema: string;
  close(): Promise<void>;
}

/** DATABASE_URL when set, otherwise an embedded Postgres in a temp dir; a fresh schema either way. */
export async function openDatabase(log: (msg: string) => void): Promise<Database> {
  const schema = `bench_${randomBytes(4).toString("hex")}`;
  if (process.env.DATABASE_URL) return { url: process.env.DATABASE_URL, schema, close: () => dropSchema(process.env.DATABASE_URL!, schema) };
  const dir = mkdtempSync(join(tmpdir(), "aiflowd-bench-"));
  chmodSync(dir, 0o755);
  log(`no DATABASE_URL: starting an embedded Postgres in ${dir}`);
  const pgServer = await startEmbeddedPostgres({ dataDir: join(dir, "pg"), port: await freePort(), log: pino({ level: "warn" }) });
  return {
    url: pgServer.url,
    schema,
    close: async () => {
      await pgServer.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * A database of its own on the same server, for a figure Postgres only counts database-wide (the
 * heartbeat section's commits): anything else running on the shared database would count too.
 * Undefined where the role may not create databases; the caller then uses the shared one.
 */
export async function openOwnDatabase(db: Database): Promise<Database | undefined> {
  const name = `aiflow_bench_${randomBytes(4).toString("hex")}`;
  try {
    await sql(db.url, `CREATE DATABASE ${name}`);
  } catch {
    return undefined;
  }
  const url = new URL(db.url);
  url.pathname = `/${name}`;
  return { url: url.toString(), schema: db.schema, close: () => dropDatabase(db.url, name) };
}

/** The table prefix the daemons run with (their default), so `"${schema}".aiflow_work_item` is theirs. */
export const PREFIX = "aiflow_";

/**
 * A schema of its own on the run's database, migrated here, for a section that runs the store in
 * this process rather than through a daemon (claim_cost): the daemons of the other sections work on
 * the run's schema, and their sweeps never read this one. Dropped by close().
 */
export async function openOwnSchema(db: Database, label: string): Promise<Database> {
  const schema = `${db.schema}_${label}`;
  await migrate(db.url, { schema, prefix: PREFIX }, silentLogger());
  return { url: db.url, schema, close: () => dropSchema(db.url, schema) };
}

async function dropDatabase(url: string, name: string): Promise<void> {
  await sql(url, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
}

async function dropSchema(url: string, schema: string): Promise<void> {
  await sql(url, `DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
}

/** Transactions committed in the database so far (every autocommit statement is one). */
export async function committedTransactions(url: string): Promise<number> {
  const [row] = await sql<{ n: string }>(url, `SELECT xact_commit + xact_rollback AS n FROM pg_stat_database WHERE datname = current_database()`);
  return Number(row!.n);
}

export interface DaemonProc {
  /** host:port */
  address: string;
  /** https://host:port over TLS, http://host:port for h2c. */
  url: string;
  /** Over TLS: the CA its certificate chains to. */
  tls?: BenchTls;
  child: Child;
}

/**
 * Development certificates made by scripts/dev-certs.sh in a temp dir: a CA, the daemon's certificate
 * for 127.0.0.1, and client certificates (`client("agent" | "engine" | "ops" | "runs")`) for mutual TLS.
 */
export interface BenchTls {
  cert: string;
  key: string;
  /** The CA's file, and its PEM. */
  ca: string;
  caPem: Buffer;
  client(role: "agent" | "engine" | "ops" | "runs"): { cert: string; key: string };
  remove(): void;
}

export function makeBenchTls(): BenchTls {
  const dir = mkdtempSync(join(tmpdir(), "aiflowd-tls-"));
  execFileSync("sh", ["scripts/dev-certs.sh", dir], { stdio: ["ignore", "ignore", "pipe"] });
  const ca = join(dir, "ca.crt");
  return {
    cert: join(dir, "server.crt"),
    key: join(dir, "server.key"),
    ca,
    caPem: readFileSync(ca),
    client: (role) => ({ cert: join(dir, `${role}.crt`), key: join(dir, `${role}.key`) }),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  };
}

/** The environment a child client needs to trust a daemon (bench/child-agent.ts, child-producer.ts). */
export const clientTlsEnv = (d: DaemonProc): Record<string, string> => (d.tls ? { BENCH_TLS_CA: d.tls.ca } : {});

export async function startDaemonProc(
  db: Database,
  index: number,
  extraEnv: Record<string, string> = {},
  tls?: BenchTls,
  nodeArgs: readonly string[] = DAEMON_NODE_TUNING,
): Promise<DaemonProc> {
  const port = await freePort();
  const child = startChild("bin/aiflowd.js", ["serve"], {
    nodeArgs: [...nodeArgs],
    env: {
      DATABASE_URL: db.url,
      AIFLOW_SCHEMA: db.schema,
      AIFLOW_LISTEN: `127.0.0.1:${port}`,
      AIFLOW_INSTANCE_ID: `bench-daemon-${index}`,
      AIFLOW_TENANTS: TENANT,
      AIFLOW_TOKENS: `agent:${TOKENS.agent};engine:${TOKENS.engine};ops:${TOKENS.ops};runs:${TOKENS.runs}`,
      AIFLOW_LOG_LEVEL: "info",
      NO_COLOR: "1",
      // Several daemons per host: none takes the default metrics port (the observability section gives each one).
      AIFLOW_HTTP_LISTEN: "off",
      ...(tls ? { AIFLOW_TLS_CERT: tls.cert, AIFLOW_TLS_KEY: tls.key } : {}),
      ...extraEnv,
    },
    ready: (line) => line.includes("aiflowd serving gRPC"),
  });
  await child.ready;
  const address = `127.0.0.1:${port}`;
  return { address, url: `${tls ? "https" : "http"}://${address}`, tls, child };
}
