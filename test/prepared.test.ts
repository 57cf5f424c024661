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
import { AppError } from "../src/domain/errors.js";
import { databaseUrl } from "./support/database-url.js";
import { startTcpProxy } from "./support/tcp-proxy.js";

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

it("fails a statement the server never answers as unavailable, and runs the next on a new connection", async () => {
  const proxy = await startTcpProxy(databaseUrl());
  const stalled = new PreparedQueries(proxy.url, 1, { queryMs: 300 });
  const one = sql.type(z.object({ n: z.number() }))`SELECT 1::int AS n`;
  try {
    expect(await stalled.any(one)).toEqual([{ n: 1 }]);
    // The path goes silent with the pool's one connection open on it: nothing ever closes it.
    proxy.freeze();
    const err = await stalled.any(one).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(AppError);
    expect((err as AppError).kind).toBe("unavailable");
    expect(await stalled.any(one)).toEqual([{ n: 1 }]);
    expect(proxy.opened).toBe(2);
  } finally {
    await stalled.end();
    await proxy.close();
  }
});
