/**
 * A handler that blocks the event loop keeps its item's lease: the heartbeat thread renews it, so
 * the item completes on its first dispatch however long the loop stays blocked.
 *
 * The daemon runs in a child process (daemon-process.ts): in this process it would share the
 * blocked event loop. Nothing here measures time: the handler blocks until the item's row shows a
 * renewal made after the lease it was claimed with had expired, or shows it lost.
 */
import { Worker } from "node:worker_threads";
import { beforeAll, describe, expect, it } from "vitest";
import type { TestDb } from "../../test/support/db.js";
import { useTestDb } from "../../test/support/kit.js";
import { useChildDaemon } from "./daemon-process.js";
import { callLog, Producer, testAgent, WorkItemStatus } from "./support.js";

const LEASE_TTL_MS = 1_500;

const fx = useTestDb("sdkblocked");
let db: TestDb;
beforeAll(() => {
  db = fx.db;
});
const daemon = useChildDaemon(() => fx.db.schema, "blocked-child", { heartbeatInterval: "300ms", leaseTtl: `${LEASE_TTL_MS}ms` });

type Seen = "renewed" | "lost" | "gave up";

/**
 * Blocks this thread, its event loop included, until a watcher on a thread of its own sees the row
 * of item `id` renewed past the lease it held when first looked at by a whole TTL (so the renewal
 * came after that lease had expired, when a sweep would otherwise have taken the item back), or
 * sees the item taken back (no longer dispatched under the token it had). The watcher gives up
 * after `capMs`, which only a broken test reaches.
 */
function blockUntilRenewed(id: string, capMs = 20_000): Seen {
  const state = new Int32Array(new SharedArrayBuffer(2 * Int32Array.BYTES_PER_ELEMENT));
  const watcher = new Worker(
    `const { workerData: w } = require("node:worker_threads");
    const pg = require("pg");
    const state = new Int32Array(w.shared);
    (async () => {
      const c = new pg.Client({ connectionString: w.url });
      const giveUpAt = Date.now() + w.capMs;
      let seen = 3;
      try {
        await c.connect();
        let first;
        let token;
        for (;;) {
          const { rows: [row] } = await c.query("SELECT status, lease_token, lease_expires_at FROM " + w.table + " WHERE id = $1", [w.id]);
          token ??= row?.lease_token;
          if (!row || row.status !== "dispatched" || row.lease_token !== token) { seen = 2; break; }
          const expiry = BigInt(row.lease_expires_at);
          first ??= expiry;
          if (expiry >= first + BigInt(w.ttlNs)) { seen = 1; break; }
          if (Date.now() > giveUpAt) break;
          await new Promise((r) => setTimeout(r, 20));
        }
      } finally {
        await c.end().catch(() => {});
        Atomics.store(state, 1, seen);
        Atomics.store(state, 0, 1);
        Atomics.notify(state, 0);
      }
    })();`,
    {
      eval: true,
      workerData: { shared: state.buffer, url: db.url, table: db.tables.qualified("work_item"), id, ttlNs: String(LEASE_TTL_MS * 1_000_000), capMs },
    },
  );
  while (Atomics.load(state, 0) === 0) Atomics.wait(state, 0, 0, capMs);
  void watcher.terminate();
  return (["renewed", "lost", "gave up"] as const)[Atomics.load(state, 1) - 1]!;
}

describe("a handler that blocks the event loop", () => {
  it("for longer than the lease TTL keeps its lease: the item completes on its first dispatch, and the main thread never renewed", async () => {
    const producer = new Producer(daemon.address(), "t1");
    const calls = callLog();
    let runs = 0;
    const agent = testAgent(daemon.address(), {
      engineKinds: ["blocked"],
      interceptors: [calls.interceptor],
      handlers: {
        // A second dispatch would mean the lease was lost: it returns at once, so the test fails fast.
        blocked: (item) => (++runs === 1 ? blockUntilRenewed(item.id) : "dispatched again"),
      },
    });
    await agent.start();
    expect(agent.registration?.leaseTtlMs).toBe(LEASE_TTL_MS);

    const [id] = await producer.enqueue([{ engineKind: "blocked", maxRetries: 3 }]);
    const [done] = await producer.waitDone([id!], 30_000);

    expect(done).toMatchObject({
      status: WorkItemStatus.COMPLETED,
      retryCount: 0,
      redeliveryCount: 0,
      agentId: agent.name,
      resultJson: JSON.stringify("renewed"),
    });
    expect(runs).toBe(1);
    // The heartbeat thread is the one that renews (on a connection of its own, which this log does not see).
    expect(calls.count("ExtendLease")).toBe(0);
    producer.close();
  });
});
