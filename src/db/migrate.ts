/**
 * Forward-only, numbered SQL migrations (src/db/migrations/NNNN_name.sql). Each applies in its own
 * transaction; an advisory lock keyed on the schema and prefix serialises migrators, so several
 * daemons starting at once apply each migration exactly once. The DDL text names no prefix: the
 * migrator expands {{table:X}}, {{name:X}} and {{channel:X}} with the configured schema and prefix.
 *
 * This uses a plain pg client rather than the slonik pool: migration files are multi-statement DDL
 * scripts, which need the simple query protocol.
 */
import { createHash } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { sql, type CommonQueryMethods } from "slonik";
import { z } from "zod";
import { withDbErrors } from "./errors.js";
import type { Logger } from "../log.js";
import { quoteIdent, RETIRED_TABLES, TABLES, Tables, type Naming, type TableName } from "./tables.js";

export interface Migration {
  version: number;
  name: string;
  sql: string;
  checksum: string;
}

const MIGRATIONS_DIR = fileURLToPath(new URL("./migrations/", import.meta.url));

export function loadMigrations(dir = MIGRATIONS_DIR): Migration[] {
  return readdirSync(dir)
    .filter((f) => /^\d{4}_[a-z0-9_]+\.sql$/.test(f))
    .sort()
    .map((file, i) => {
      const version = Number(file.slice(0, 4));
      if (version !== i + 1) throw new Error(`migration ${file} is out of sequence: expected version ${i + 1}`);
      const sql = readFileSync(dir + file, "utf8");
      return { version, name: file.slice(5, -4), sql, checksum: createHash("sha256").update(sql).digest("hex") };
    });
}

/** Expands the naming placeholders of a migration's text. */
export function expand(sqlText: string, naming: Naming): string {
  const t = new Tables(naming.schema, naming.prefix);
  return (
    sqlText
      .replace(/\{\{schema\}\}/g, quoteIdent(naming.schema))
      // A NOTIFY channel as a string literal (Tables.channel: the scope is a hex hash, the topic [a-z_]).
      .replace(/\{\{channel:([a-z_]+)\}\}/g, (_, topic: string) => `'${t.channel(topic)}'`)
      .replace(/\{\{(table|name):([a-z0-9_]+)\}\}/g, (_, kind: string, what: string) => {
        if (kind === "name") return t.objectName(what);
        if (!([...TABLES, ...RETIRED_TABLES] as readonly string[]).includes(what)) throw new Error(`migration names unknown table '${what}'`);
        return t.qualified(what as TableName);
      })
  );
}

export class MigrationError extends Error {
  override name = "MigrationError";
}

export interface MigrateResult {
  applied: number[];
  current: number;
}

export async function migrate(url: string, naming: Naming, log: Logger, migrations = loadMigrations()): Promise<MigrateResult> {
  const client = new pg.Client({ connectionString: url, application_name: "aiflowd-migrate" });
  await client.connect();
  const t = new Tables(naming.schema, naming.prefix);
  const history = t.qualified("schema_migrations");
  // Two int4 halves: a namespace for aiflowd and a hash of schema+prefix, so two prefixes migrate independently.
  const lockArgs = [0x41_46_4c_57, hash32(`${naming.schema}.${naming.prefix}`)];
  try {
    await client.query("SELECT pg_advisory_lock($1, $2)", lockArgs);
    await client.query(`CREATE SCHEMA IF NOT EXISTS ${quoteIdent(naming.schema)}`);
    await client.query(
      `CREATE TABLE IF NOT EXISTS ${history} (version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL, applied_on timestamptz NOT NULL DEFAULT now())`,
    );
    const { rows } = await client.query<{ version: number; name: string; checksum: string }>(`SELECT version, name, checksum FROM ${history} ORDER BY version`);
    const known = new Map(migrations.map((m) => [m.version, m]));
    const newest = migrations.at(-1)?.version ?? 0;
    for (const row of rows) {
      const m = known.get(row.version);
      if (!m)
        throw new MigrationError(
          `database schema ${naming.schema} (prefix ${naming.prefix}) is at migration ${rows.at(-1)!.version}, newer than this aiflowd knows (${newest}); upgrade aiflowd`,
        );
      if (m.checksum !== row.checksum)
        throw new MigrationError(`migration ${row.version}_${row.name} was changed after it was applied; migrations are forward-only, add a new one`);
    }
    const done = new Set(rows.map((r) => r.version));
    const applied: number[] = [];
    for (const m of migrations) {
      if (done.has(m.version)) continue;
      await client.query("BEGIN");
      try {
        await client.query(expand(m.sql, naming));
        await client.query(`INSERT INTO ${history} (version, name, checksum) VALUES ($1, $2, $3)`, [m.version, m.name, m.checksum]);
        await client.query("COMMIT");
      } catch (err) {
        await client.query("ROLLBACK");
        throw new MigrationError(`migration ${m.version}_${m.name} failed: ${(err as Error).message}`, { cause: err });
      }
      applied.push(m.version);
      log.info({ version: m.version, migration: m.name, schema: naming.schema, prefix: naming.prefix }, "migration applied");
    }
    return { applied, current: newest };
  } finally {
    await client.query("SELECT pg_advisory_unlock($1, $2)", lockArgs).catch(() => {});
    await client.end();
  }
}

/**
 * The newest migration applied to the schema, as /readyz asks it (a daemon whose schema is not
 * the one it was built for, older or newer, is not ready); null before any was applied.
 */
export async function appliedVersion(db: CommonQueryMethods, tables: Tables): Promise<number | null> {
  return withDbErrors(() => db.oneFirst(sql.type(z.object({ v: z.number().nullable() }))`SELECT max(version) AS v FROM ${tables.id("schema_migrations")}`));
}

/** The newest migration this aiflowd carries. */
export const latestVersion = (migrations = loadMigrations()): number => migrations.at(-1)?.version ?? 0;

function hash32(s: string): number {
  return createHash("sha256").update(s).digest().readInt32BE(0);
}
