/**
 * The hot path's connections (src/db/prepared.ts) run with the planner settings its statements
 * depend on. A queue's statistics are always behind its contents: the drain benchmark caught every
 * claim seq-scanning the whole table (3,400 scans reading 9.5 M rows in 8 s) after the table had
 * been analysed while empty and then filled with finished items.
 */
import { sql } from "slonik";
import { afterAll, beforeAll, expect, it } from "vitest";
import { z } from "zod";
import { PreparedQueries } from "../src/db/prepared.js";
import { databaseUrl } from "./support/database-url.js";

let hot: PreparedQueries;
beforeAll(() => {
  hot = new PreparedQueries(databaseUrl(), 1);
});
afterAll(async () => {
  await hot?.end();
});

it("runs with JIT, bitmap scans and sequential scans off", async () => {
  const [row] = await hot.any(
    sql.type(z.object({ jit: z.string(), bitmap: z.string(), seq: z.string() }))`
      SELECT current_setting('jit') AS jit, current_setting('enable_bitmapscan') AS bitmap, current_setting('enable_seqscan') AS seq`,
  );
  expect(row).toEqual({ jit: "off", bitmap: "off", seq: "off" });
});
