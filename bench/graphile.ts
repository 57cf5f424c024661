/**
 * The second baseline: graphile-worker 0.17.3 (a Node job queue on Postgres; 0.17 is the last
 * release whose engines allow Node 20), through its public API only, on the same database in the
 * same run, in a schema of its own (graphileSchema) that each section creates afresh and drops.
 *
 * What must stay true for its figures to compare with ours:
 * - concurrency is agents × slots of the run's options: as many handlers in flight as our drain's
 *   agents have slots in all;
 * - its documented high-throughput settings (worker.graphile.org/docs/performance, "batching"): a
 *   local queue of 500 jobs fetched and locked in one statement, and completions and failures
 *   batched with a 0 ms delay (everything finished in one tick goes in one statement); the rest
 *   are its defaults: pollInterval 2 s (new jobs wake it by LISTEN/NOTIFY: its poll is for jobs
 *   that come due later), prepared statements on, and a pool of 10 connections. Its advice for the
 *   pool, concurrency + 2, would be 130 connections, more than a default Postgres allows (100);
 *   with the local queue and batched completions a job holds no connection of its own (one fetch
 *   locks 500, one statement completes a tick's worth), and pools of 16, 24 and 40 drained no
 *   faster than 10 on the 2-core machine, within its run-to-run noise;
 * - the backlog goes in by addJobs in batches of 1,000, four in flight, as our drain's Enqueue
 *   batches do (enqueueRate); the steady producer adds one job per call (addJob), as ours enqueues
 *   one item per call;
 * - its handler is the same no-op as ours: it records when it started, and returns.
 */
import { Logger, makeWorkerUtils, run, type Runner } from "graphile-worker";
import type pg from "pg";
import { nowMs } from "./clock.js";
import { sql } from "./pg.js";

export const GRAPHILE_VERSION = "0.17.3";
export const GRAPHILE_TASK = "bench";
export const GRAPHILE_LOCAL_QUEUE_SIZE = 500;
export const GRAPHILE_BATCH_DELAY_MS = 0;
const FILL_BATCH = 1000;
const FILL_IN_FLIGHT = 4;

/** This run's schema: the benchmark's pid, so two runs on one database do not share one. */
export const graphileSchema = (pid = process.pid): string => `graphile_bench_${pid}`;

/**
 * Its log lines, warnings and errors only, to stderr (stdout carries the children's JSON lines);
 * less its advice that the pool be as large as the concurrency, which the header answers.
 */
export const quietLogger = new Logger(() => (level, message) => {
  const l: string = level;
  if (l !== "error" && l !== "warning") return;
  if (message.includes("smaller than concurrency")) return;
  process.stderr.write(`graphile-worker: ${message}\n`);
});

/** The preset every graphile-worker pool of the benchmark runs with (see the header). */
export function graphilePreset(url: string, schema: string, concurrency: number): GraphileConfig.Preset {
  return {
    worker: {
      connectionString: url,
      schema,
      concurrentJobs: concurrency,
      localQueue: { size: GRAPHILE_LOCAL_QUEUE_SIZE },
      completeJobBatchDelay: GRAPHILE_BATCH_DELAY_MS,
      failJobBatchDelay: GRAPHILE_BATCH_DELAY_MS,
      logger: quietLogger,
    },
  };
}

/** Drops the schema and installs graphile-worker's afresh (its own migrations). */
export async function resetGraphile(url: string, schema: string): Promise<void> {
  await dropGraphile(url, schema);
  const utils = await makeWorkerUtils({ connectionString: url, schema, logger: quietLogger });
  try {
    await utils.migrate();
  } finally {
    await utils.release();
  }
}

export async function dropGraphile(url: string, schema: string): Promise<void> {
  await sql(url, `DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
}

/** Adds n jobs with `{}` payloads by addJobs, FILL_BATCH a call, FILL_IN_FLIGHT calls at a time. Returns the ms it took. */
export async function fillGraphile(url: string, schema: string, n: number): Promise<number> {
  const utils = await makeWorkerUtils({ connectionString: url, schema, maxPoolSize: FILL_IN_FLIGHT, logger: quietLogger });
  try {
    const start = nowMs();
    let next = 0;
    await Promise.all(
      Array.from({ length: FILL_IN_FLIGHT }, async () => {
        while (next < n) {
          const k = Math.min(FILL_BATCH, n - next);
          next += k;
          await utils.addJobs(Array.from({ length: k }, () => ({ identifier: GRAPHILE_TASK, payload: {} })));
        }
      }),
    );
    return nowMs() - start;
  } finally {
    await utils.release();
  }
}

/**
 * Whether every job is done: graphile-worker deletes a job as it completes, so none left is all
 * completed and committed. A read of its jobs table by the primary key, nothing written.
 */
export async function graphileEmpty(c: pg.Client, schema: string): Promise<boolean> {
  const { rows } = await c.query<{ empty: boolean }>(`SELECT NOT EXISTS (SELECT 1 FROM "${schema}"._private_jobs ORDER BY id LIMIT 1) AS empty`);
  return rows[0]!.empty;
}

/** Starts a pool of `concurrency` with the no-op task; `onItem` is called as each job starts. */
export async function startGraphileWorkers(url: string, schema: string, concurrency: number, onItem: (payload: unknown) => void): Promise<Runner> {
  return run({
    preset: graphilePreset(url, schema, concurrency),
    // The benchmark child handles SIGTERM itself (stops the runner, then reports).
    noHandleSignals: true,
    // No crontab, and no file lookups for one.
    crontab: "",
    taskList: {
      [GRAPHILE_TASK]: async (payload) => {
        onItem(payload);
      },
    },
  });
}
