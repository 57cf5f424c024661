/**
 * Fixture for the affinity tests: items that name an affinity key, raw readers of the binding table,
 * a lock held on a binding row from a connection of the test's own (to line up racing claims
 * deterministically), and a wait for a number of statements blocked on locks.
 */
import pg from "pg";
import type { TestDb } from "./db.js";
import type { ItemInit } from "./ops.js";

export interface BindingDbRow {
  id: string;
  affinity_key: string;
  agent_id: string;
  createdby: string;
  createdon: Date;
  updatedby: string | null;
  updatedon: Date | null;
}

/** Binding rows, ordered by createdon (the spec's order), read on a connection of their own. */
export async function bindingRows(db: TestDb, where = "true", values: unknown[] = []): Promise<BindingDbRow[]> {
  return db.raw<BindingDbRow & Record<string, unknown>>(
    `SELECT id, affinity_key, agent_id, createdby, createdon, updatedby, updatedon FROM ${db.tables.qualified("affinity_binding")}
      WHERE ${where} ORDER BY createdon, id`,
    values,
  );
}

/** The binding of one key, or undefined; fails when a key somehow has two rows. */
export async function bindingOf(db: TestDb, key: string): Promise<BindingDbRow | undefined> {
  const rows = await bindingRows(db, "affinity_key = $1", [key]);
  if (rows.length > 1) throw new Error(`key ${key} has ${rows.length} binding rows`);
  return rows[0];
}

export interface ItemExtra {
  selector?: Record<string, string>;
  priority?: number;
}

/** An item of engine kind `kind` naming `key` (retries left, so an agent leaving puts it back). */
export const keyed = (kind: string, key: string, extra: ItemExtra = {}): ItemInit => ({
  engineKind: kind,
  maxRetries: 5,
  priority: extra.priority ?? 0,
  workerParams: { selector: extra.selector ?? {}, affinityKey: key },
});

/** An item without a key. */
export const plain = (kind: string, extra: ItemExtra = {}): ItemInit => ({
  engineKind: kind,
  maxRetries: 5,
  priority: extra.priority ?? 0,
  workerParams: extra.selector ? { selector: extra.selector } : undefined,
});

/** A transaction holding a binding row's lock (SELECT … FOR UPDATE) until released. */
export interface HeldLock {
  release(): Promise<void>;
}

export async function lockBinding(db: TestDb, key: string): Promise<HeldLock> {
  const c = new pg.Client({ connectionString: db.url });
  await c.connect();
  try {
    await c.query("BEGIN");
    const res = await c.query(`SELECT id FROM ${db.tables.qualified("affinity_binding")} WHERE affinity_key = $1 FOR UPDATE`, [key]);
    if (res.rowCount !== 1) throw new Error(`no binding row for ${key} to lock`);
  } catch (err) {
    await c.end();
    throw err;
  }
  let released = false;
  return {
    release: async () => {
      if (released) return;
      released = true;
      try {
        await c.query("ROLLBACK");
      } finally {
        await c.end();
      }
    },
  };
}

/**
 * Resolves once at least `n` statements on this schema that start with `startsWith` wait for a lock:
 * how a test knows that racing claims have taken their snapshots and queue on a row, without sleeping.
 */
export async function untilLockWaiters(db: TestDb, startsWith: string, n: number, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const [row] = await db.raw<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE ltrim(query, E' \\n\\t') LIKE $1 AND query LIKE $2 AND wait_event_type = 'Lock'`,
      [`${startsWith}%`, `%${db.schema}%`],
    );
    if (row!.n >= n) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs}ms waiting for ${n} statement(s) '${startsWith}…' to wait for a lock (${row!.n} do)`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Reads the queue and binding tables on one connection kept open (for tests that read in a loop). */
export class Reader {
  readonly #c: pg.Client;

  private constructor(
    private readonly db: TestDb,
    c: pg.Client,
  ) {
    this.#c = c;
  }

  static async open(db: TestDb): Promise<Reader> {
    const c = new pg.Client({ connectionString: db.url });
    await c.connect();
    return new Reader(db, c);
  }

  async bindings(key: string): Promise<BindingDbRow[]> {
    const res = await this.#c.query<BindingDbRow>(
      `SELECT id, affinity_key, agent_id, createdby, createdon, updatedby, updatedon FROM ${this.db.tables.qualified("affinity_binding")}
        WHERE affinity_key = $1 ORDER BY createdon, id`,
      [key],
    );
    return res.rows;
  }

  /** id, status and agent of the items matching `where`. */
  async items(where: string, values: unknown[]): Promise<{ id: string; status: string; agent_id: string | null; affinity_key: string | null }[]> {
    const res = await this.#c.query<{ id: string; status: string; agent_id: string | null; affinity_key: string | null }>(
      `SELECT id, status, agent_id, affinity_key FROM ${this.db.tables.qualified("work_item")} WHERE ${where} ORDER BY priority, createdon, id`,
      values,
    );
    return res.rows;
  }

  async close(): Promise<void> {
    await this.#c.end();
  }
}
