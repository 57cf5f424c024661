/**
 * The query pool through an outage (src/db/admission.ts says why it keeps its own limit): with more
 * callers than connections while the database is away, every caller is answered — none waits for
 * a connection that no failed attempt will ever hand it — and once the database is back the pool
 * serves again at its full size, however many connections died under a query meanwhile. And a
 * path to the server that goes silent (a dropped flow: the proxy stops carrying bytes without
 * closing) fails the operations on it once they go unanswered past the pool's silence limit,
 * instead of hanging them; the pool serves on new connections.
 */
import { sql, type DatabasePool } from "slonik";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { interpretDbError } from "../src/db/errors.js";
import { openPool } from "../src/db/pool.js";
import { AppError } from "../src/domain/errors.js";
import { databaseUrl } from "./support/database-url.js";
import { until } from "./support/kit.js";
import { startTcpProxy, type TcpProxy } from "./support/tcp-proxy.js";

const SIZE = 2;
/** The silence limit here (the daemon's is 65 s, past the server's statement timeout). */
const SILENT_MS = 2_000;
const APP = `aiflowd-test-pool-outage-${process.pid}`;
let proxy: TcpProxy;
let pool: DatabasePool;
/** Straight to the database, to see what the pool under test has open. */
let watcher: DatabasePool;

beforeAll(async () => {
  proxy = await startTcpProxy(databaseUrl());
  pool = await openPool({ url: proxy.url, maxConnections: SIZE, applicationName: APP });
  watcher = await openPool({ url: databaseUrl(), maxConnections: 1 });
});
afterAll(async () => {
  await pool?.end();
  // The sleeps whose connections the proxy cut run on in the server until they end or are ended.
  await watcher?.query(sql.unsafe`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = ${APP}`);
  await watcher?.end();
  await proxy?.close();
});

/** Statements the pool under test is running now whose text has `marker` (a column alias). */
const running = async (marker: string) =>
  (await watcher.oneFirst(
    sql.unsafe`SELECT count(*)::int FROM pg_stat_activity WHERE application_name = ${APP} AND state = 'active' AND position(${marker} in query) > 0`,
  )) as number;

const one = () => pool.oneFirst(sql.unsafe`SELECT 1`);

describe("the query pool through an outage", () => {
  it("answers every one of five times its size of callers while the database is away, and serves them all once it is back", async () => {
    for (let outage = 0; outage < 3; outage++) {
      // Connections open and busy when the database goes: each dies under its query.
      const marker = `busy_${outage}`;
      const busy = Array.from({ length: SIZE }, () => pool.query(sql.unsafe`SELECT pg_sleep(30) AS ${sql.identifier([marker])}`));
      await until("the pool's connections are all busy", async () => (await running(marker)) === SIZE);
      proxy.refuse("close");
      proxy.cut();
      const during = await Promise.allSettled([...busy, ...Array.from({ length: 5 * SIZE }, one)]);
      expect(during.map((r) => r.status)).toEqual(Array(6 * SIZE).fill("rejected"));

      proxy.refuse(null);
      const after = await Promise.all(Array.from({ length: 5 * SIZE }, one));
      expect(after).toEqual(Array(5 * SIZE).fill(1));
    }
  });

  it("runs no more statements at once than its size", async () => {
    const opened = Array.from({ length: 4 * SIZE }, () => pool.query(sql.unsafe`SELECT pg_sleep(0.1) AS "at_once"`));
    let settled = false;
    void Promise.allSettled(opened).then(() => (settled = true));
    let most = 0;
    while (!settled) most = Math.max(most, await running("at_once"));
    await Promise.all(opened);
    expect(most).toBe(SIZE);
  });

  it("fails the operations on a path that went silent once they go unanswered past the limit, and serves on new connections", async () => {
    const path = await startTcpProxy(databaseUrl());
    const quiet = await openPool({ url: path.url, maxConnections: SIZE, silentMs: SILENT_MS });
    try {
      const ask = () => quiet.oneFirst(sql.unsafe`SELECT 1`);
      // Both connections open and idle, then the path freezes under them.
      await Promise.all(Array.from({ length: SIZE }, () => quiet.query(sql.unsafe`SELECT pg_sleep(0.05)`)));
      path.freeze();
      const silent = await Promise.allSettled(Array.from({ length: SIZE }, ask));
      for (const r of silent) {
        expect(r.status).toBe("rejected");
        const mapped = interpretDbError((r as PromiseRejectedResult).reason);
        expect(mapped).toBeInstanceOf(AppError);
        expect((mapped as AppError).kind).toBe("unavailable");
      }
      expect(await Promise.all(Array.from({ length: 3 * SIZE }, ask))).toEqual(Array(3 * SIZE).fill(1));
    } finally {
      await path.close();
      await quiet.end();
    }
  });
});
