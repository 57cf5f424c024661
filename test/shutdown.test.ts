/**
 * Stopping when the database has gone away (a terminal's Ctrl-C reaches an embedded Postgres as well
 * as the daemon): every background loop still stops, and the LISTEN connection's reconnect loop ends
 * at once. Stopping at the first failing step left the listener reconnecting and the process running.
 */
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { stopBackground } from "../src/daemon.js";
import { PgListener } from "../src/db/notify.js";
import { captureLog } from "./support/agents.js";

describe("stopping", () => {
  it("stops every background loop in order even when one fails, and logs the failure", async () => {
    const stopped: string[] = [];
    const { log, lines } = captureLog("error");
    await stopBackground(
      [
        { stop: async () => void stopped.push("sweeps") },
        { stop: async () => Promise.reject(new Error("database unavailable")) },
        { stop: async () => void stopped.push("listener") },
        { stop: async () => void stopped.push("pool") },
      ],
      log,
    );
    expect(stopped).toEqual(["sweeps", "listener", "pool"]);
    expect(lines()).toEqual([expect.objectContaining({ msg: "error while stopping a background loop; stopping the rest", err: expect.objectContaining({ message: "database unavailable" }) })]);
  });

  it("a listener whose database is gone stops at once, not after its reconnect backoff", async () => {
    let retrying!: () => void;
    const firstRetry = new Promise<void>((resolve) => (retrying = resolve));
    const log = pino({ level: "warn" }, { write: (s: string) => (s.includes("retrying") ? retrying() : undefined) });
    // Nothing listens on port 1; a minute's backoff would outlast the test's timeout.
    const listener = new PgListener("postgres://root@127.0.0.1:1/none", log, { firstRetryMs: 60_000 });
    const started = listener.start();
    await firstRetry;
    await listener.stop();
    await started;
  });
});
