/** Short-lived Postgres connections for the benchmark's own bookkeeping (never on a measured path). */
import pg from "pg";

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
