/**
 * PgListener against a real Postgres, reached through a loopback proxy that can go silent: a LISTEN
 * connection only reads, so nothing but the listener's own ping notices that it stopped answering.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PgListener } from "../src/db/notify.js";
import { silentLogger } from "../src/log.js";
import { createTestDb, type TestDb } from "./support/db.js";
import { startTcpProxy, type TcpProxy } from "./support/tcp-proxy.js";

let db: TestDb;
let proxy: TcpProxy;

beforeAll(async () => {
  db = await createTestDb({ migrate: false, label: "notify" });
  proxy = await startTcpProxy(db.url);
});
afterAll(async () => {
  await proxy?.close();
  await db?.drop();
});

describe("PgListener", () => {
  it("replaces a listening connection that stopped answering, and hears notifications again", async () => {
    const channel = db.tables.channel("notify_silent");
    const listener = new PgListener(proxy.url, silentLogger(), { firstRetryMs: 10, pingEveryMs: 20, pingTimeoutMs: 100 });
    try {
      await listener.start();
      const heard: string[] = [];
      let onHeard: () => void = () => {};
      await listener.on(channel, (p) => {
        heard.push(p);
        onHeard();
      });
      const next = () => new Promise<void>((resolve) => (onHeard = resolve));
      let got = next();
      await db.raw("SELECT pg_notify($1, 'before')", [channel]);
      await got;
      expect(proxy.opened).toBe(1);

      const reconnected = new Promise<void>((resolve) => listener.onReconnect(resolve));
      proxy.freeze();
      // Nothing closes the frozen connection: only the unanswered ping can end it.
      await reconnected;
      expect(proxy.opened).toBe(2);
      got = next();
      await db.raw("SELECT pg_notify($1, 'after')", [channel]);
      await got;
      expect(heard).toEqual(["before", "after"]);
    } finally {
      await listener.stop();
    }
  });
});
