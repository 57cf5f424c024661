import { afterAll, describe, expect, it } from "vitest";
import pg from "pg";
import { loadMigrations, migrate, MigrationError } from "../src/db/migrate.js";
import { createLogger, silentLogger } from "../src/log.js";
import { scanJson } from "../src/rpc/input/json-text.js";
import { databaseUrl } from "./support/database-url.js";
import { uniqueSchema } from "./support/db.js";

const url = () => databaseUrl();
const log = silentLogger();
const schemas: string[] = [];
const fresh = (label: string) => {
  const s = uniqueSchema(label);
  schemas.push(s);
  return s;
};

async function query<T extends pg.QueryResultRow>(text: string, values: unknown[] = []): Promise<T[]> {
  const c = new pg.Client({ connectionString: url() });
  await c.connect();
  try {
    return (await c.query<T>(text, values)).rows;
  } finally {
    await c.end();
  }
}

afterAll(async () => {
  for (const s of schemas) await query(`DROP SCHEMA IF EXISTS "${s}" CASCADE`);
});

// Every named index and unique constraint of the entity reference, without the prefix.
const SPEC_INDEXES = [
  "agent_name_key",
  "engine_run_tenant_run_uq",
  "engine_run_tenant_created",
  "trigger_firing_tenant_fired",
  "trigger_firing_tenant_trigger",
  "trigger_firing_run",
  "work_item_status_priority_idx",
  "work_item_lease_idx",
  "work_item_run_idx",
  "work_item_parent_idx",
  "engine_tenant_engine_uq",
  "affinity_binding_key_uq",
];
const SPEC_UNIQUE = ["agent_name_key", "engine_run_tenant_run_uq", "engine_tenant_engine_uq", "affinity_binding_key_uq"];
const SUBSTRATE = ["agent", "work_item", "affinity_binding", "engine", "engine_run", "trigger_firing"];
const COMMON = { createdby: "text", createdon: "timestamp with time zone", updatedby: "text", updatedon: "timestamp with time zone", deletedby: "text", deletedon: "timestamp with time zone" };

describe("migrations", () => {
  it("migrates a fresh schema, then a re-run is a no-op", async () => {
    const schema = fresh("m");
    const first = await migrate(url(), { schema, prefix: "aiflow_" }, log);
    expect(first.applied).toEqual(loadMigrations().map((m) => m.version));
    const second = await migrate(url(), { schema, prefix: "aiflow_" }, log);
    expect(second.applied).toEqual([]);
    const history = await query<{ n: number }>(`SELECT count(*)::int AS n FROM "${schema}".aiflow_schema_migrations`);
    expect(history[0]!.n).toBe(loadMigrations().length);
  });

  it("serialises concurrent migrators: each migration is applied exactly once", async () => {
    const schema = fresh("mc");
    const results = await Promise.all(Array.from({ length: 4 }, () => migrate(url(), { schema, prefix: "aiflow_" }, log)));
    const appliedAll = results.flatMap((r) => r.applied).sort((a, b) => a - b);
    expect(appliedAll).toEqual(loadMigrations().map((m) => m.version));
  });

  it("creates the same tables under two prefixes side by side", async () => {
    const schema = fresh("mp");
    await migrate(url(), { schema, prefix: "aiflow_" }, log);
    await migrate(url(), { schema, prefix: "other_" }, log);
    const rows = await query<{ table_name: string }>(`SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, [schema]);
    const names = rows.map((r) => r.table_name);
    for (const t of SUBSTRATE) {
      expect(names).toContain(`aiflow_${t}`);
      expect(names).toContain(`other_${t}`);
    }
    const idx = await query<{ indexname: string }>(`SELECT indexname FROM pg_indexes WHERE schemaname = $1`, [schema]);
    for (const i of SPEC_INDEXES) {
      expect(idx.map((r) => r.indexname)).toContain(`other_${i}`);
    }
  });

  it("has every index and unique constraint the spec names, and the common columns on every table", async () => {
    const schema = fresh("mi");
    await migrate(url(), { schema, prefix: "aiflow_" }, log);
    const idx = await query<{ indexname: string }>(`SELECT indexname FROM pg_indexes WHERE schemaname = $1`, [schema]);
    for (const i of SPEC_INDEXES) expect(idx.map((r) => r.indexname)).toContain(`aiflow_${i}`);
    const uq = await query<{ conname: string }>(
      `SELECT conname FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = $1 AND c.contype = 'u'`,
      [schema],
    );
    for (const u of SPEC_UNIQUE) expect(uq.map((r) => r.conname)).toContain(`aiflow_${u}`);
    const cols = await query<{ table_name: string; column_name: string; data_type: string; is_nullable: string }>(
      `SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns WHERE table_schema = $1`,
      [schema],
    );
    const col = (t: string, c: string) => cols.find((r) => r.table_name === `aiflow_${t}` && r.column_name === c);
    for (const t of SUBSTRATE) {
      for (const [c, type] of Object.entries(COMMON)) expect(col(t, c)?.data_type, `${t}.${c}`).toBe(type);
      expect(col(t, "createdby")?.is_nullable).toBe("NO");
      expect(col(t, "createdon")?.is_nullable).toBe("NO");
      expect(col(t, "id")?.is_nullable).toBe("NO");
    }
    // Engine-written hot-path times are bigint epoch nanoseconds, not timestamps.
    for (const c of ["lease_expires_at", "dispatched_at", "completed_at", "next_attempt_at"]) expect(col("work_item", c)?.data_type).toBe("bigint");
    expect(col("engine_run", "ended_on")?.data_type).toBe("bigint");
    expect(col("trigger_firing", "fired_on")?.data_type).toBe("bigint");
    expect(col("agent", "metrics")?.data_type).toBe("jsonb");
    expect(col("work_item", "tenant_key")?.is_nullable).toBe("NO");
    expect(col("work_item", "run_id")?.is_nullable).toBe("YES");
  });

  it("refuses a database with a newer migration than the code knows, naming both versions", async () => {
    const schema = fresh("mn");
    await migrate(url(), { schema, prefix: "aiflow_" }, log);
    const known = loadMigrations().length;
    await query(`INSERT INTO "${schema}".aiflow_schema_migrations (version, name, checksum) VALUES ($1, 'from_the_future', 'x')`, [known + 1]);
    const err = await migrate(url(), { schema, prefix: "aiflow_" }, log).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(MigrationError);
    expect((err as Error).message).toContain(`at migration ${known + 1}`);
    expect((err as Error).message).toContain(`(${known})`);
  });
});

describe("the migration log", () => {
  it("names each applied migration in lines that hold every key once (log parsers keep one of two)", async () => {
    const lines: string[] = [];
    const captured = createLogger({ level: "info", destination: { write: (s: string) => void lines.push(s) } });
    await migrate(url(), { schema: fresh("mlog"), prefix: "aiflow_" }, captured);
    const applied = lines.map((l) => JSON.parse(l) as { msg: string; migration?: string }).filter((l) => l.msg === "migration applied");
    expect(applied.length).toBeGreaterThan(0);
    expect(applied.every((l) => typeof l.migration === "string")).toBe(true);
    // The edge's JSON check refuses duplicate keys.
    for (const l of lines) expect(() => scanJson(l, "log line")).not.toThrow();
  });
});
