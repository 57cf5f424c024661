import { afterAll, describe, expect, it } from "vitest";
import pg from "pg";
import { loadMigrations, migrate, MigrationError } from "../src/db/migrate.js";
import { createLogger, silentLogger } from "../src/log.js";
import { scanJson } from "../src/domain/json-text.js";
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
const COMMON = {
  createdby: "text",
  createdon: "timestamp with time zone",
  updatedby: "text",
  updatedon: "timestamp with time zone",
  deletedby: "text",
  deletedon: "timestamp with time zone",
};

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

  it("gives each affinity binding of an older schema the tenants that have a claim to its agent (0016)", async () => {
    const schema = fresh("mb");
    const all = loadMigrations();
    const before = all.findIndex((m) => m.name === "affinity_by_tenant");
    await migrate(url(), { schema, prefix: "aiflow_" }, log, all.slice(0, before));
    const t = (name: string) => `"${schema}".aiflow_${name}`;
    const at = "2026-01-01T00:00:00Z";
    await query(`INSERT INTO ${t("agent")} (id, name, metadata, createdby, createdon) VALUES ('01A', 'acme-only', '{"tenants":["acme"]}', 'x', $1)`, [at]);
    // K: acme's items went to acme-only; globex's item waits (acme-only does not serve globex); idle: no items at all.
    const item = (id: string, tenant: string, key: string, status: string, agent: string | null) =>
      query(
        `INSERT INTO ${t("work_item")} (id, tenant_key, engine_id, engine_kind, status, affinity_key, agent_id, createdby, createdon) VALUES ($1, $2, 'e', 'k', $3, $4, $5, 'x', $6)`,
        [id, tenant, status, key, agent, at],
      );
    await item("01W1", "acme", "K", "dispatched", "acme-only");
    await item("01W2", "acme", "K", "completed", "acme-only");
    await item("01W3", "globex", "K", "pending", null);
    await item("01W4", "initech", "K", "completed", "acme-only");
    const binding = (id: string, key: string) =>
      query(`INSERT INTO ${t("affinity_binding")} (id, affinity_key, agent_id, createdby, createdon) VALUES ($1, $2, 'acme-only', 'x', $3)`, [id, key, at]);
    await binding("01KQGEG5W0JP094JT7PQ71JSK3", "K");
    await binding("01KQGEG5W0JP094JT7PQ71JSK4", "idle");
    await migrate(url(), { schema, prefix: "aiflow_" }, log);
    const rows = await query<{ id: string; tenant_key: string; affinity_key: string; agent_id: string }>(
      `SELECT id, tenant_key, affinity_key, agent_id FROM ${t("affinity_binding")} ORDER BY tenant_key`,
    );
    expect(rows).toEqual([
      { id: "01KQGEG5W0JP094JT7PQ71JSK3", tenant_key: "acme", affinity_key: "K", agent_id: "acme-only" },
      { id: "01KQGEG5W000294JT7PQ71JSK3", tenant_key: "initech", affinity_key: "K", agent_id: "acme-only" },
    ]);
  });

  it("moves the DAG's definitions and events into the engines' tables, in order, and one trigger writes every engine's events (0017)", async () => {
    const schema = fresh("me");
    const all = loadMigrations();
    await migrate(
      url(),
      { schema, prefix: "aiflow_" },
      log,
      all.slice(
        0,
        all.findIndex((m) => m.name === "one_engine_substrate"),
      ),
    );
    const t = (name: string) => `"${schema}".aiflow_${name}`;
    const at = "2026-01-01T00:00:00Z";
    await query(
      `INSERT INTO ${t("dag_definition")} (id, tenant_key, definition_id, body, createdby, createdon) VALUES ('01D', 'acme', 'etl', '{"id":"etl"}', 'u', $1)`,
      [at],
    );
    // An item's end waiting to be applied, then a timeout due later: their order must survive the move.
    await query(
      `INSERT INTO ${t("dag_event")} (run_id, task_id, kind, work_item_id, status, agent, result, error, dispatched_at, ended_at) VALUES ('R1', 'T1', 'item', 'W1', 'completed', 'gpu-1', '{"n":1}', NULL, 10, 20)`,
    );
    await query(`INSERT INTO ${t("dag_event")} (run_id, task_id, kind, due_at) VALUES ('R1', 'T2', 'timeout', 99)`);
    await migrate(url(), { schema, prefix: "aiflow_" }, log);

    const tables = (await query<{ table_name: string }>(`SELECT table_name FROM information_schema.tables WHERE table_schema = $1`, [schema])).map(
      (r) => r.table_name,
    );
    expect(tables).not.toContain("aiflow_dag_definition");
    expect(tables).not.toContain("aiflow_dag_event");
    expect(await query(`SELECT id, tenant_key, engine_kind, definition_id, body FROM ${t("engine_definition")}`)).toEqual([
      { id: "01D", tenant_key: "acme", engine_kind: "dag", definition_id: "etl", body: { id: "etl" } },
    ]);
    const moved = `SELECT engine_kind, run_id, task_id, kind, work_item_id, status, agent, result, dispatched_at::text, ended_at::text, due_at::text FROM ${t("engine_event")}`;
    expect(await query(`${moved} ORDER BY id`)).toEqual([
      {
        engine_kind: "dag",
        run_id: "R1",
        task_id: "T1",
        kind: "item",
        work_item_id: "W1",
        status: "completed",
        agent: "gpu-1",
        result: { n: 1 },
        dispatched_at: "10",
        ended_at: "20",
        due_at: null,
      },
      {
        engine_kind: "dag",
        run_id: "R1",
        task_id: "T2",
        kind: "timeout",
        work_item_id: null,
        status: null,
        agent: null,
        result: null,
        dispatched_at: null,
        ended_at: null,
        due_at: "99",
      },
    ]);

    // The one trigger: a DAG attempt's item, a graph step's item, and a producer's own item (no event).
    await query(`DELETE FROM ${t("engine_event")}`);
    await query(`INSERT INTO ${t("task")} (id, name, definitionid, runid, createdby, createdon) VALUES ('T3', 'a', 'etl', 'R2', 'u', $1)`, [at]);
    await query(
      `INSERT INTO ${t("graph_run")} (id, run_id, definition_id, tenant_key, plan, work_item_id, createdby, createdon) VALUES ('G', 'R3', 'g', 'acme', '{}', 'W3', 'u', $1)`,
      [at],
    );
    const item = (id: string, runId: string, taskId: string) =>
      query(
        `INSERT INTO ${t("work_item")} (id, tenant_key, engine_id, engine_kind, status, run_id, task_id, agent_id, dispatched_at, createdby, createdon) VALUES ($1, 'acme', 'e', 'k', 'dispatched', $2, $3, 'gpu-1', 5, 'x', $4)`,
        [id, runId, taskId, at],
      );
    await item("W2", "R2", "T3");
    await item("W3", "R3", "graph:1");
    await item("W4", "R4", "own-task");
    const c = new pg.Client({ connectionString: url() });
    await c.connect();
    const heard: string[] = [];
    try {
      const { rows } = await c.query<{ channel: string }>(
        `SELECT 'aiflow_' || substr(encode(sha256(convert_to($1 || '.aiflow_', 'UTF8')), 'hex'), 1, 16) || '_engines' AS channel`,
        [schema],
      );
      await c.query(`LISTEN "${rows[0]!.channel}"`);
      c.on("notification", (n) => heard.push(n.payload ?? ""));
      await c.query(`UPDATE ${t("work_item")} SET status = 'completed', completed_at = 7 WHERE id IN ('W2', 'W3', 'W4')`);
      // A notification sent at that commit reaches this connection before the answer to its next query.
      await c.query("SELECT 1");
    } finally {
      await c.end();
    }
    expect(
      await query(
        `SELECT engine_kind, run_id, task_id, kind, work_item_id, status, dispatched_at::text, ended_at::text FROM ${t("engine_event")} ORDER BY engine_kind`,
      ),
    ).toEqual([
      { engine_kind: "dag", run_id: "R2", task_id: "T3", kind: "item", work_item_id: "W2", status: "completed", dispatched_at: "5", ended_at: "7" },
      { engine_kind: "graph", run_id: "R3", task_id: null, kind: "item", work_item_id: "W3", status: "completed", dispatched_at: null, ended_at: null },
    ]);
    expect(heard.sort()).toEqual(["R2", "R3"]);
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
    // A binding belongs to a tenant (migration 0016): the key is unique within its tenant.
    const [bindingKey] = await query<{ def: string }>(
      `SELECT pg_get_constraintdef(c.oid) AS def FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = $1 AND c.conname = 'aiflow_affinity_binding_key_uq'`,
      [schema],
    );
    expect(bindingKey?.def).toBe("UNIQUE (tenant_key, affinity_key)");
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
