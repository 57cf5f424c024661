/**
 * What a flood of waiting claims may cost: at most --claim-max-waiting-per-agent and
 * --claim-max-waiting-per-token of them wait at once (more are RESOURCE_EXHAUSTED, with a message
 * saying which limit and what to do), and the fallback re-check of those that wait is one statement
 * per daemon, ringing only the keys that have due work, rather than a statement per claim.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FakeClock, msToNs } from "../src/clock.js";
import { defaultConfig } from "../src/config.js";
import type { Daemon } from "../src/daemon.js";
import { silentLogger } from "../src/log.js";
import { parseTokenSpec } from "../src/domain/tokens.js";
import { Wakeups } from "../src/queue/wakeups.js";
import type { DirectiveHub } from "../src/fleet/directives.js";
import { FALLBACK_CHECK_MS, WorkQueue } from "../src/queue/work-queue.js";
import { DaemonMetrics } from "../src/observability/metrics.js";
import { workKey } from "../src/queue/work-keys.js";
import { WorkItemStore } from "../src/store/work-items.js";
import { openCountingPool, type CountingPool } from "./support/counting-pool.js";
import { testTokens, TOKENS } from "./support/daemon.js";
import type { TestDb } from "./support/db.js";
import { useTestDaemon } from "./support/kit.js";
import { grpc, loadService, unary } from "./support/grpc-js.js";
import { newItem, serverNow, STATEMENT, untilStatementRan } from "./support/queue.js";

const CAP_TOKEN = "cap-token-123";
const clock = new FakeClock(Date.UTC(2026, 6, 1));
const fx = useTestDaemon({
  label: "claim_limits",
  clock,
  config: { tokens: [...testTokens(), parseTokenSpec(`agent:${CAP_TOKEN}`, "t")], claimMaxWaitingPerAgent: 2, claimMaxWaitingPerToken: 3 },
});
let db: TestDb;
let daemon: Daemon;
let agents: grpc.Client;
let queue: grpc.Client;

type Claimed = { items: { id: string }[] };
const register = async (name: string, tenant: string, kind: string, token: string = TOKENS.agent) => {
  const [err] = await unary(agents, "Register", { name, metadata: { tenants: [tenant], engineKinds: [kind] } }, token);
  if (err) throw err;
};
const claim = (name: string, waitMs: number, token: string = TOKENS.agent) =>
  unary<Claimed>(
    agents,
    "Claim",
    { name, maxItems: 1, wait: waitMs > 0 ? { seconds: String(Math.floor(waitMs / 1000)), nanos: (waitMs % 1000) * 1e6 } : undefined },
    token,
  );
const enqueue = async (tenant: string, kind: string, n: number) => {
  const [err, res] = await unary<{ results: { id: string }[] }>(
    queue,
    "Enqueue",
    { tenantKey: tenant, items: Array.from({ length: n }, () => ({ engineKind: kind })) },
    TOKENS.engine,
  );
  if (err) throw err;
  return res!.results.map((r) => r.id);
};
/** The first of these calls to settle, and the others. */
async function firstSettled<T>(calls: Promise<T>[]): Promise<{ first: T; rest: Promise<T>[] }> {
  const i = await Promise.race(calls.map((c, i) => c.then(() => i)));
  return { first: await calls[i]!, rest: calls.filter((_, j) => j !== i) };
}

beforeAll(() => {
  ({ db, daemon } = fx);
  const client = (proto: string, service: string) => new (loadService(proto, service))(daemon.address, grpc.credentials.createInsecure());
  agents = client("aiflow/cluster/v1/agent.proto", "aiflow.cluster.v1.AgentService");
  queue = client("aiflow/cluster/v1/queue.proto", "aiflow.cluster.v1.QueueService");
});

afterAll(() => {
  agents?.close();
  queue?.close();
});

