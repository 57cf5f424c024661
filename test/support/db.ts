/**
 * Per-test-file database isolation: each file migrates its own schema in the shared test database,
 * and drops it when done, so files run in parallel without seeing each other's rows.
 */
import { randomBytes } from "node:crypto";
import pg from "pg";
import type { DatabasePool } from "slonik";
import { migrate } from "../../src/db/migrate.js";
import { openPool } from "../../src/db/pool.js";
import { Tables } from "../../src/db/tables.js";
import { silentLogger } from "../../src/log.js";
import { databaseUrl } from "./database-url.js";

export interface TestDb {
  url: string;
  schema: string;
  prefix: string;
  tables: Tables;
  pool: DatabasePool;
  /** Runs raw SQL on a short-lived connection (for assertions on the catalog and rows). */
  raw<T extends pg.QueryResultRow = Record<string, unknown>>(text: string, values?: unknown[]): Promise<T[]>;
  drop(): Promise<void>;
}

export const uniqueSchema = (label = "t") => `${label}_${randomBytes(5).toString("hex")}`;

export async function createTestDb(opts: { prefix?: string; migrate?: boolean; label?: string } = {}): Promise<TestDb> {
  const url = databaseUrl();
  const schema = uniqueSchema(opts.label);
  const prefix = opts.prefix ?? "aiflow_";
  if (opts.migrate !== false) await migrate(url, { schema, prefix }, silentLogger());
  const pool = await openPool({ url, maxConnections: 12 });
  const raw = async <T extends pg.QueryResultRow>(text: string, values: unknown[] = []) => {
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    try {
      return (await c.query<T>(text, values)).rows;
    } finally {
      await c.end();
    }
  };
  return {
    url,
    schema,
    prefix,
    tables: new Tables(schema, prefix),
    pool,
    raw,
    drop: async () => {
      await pool.end();
      await raw(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    },
  };
}
