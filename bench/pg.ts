/** Short-lived Postgres connections for the benchmark's own bookkeeping (never on a measured path). */
import { readFileSync } from "node:fs";
import pg from "pg";
import { sampleProc } from "./proc.js";

/** Runs `fn` on a connection of its own, closed afterwards. */
export async function withClient<T>(url: string, fn: (c: pg.Client) => Promise<T>): Promise<T> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return await fn(c);
  } finally {
    await c.end();
  }
}

export function sql<T extends pg.QueryResultRow>(url: string, text: string, values: unknown[] = []): Promise<T[]> {
  return withClient(url, async (c) => (await c.query<T>(text, values)).rows);
}

/**
 * Runs `text` on one connection every 100 ms until `done` holds for its first row. One connection for
 * the whole wait: a fresh one per poll cost the database a visible share of what it measured.
 */
export function pollUntil<T extends pg.QueryResultRow>(url: string, text: string, done: (row: T) => boolean, timeoutMs: number, what: string): Promise<void> {
  return withClient(url, async (c) => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const { rows } = await c.query<T>(text);
      if (done(rows[0]!)) return;
      if (Date.now() > deadline) throw new Error(`${what} did not happen within ${timeoutMs}ms`);
      await new Promise((r) => setTimeout(r, 100));
    }
  });
}

/**
 * Starts measuring the CPU of the daemons' Postgres backends (application_name aiflowd…) in the
 * database of `url`, from /proc; the call gives it in ms, or null where those backends are not
 * processes of this machine. A backend that connected meanwhile counts whole (it was born in the
 * window); one that disconnected meanwhile is lost. Meaningful only in a database that no other
 * daemons use.
 */
export async function backendCpuMeter(url: string): Promise<() => Promise<number | null>> {
  const backends = async () => {
    const rows = await sql<{ pid: number }>(url, `SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'aiflowd%'`);
    // A pid of another machine's Postgres may name some process here: only a local postgres counts.
    return rows
      .map((r) => r.pid)
      .filter((pid) => {
        try {
          return readFileSync(`/proc/${pid}/comm`, "utf8").startsWith("postgres");
        } catch {
          return false;
        }
      });
  };
  const cpuOf = (pid: number): number | null => {
    try {
      return sampleProc(pid).cpuMs;
    } catch {
      return null; // gone since the listing
    }
  };
  const first = new Map<number, number>();
  for (const pid of await backends()) {
    const ms = cpuOf(pid);
    if (ms !== null) first.set(pid, ms);
  }
  return async () => {
    const now = await backends();
    if (first.size === 0 && now.length === 0) return null;
    let ms = 0;
    for (const pid of new Set([...first.keys(), ...now])) {
      const at = cpuOf(pid);
      if (at !== null) ms += at - (first.get(pid) ?? 0);
    }
    return ms;
  };
}