describe("waiting claims", () => {
  it("one agent holds at most --claim-max-waiting-per-agent of them; the next is RESOURCE_EXHAUSTED, and a freed one is taken again", async () => {
    await register("cap-a", "tc1", "k1");
    const { first, rest } = await firstSettled([claim("cap-a", 20_000), claim("cap-a", 20_000), claim("cap-a", 20_000)]);
    expect(first[0]?.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(first[0]?.details).toContain("agent 'cap-a'");
    expect(first[0]?.details).toContain("--claim-max-waiting-per-agent");
    // A claim that does not wait is not held against the limit.
    const [noWaitErr, noWait] = await claim("cap-a", 0);
    expect(noWaitErr).toBeNull();
    expect(noWait!.items).toEqual([]);

    const ids = await enqueue("tc1", "k1", 2);
    const answered = await Promise.all(rest);
    expect(answered.map(([err]) => err)).toEqual([null, null]);
    expect(answered.flatMap(([, r]) => r!.items.map((i) => i.id)).sort()).toEqual([...ids].sort());

    // Both have answered, so both places are free again.
    const again = [claim("cap-a", 20_000), claim("cap-a", 20_000)];
    const more = await enqueue("tc1", "k1", 2);
    const got = await Promise.all(again);
    expect(got.flatMap(([err, r]) => (err ? [String(err.code)] : r!.items.map((i) => i.id))).sort()).toEqual([...more].sort());
  });

  it("one token's agents hold at most --claim-max-waiting-per-token of them", async () => {
    const names = ["cap-t1", "cap-t2", "cap-t3", "cap-t4"];
    for (const n of names) await register(n, "tc2", "k2", CAP_TOKEN);
    const { first, rest } = await firstSettled(names.map((n) => claim(n, 20_000, CAP_TOKEN)));
    expect(first[0]?.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(first[0]?.details).toContain("--claim-max-waiting-per-token");
    // Another token's agent is not held against this token's limit.
    await register("cap-other", "tc2", "k2");
    const other = claim("cap-other", 20_000);
    const ids = await enqueue("tc2", "k2", 4);
    const answered = await Promise.all([...rest, other]);
    expect(answered.map(([err]) => err)).toEqual([null, null, null, null]);
    expect(answered.flatMap(([, r]) => r!.items.map((i) => i.id)).sort()).toEqual([...ids].sort());
  });

  it("a waiting claim finds work nobody announced (a lost NOTIFY) at the daemon's fallback re-check", async () => {
    await register("fb-a", "tf", "kf");
    const since = await serverNow(db);
    // Shorter than any timer of the claim's own could be: only the daemon's re-check can find the item.
    const waiting = claim("fb-a", 3_000);
    await untilStatementRan(db, STATEMENT.claim, since);
    // Written behind the daemon's back (no ring, no NOTIFY), and due before the due-wake task's window.
    const store = new WorkItemStore(db.pool, db.tables, { baseMs: 1000, capMs: 1000, jitter: false });
    const now = clock.nowMs();
    const [row] = WorkItemStore.rows("tf", "eng", [newItem({ engineKind: "kf", notBeforeNs: msToNs(now - 60_000) })], now, "test");
    await store.enqueueRows([row!]);
    clock.advance(FALLBACK_CHECK_MS);
    await daemon.maintenance.runOnce();
    const [err, res] = await waiting;
    expect(err).toBeNull();
    expect(res!.items.map((i) => i.id)).toEqual([row!.id]);
  });
});

describe("the fallback re-check", () => {
  let counting: CountingPool;
  beforeAll(async () => {
    counting = await openCountingPool(db.url, 2);
  });
  afterAll(async () => {
    await counting?.end();
  });

  it("is one statement for a thousand waiting claims, and rings only the keys that have due items", async () => {
    const local = new FakeClock(Date.UTC(2026, 7, 1));
    const store = new WorkItemStore(counting.pool, db.tables, { baseMs: 1000, capMs: 1000, jitter: false });
    const work = new Wakeups(counting.pool, "unused", "test", 0, silentLogger());
    const done = new Wakeups(counting.pool, "unused", "test", 0, silentLogger());
    const config = defaultConfig({ databaseUrl: db.url, schema: db.schema, listen: { host: "127.0.0.1", port: 0 } });
    const core = new WorkQueue(store, {} as DirectiveHub, work, done, local, config, silentLogger(), new DaemonMetrics());
    const task = core.dueTask();

    const hot = new Set([workKey("th", "hot")]);
    const cold = new Set([workKey("th", "cold")]);
    const waiters = Array.from({ length: 1000 }, (_, i) => work.arm(i % 2 === 0 ? hot : cold));
    const now = local.nowMs();
    await store.enqueueRows(WorkItemStore.rows("th", "eng", [newItem({ engineKind: "hot", notBeforeNs: msToNs(now - 60_000) })], now, "test"));

    counting.reset();
    local.advance(1_000);
    await task.run(local.nowMs());
    // Only the due-wake window's statement: the re-check waits for its interval.
    expect(counting.statements).toHaveLength(1);
    expect((await rungOf(waiters)).filter(Boolean)).toHaveLength(0);

    counting.reset();
    local.advance(FALLBACK_CHECK_MS);
    await task.run(local.nowMs());
    // The window's statement and ONE re-check for every waiter.
    expect(counting.statements).toHaveLength(2);
    const rung = await rungOf(waiters);
    expect(rung.filter((r, i) => r && i % 2 === 0)).toHaveLength(500);
    expect(rung.filter((r, i) => r && i % 2 === 1)).toHaveLength(0);
    for (const w of waiters) w.disarm();
  });
});

/** Whether each waiter was rung: a rung waiter's wait answers true at once, an unrung one times out at 0. */
const rungOf = (waiters: readonly { wait(ms: number, signals: readonly AbortSignal[]): Promise<boolean> }[]) => Promise.all(waiters.map((w) => w.wait(0, [])));
