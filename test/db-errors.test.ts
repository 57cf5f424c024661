/**
 * The one error map, for both pools: errors of slonik's pool and pg's own errors from the prepared
 * statements' pool (src/db/prepared.ts) become the same domain errors by their SQLSTATE, from real
 * statements on a real Postgres.
 */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { sql } from "slonik";
import { interpretDbError, refusedForContent, sqlState } from "../src/db/errors.js";
import { AppError } from "../src/domain/errors.js";
import { createTestDb, type TestDb } from "./support/db.js";

let db: TestDb;
let client: pg.Client;

beforeAll(async () => {
  db = await createTestDb({ label: "dberr", migrate: false });
  client = new pg.Client({ connectionString: db.url });
  await client.connect();
  await client.query(`CREATE SCHEMA IF NOT EXISTS "${db.schema}"`);
  await client.query(`CREATE TABLE "${db.schema}".t (id int PRIMARY KEY, n int NOT NULL CHECK (n > 0))`);
  await client.query(`INSERT INTO "${db.schema}".t VALUES (1, 1)`);
});
afterAll(async () => {
  await client?.end();
  await db?.drop();
});

/** What an INSERT of these values fails with, on pg's own client (the hot pool's driver) and on slonik's pool. */
async function failures(id: number, n: number | null): Promise<unknown[]> {
  const raw = await client.query(`INSERT INTO "${db.schema}".t VALUES ($1, $2)`, [id, n]).then(
    () => new Error("succeeded"),
    (e: unknown) => e,
  );
  const viaSlonik = await db.pool.query(sql.unsafe`INSERT INTO ${sql.identifier([db.schema, "t"])} VALUES (${id}, ${n})`).then(
    () => new Error("succeeded"),
    (e: unknown) => e,
  );
  return [raw, viaSlonik];
}

const kindOf = (err: unknown) => {
  const mapped = interpretDbError(err);
  return mapped instanceof AppError ? mapped.kind : "unmapped";
};

describe("database errors by SQLSTATE", () => {
  it("a unique violation is already_exists and other constraint violations invalid_argument, on both pools", async () => {
    for (const err of await failures(1, 1)) expect(kindOf(err)).toBe("already_exists");
    for (const err of await failures(2, 0)) expect(kindOf(err)).toBe("invalid_argument");
    for (const err of await failures(3, null)) expect(kindOf(err)).toBe("invalid_argument");
  });

  it("a statement the server cancelled for its timeout is unavailable", async () => {
    await client.query("SET statement_timeout = '20ms'");
    const raw = await client.query("SELECT pg_sleep(1)").then(
      () => new Error("succeeded"),
      (e: unknown) => e,
    );
    await client.query("RESET statement_timeout");
    expect(sqlState(raw)).toBe("57014");
    expect(kindOf(raw)).toBe("unavailable");
  });

  it("a server that terminates the connection is unavailable", async () => {
    const victim = new pg.Client({ connectionString: db.url });
    await victim.connect();
    victim.on("error", () => {});
    const pid = (await victim.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]!.pid;
    const pending = victim.query("SELECT pg_sleep(5)").then(
      () => new Error("succeeded"),
      (e: unknown) => e,
    );
    await client.query("SELECT pg_terminate_backend($1)", [pid]);
    const err = await pending;
    expect(kindOf(err)).toBe("unavailable");
    await victim.end().catch(() => {});
  });

  it("data the server refuses is content (the heartbeat flush isolates it); a socket's errno code is no SQLSTATE", async () => {
    const raw = await client.query("SELECT 'x'::int").then(
      () => new Error("succeeded"),
      (e: unknown) => e,
    );
    expect(sqlState(raw)).toBe("22P02");
    expect(refusedForContent(raw)).toBe(true);
    const socket = Object.assign(new Error("write EPIPE"), { code: "EPIPE" });
    expect(sqlState(socket)).toBeUndefined();
    expect(refusedForContent(socket)).toBe(false);
  });
});
