/**
 * Stopping when the database has gone away (a terminal's Ctrl-C reaches an embedded Postgres as well
 * as the daemon): every background loop still stops, and the LISTEN connection's reconnect loop ends
 * at once. A stop that ended at the first failing step would leave the listener reconnecting and the
 * process running.
 */
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { stopBackground } from "../src/daemon.js";
import { PgListener } from "../src/db/notify.js";
import { captureLog } from "./support/agents.js";

describe("stopping", () => {
  it("stops every background loop in order even when one fails, and logs the failure", async () => {
    const events: string[] = [];
    // Each stop takes a turn of the event loop: were they started together, their steps would interleave.
    const loop = (name: string, fails = false) => ({
      stop: async () => {
        events.push(`${name} stopping`);
        await new Promise((resolve) => setImmediate(resolve));
        if (fails) throw new Error("database unavailable");
        events.push(`${name} stopped`);
      },
    });
    const { log, lines } = captureLog("error");
    await stopBackground([loop("sweeps"), loop("notifier", true), loop("listener"), loop("pool")], log);
    expect(events).toEqual([
      "sweeps stopping",
      "sweeps stopped",
      "notifier stopping",
      "listener stopping",
      "listener stopped",
      "pool stopping",
      "pool stopped",
    ]);
    expect(lines()).toEqual([
      expect.objectContaining({
        msg: "error while stopping a background loop; stopping the rest",
        err: expect.objectContaining({ message: "database unavailable" }),
      }),
    ]);
  });

  it("a listener whose database is gone stops at once, not after its reconnect backoff", async () => {
    const attempts: Record<string, unknown>[] = [];
    let retrying!: () => void;
    const firstRetry = new Promise<void>((resolve) => (retrying = resolve));
    const log = pino(
      { level: "warn" },
      {
        write: (s: string) => {
          const line = JSON.parse(s) as Record<string, unknown>;
          if (String(line.msg).includes("retrying")) {
            attempts.push(line);
            retrying();
          }
        },
      },
    );
    // Nothing listens on port 1. The backoff is a minute, twice the test's timeout: a stop that waited
    // it out would fail the test, so the stop below can only end by cutting the backoff short.
    const listener = new PgListener("postgres://root@127.0.0.1:1/none", log, { firstRetryMs: 60_000 });
    const started = listener.start();
    await firstRetry;
    expect(attempts).toEqual([expect.objectContaining({ retryInMs: 60_000 })]);

    await listener.stop();
    // start() ends, without an error, and the listener tried nothing more.
    await expect(started).resolves.toBeUndefined();
    expect(attempts).toHaveLength(1);
  });
});
