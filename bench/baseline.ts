/**
 * The baseline: a minimal raw-SQL Postgres queue on the same database, run in the same benchmark so
 * that "ours ÷ baseline" is the headline (absolute figures drift on a shared machine). One table;
 * a batch claim of 32 with FOR UPDATE SKIP LOCKED (LIMIT written as a literal: a $n LIMIT flips a
 * prepared plan to a full scan after five runs); completion by UPDATE; 32 worker loops on their own
 * connections; NOTIFY wake-ups plus a fallback poll.
 */
import pg from "pg";
import { nowMs } from "./clock.js";
import { pollUntil, sql, withClient } from "./pg.js";

const TABLE = "public.aiflow_bench_baseline";
const CHANNEL = "aiflow_bench_baseline";
const BATCH = 32;
const FALLBACK_POLL_MS = 50;

const CLAIM = `WITH picked AS (
  SELECT id FROM ${TABLE} WHERE status = 'pending' ORDER BY id LIMIT ${BATCH} FOR UPDATE SKIP LOCKED
) UPDATE ${TABLE} t SET status = 'running', claimed_ns = (extract(epoch from clock_timestamp()) * 1e9)::bigint
  FROM picked WHERE t.id = picked.id RETURNING t.id, t.payload`;
const COMPLETE = `UPDATE ${TABLE} SET status = 'done', completed_ns = (extract(epoch from clock_timestamp()) * 1e9)::bigint WHERE id = ANY($1::bigint[])`;

export function resetBaseline(url: string): Promise<void> {
  return withClient(url, async (c) => {
    await c.query(`DROP TABLE IF EXISTS ${TABLE}`);
    await c.query(
      `CREATE TABLE ${TABLE} (id bigserial PRIMARY KEY, status text NOT NULL DEFAULT 'pending', payload jsonb, claimed_ns bigint, completed_ns bigint)`,
    );
    await c.query(`CREATE INDEX ON ${TABLE} (id) WHERE status = 'pending'`);
  });
}

export async function dropBaseline(url: string): Promise<void> {
  await sql(url, `DROP TABLE IF EXISTS ${TABLE}`);
}

/** 32 worker loops; `onItem` is the (no-op) handler, called as each item starts. */
export async function startBaselineWorkers(url: string, workers: number, onItem: (payload: { sentAt?: number } | null) => void) {
  let stopped = false;
  const wakers = new Set<() => void>();
  const listener = new pg.Client({ connectionString: url });
  await listener.connect();
  await listener.query(`LISTEN ${CHANNEL}`);
  // One notification wakes one idle loop (waking all 32 for every insert is a thundering herd);
  // a loop that finds a full batch keeps claiming without waiting.
  listener.on("notification", () => {
    const first = wakers.values().next();
    if (!first.done) first.value();
  });
  const clients = await Promise.all(
    Array.from({ length: workers }, async () => {
      const c = new pg.Client({ connectionString: url });
      await c.connect();
      return c;
    }),
  );
  const loops = clients.map(async (c) => {
    while (!stopped) {
      const { rows } = await c.query<{ id: string; payload: { sentAt?: number } | null }>(CLAIM);
      if (rows.length === 0) {
        await new Promise<void>((resolve) => {
          const wake = () => {
            wakers.delete(wake);
            clearTimeout(timer);
            resolve();
          };
          const timer = setTimeout(wake, FALLBACK_POLL_MS);
          wakers.add(wake);
        });
        continue;
      }
      for (const r of rows) onItem(r.payload);
      await c.query(COMPLETE, [rows.map((r) => r.id)]);
    }
  });
  return {
    async stop() {
      stopped = true;
      for (const w of wakers) w();
      await Promise.all(loops);
      await Promise.all(clients.map((c) => c.end()));
      await listener.end();
    },
  };
}

/** Inserts n items in batches (the drain test's backlog), held until releaseBaseline. */
export function fillBaseline(url: string, n: number): Promise<void> {
  return withClient(url, async (c) => {
    for (let i = 0; i < n; i += 5000) {
      const k = Math.min(5000, n - i);
      await c.query(`INSERT INTO ${TABLE} (status, payload) SELECT 'held', '{}'::jsonb FROM generate_series(1, $1)`, [k]);
    }
    await c.query(`ANALYZE ${TABLE}`);
  });
}

/** Makes the held backlog claimable at once and wakes the workers. */
export function releaseBaseline(url: string): Promise<void> {
  return withClient(url, async (c) => {
    await c.query(`UPDATE ${TABLE} SET status = 'pending' WHERE status = 'held'`);
    await c.query(`SELECT pg_notify('${CHANNEL}', '')`);
  });
}

/** First claim to last completion, from the table's own timestamps. */
export async function baselineDrainSpan(url: string): Promise<{ count: number; spanNs: bigint }> {
  const [row] = await sql<{ n: string; span: string | null }>(
    url,
    `SELECT count(*) AS n, max(completed_ns) - min(claimed_ns) AS span FROM ${TABLE} WHERE status = 'done'`,
  );
  return { count: Number(row!.n), spanNs: BigInt(row!.span ?? 0) };
}

export function waitBaselineDone(url: string, n: number): Promise<void> {
  return pollUntil<{ n: string }>(
    url,
    `SELECT count(*) AS n FROM ${TABLE} WHERE status = 'done'`,
    (r) => Number(r.n) >= n,
    Number.POSITIVE_INFINITY,
    "the baseline drain",
  );
}

/**
 * Issues `send()` at a fixed rate without waiting for earlier calls (open loop: a slow system does
 * not slow the producer down). Returns how many were sent; waits for all of them to settle.
 */
export async function openLoop(rate: number, durationMs: number, send: () => Promise<unknown>): Promise<number> {
  const start = nowMs();
  const pending = new Set<Promise<unknown>>();
  let sent = 0;
  const total = Math.floor((rate * durationMs) / 1000);
  while (sent < total) {
    const due = Math.min(total, Math.floor(((nowMs() - start) * rate) / 1000) + 1);
    while (sent < due) {
      const p = send().catch(() => undefined);
      pending.add(p);
      void p.finally(() => pending.delete(p));
      sent++;
    }
    const nextAt = start + (sent * 1000) / rate;
    await new Promise((r) => setTimeout(r, Math.max(0, nextAt - nowMs())));
  }
  await Promise.all(pending);
  return sent;
}
