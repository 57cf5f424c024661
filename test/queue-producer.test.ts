/**
 * What a producer reads and writes besides single items: ListItems' pages and filters, and an
 * idempotent batch enqueue that waits for a concurrent writer holding one of its keys instead of
 * deadlocking with it.
 *
 * On the daemon of test/support/queue-daemon.ts: one daemon, a fake clock, sweeps run by the tests.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import pg from "pg";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import type { TestDb } from "./support/db.js";
import { codeOf } from "./support/kit.js";
import { type Producer, STATEMENT, statusCounts, track, untilLockWait } from "./support/queue.js";
import { ids, useQueueDaemon } from "./support/queue-daemon.js";

const fx = useQueueDaemon("qprod");
const { clock, agent, closers } = fx;
// The file's schema, daemon and producer, once the fixture's beforeAll has made them.
let db: TestDb, p: Producer;
beforeAll(() => void ({ db, p } = fx));

describe("ListItems", () => {
  it("pages in priority, creation order with page tokens, and an empty token after the last page", async () => {
    const t = "paging";
    const priorities = [2, 0, 1, 0, 2];
    const created: string[] = [];
    for (const priority of priorities) {
      created.push(await p.one(t, { engineKind: "dag", priority }));
      clock.advance(1);
    }
    const expected = [1, 3, 2, 0, 4].map((i) => created[i]!);
    const pages: string[][] = [];
    const tokens: string[] = [];
    let pageToken = "";
    do {
      const res = await p.q.listItems({ tenantKey: t, pageSize: 2, pageToken }, p.call);
      pages.push(ids(res.items));
      tokens.push(res.nextPageToken);
      pageToken = res.nextPageToken;
    } while (pageToken !== "" && pages.length < 10);
    expect(pages).toEqual([expected.slice(0, 2), expected.slice(2, 4), expected.slice(4)]);
    expect(tokens.map((tk) => tk !== "")).toEqual([true, true, false]);

    // Filters: a status filter over the same order.
    const a = await agent("paging-1", { tenants: [t] });
    await a.claim(1);
    const list = async (filter: { statuses?: WorkItemStatus[]; agentId?: string; runId?: string; engineKind?: string }) =>
      ids((await p.q.listItems({ tenantKey: t, pageSize: 10, ...filter }, p.call)).items);
    expect(await list({ statuses: [WorkItemStatus.PENDING] })).toEqual(expected.slice(1));
    expect(await list({ statuses: [WorkItemStatus.DISPATCHED, WorkItemStatus.COMPLETED] })).toEqual(expected.slice(0, 1));
    expect(await list({ agentId: "paging-1" })).toEqual(expected.slice(0, 1));
    const [graph] = ids(await p.enqueue(t, [{ engineKind: "graph", runId: "run-p", priority: 9 }]));
    expect(await list({ engineKind: "graph" })).toEqual([graph]);
    expect(await list({ runId: "run-p" })).toEqual([graph]);
    expect(await list({ engineKind: "dag", runId: "run-p" })).toEqual([]);
    expect(await codeOf(p.q.listItems({ tenantKey: t, pageToken: "not-a-token" }, p.call))).toBe(Code.InvalidArgument);
  });
});

describe("idempotent enqueue against a concurrent writer", () => {
  it("a batch whose key another transaction holds waits for it instead of deadlocking with it", async () => {
    // Another daemon's batch is mid-statement: it has written key-a and is about to write key-b.
    // Our batch lists key-b before key-a. Were keys written in request order, ours would hold key-b
    // while waiting for key-a, and the other would wait for key-b: a deadlock, which Postgres breaks
    // by failing one of them. The other side checks for deadlocks first (its deadlock_timeout is
    // short), so a deadlock shows as its insert failing (our side's pool would retry, after 1 s).
    const t = "idem-lock";
    const q = db.tables.qualified("work_item");
    const other = new pg.Client({ connectionString: db.url });
    await other.connect();
    closers.defer(() => other.end());
    const insert = (id: string, key: string) =>
      other.query(
        `INSERT INTO ${q} (id, tenant_key, engine_id, engine_kind, status, priority, next_attempt_at, retry_count, max_retries, idempotency_key, createdby, createdon)
         VALUES ($1, $2, 'other', 'dag', 'pending', 0, 0, 0, 0, $3, 'other', now())`,
        [id, t, key],
      );
    await other.query("SET deadlock_timeout = '20ms'");
    await other.query("BEGIN");
    await insert("OTHER-A", "key-a");
    const ours = track(
      p.enqueue(t, [
        { engineKind: "dag", idempotencyKey: "key-b" },
        { engineKind: "dag", idempotencyKey: "key-a" },
      ]),
    );
    await untilLockWait(db, STATEMENT.insert);
    const second = await insert("OTHER-B", "key-b").then(
      () => "ok",
      (err: Error) => err.message,
    );
    await other.query(second === "ok" ? "COMMIT" : "ROLLBACK");
    const res = await ours.promise.then(
      (r) => r,
      (err: Error) => err.message,
    );
    expect(second).toBe("ok");
    expect(res).toEqual([
      { id: "OTHER-B", existing: true },
      { id: "OTHER-A", existing: true },
    ]);
    expect(await statusCounts(db, t)).toEqual({ pending: 2 });
  });
});
