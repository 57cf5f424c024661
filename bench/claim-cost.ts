/**
 * The claim_cost section: what one claim statement costs when the agent serves several tenants (the
 * "shared" shape: turns by fair share, then each tenant's best items) against an agent of one
 * tenant (the plain shape), for 1, 10, 100 and 1,000 backlogged tenants. In this process, through
 * the daemon's own store and named prepared statements (PreparedQueries, as src/services.ts
 * builds them), on a schema of its own: no daemon, no RPC, no agent process, only the statement.
 *
 * Each case starts from empty tables, enqueues a backlog of `items` spread evenly over its tenants
 * (through the store's enqueue, so turns and ranks are what a daemon writes), inserts one agent row
 * serving them, vacuums and analyses the table (as the drain does before it measures), then times
 * `claims` claims of `max` one after another, each awaited: completing nothing, each takes new
 * items. A few claims first warm the statement up on its connection (past Postgres's first five
 * custom plans), on a pool of one connection, made afresh per case so no case runs on a plan made
 * under another's data. The plain baseline runs beside every shared case, on the same database.
 *
 * One backlogged tenant: an agent that serves one tenant claims with the plain shape (the daemon
 * passes the number of tenants the agent registered), so that case's agent serves a second tenant
 * with nothing pending, which is what takes the claim down the shared path (agent_tenants says so).
 */
import { randomUUID } from "node:crypto";
import type { DatabasePool } from "slonik";
import { openPool } from "../src/db/pool.js";
import { PreparedQueries } from "../src/db/prepared.js";
import { Tables } from "../src/db/tables.js";
import { DEFAULT_SHARING } from "../src/store/work-items/context.js";
import { plainItem, WorkItemStore, type NewItem } from "../src/store/work-items.js";
import { newId } from "../src/util/ids.js";
import { KIND, PREFIX, openOwnSchema, type Database } from "./env.js";
import { sql } from "./pg.js";
import { ratio, round, summarize } from "./stats.js";

export interface ClaimCostOptions {
  /** Backlogged tenants of each shared case. */
  tenants: readonly number[];
  /** Backlog of each case. */
  items: number;
  /** Timed claims per case, and the warm-up claims before them. */
  claims: number;
  warmup: number;
  /** Items per claim. */
  max: number;
}

export const CLAIM_COST: ClaimCostOptions = { tenants: [1, 10, 100, 1000], items: 20_000, claims: 200, warmup: 10, max: 32 };

const AGENT = "bench-claim-cost";
/** Rows per enqueue statement (a daemon's Enqueue batches are of this order). */
const ENQUEUE_BATCH = 1000;
const BACKOFF = { baseMs: 1000, capMs: 60_000, jitter: true };

const benchItem = (): NewItem => plainItem(KIND, { payloadJson: "{}" });

/**
 * One case: a backlog of `c.items` over `backlogged` tenants, an agent serving `serves` (those and
 * any more, idle), and the milliseconds of each timed claim. `shared` claims as an agent of
 * several tenants (tenants: serves.length), else as an agent of one.
 */
async function timeClaims(own: Database, pool: DatabasePool, c: ClaimCostOptions, backlogged: readonly string[], serves: readonly string[]): Promise<number[]> {
  const t = new Tables(own.schema, PREFIX);
  await sql(own.url, `TRUNCATE ${t.qualified("work_item")}, ${t.qualified("tenant_share")}, ${t.qualified("agent")}, ${t.qualified("affinity_binding")}`);
  const hot = new PreparedQueries(own.url, 1);
  try {
    const store = new WorkItemStore(pool, t, BACKOFF, hot, DEFAULT_SHARING);
    const atMs = Date.now();
    // Item i goes to tenant i mod N: every tenant's backlog is the same to within one item.
    const rows = Array.from({ length: c.items }, (_, i) => WorkItemStore.rows(backlogged[i % backlogged.length]!, "bench", [benchItem()], atMs, "bench")[0]!);
    for (let i = 0; i < rows.length; i += ENQUEUE_BATCH) await store.enqueueRows(rows.slice(i, i + ENQUEUE_BATCH));
    await sql(own.url, `INSERT INTO ${t.qualified("agent")} (id, name, status, metadata, createdby, createdon) VALUES ($1, $2, 'active', $3, 'bench', now())`, [
      newId(),
      AGENT,
      JSON.stringify({ tenants: serves, engineKinds: [KIND] }),
    ]);
    await sql(own.url, `VACUUM (ANALYZE) ${t.qualified("work_item")}`);
    const times: number[] = [];
    for (let n = 0; n < c.warmup + c.claims; n++) {
      const nowMs = Math.max(Date.now(), atMs);
      const input = {
        agent: AGENT,
        instance: "bench",
        max: c.max,
        nowMs,
        leaseTtlMs: 600_000,
        affinity: { policy: "rebind" as const, graceMs: 60_000 },
        bindingSeed: newId(nowMs),
        liveEdgeMs: 0,
        leaseToken: randomUUID(),
        tenants: serves.length,
      };
      const started = process.hrtime.bigint();
      const { claimed } = await store.claim(input);
      const ms = Number(process.hrtime.bigint() - started) / 1e6;
      if (claimed.length !== c.max)
        throw new Error(`claim_cost: claim ${n + 1} over ${backlogged.length} tenant(s) took ${claimed.length} items, not ${c.max}`);
      if (n >= c.warmup) times.push(ms);
    }
    return times;
  } finally {
    await hot.end();
  }
}

/** One figure set per number of backlogged tenants: the shared claim's median and p90 next to the plain one's. */
export async function claimCost(
  db: Database,
  c: ClaimCostOptions,
  emit: (figures: Record<string, number | string>) => void,
  progress: (msg: string) => void,
): Promise<void> {
  if (c.items < (c.warmup + c.claims) * c.max) throw new Error(`claim_cost: ${c.items} items do not last ${c.warmup + c.claims} claims of ${c.max}`);
  const own = await openOwnSchema(db, "claims");
  const pool = await openPool({ url: own.url, maxConnections: 2, applicationName: "aiflow-bench-claim-cost" });
  try {
    for (const n of c.tenants) {
      progress(`claim cost: ${c.claims} claims of ${c.max}, ${c.items} items over ${n} tenant(s), shared and plain`);
      const plain = summarize(await timeClaims(own, pool, c, ["p"], ["p"]));
      const backlogged = Array.from({ length: n }, (_, i) => `c${i}`);
      // With one backlogged tenant, a second one (idle) makes the agent's claims shared (the header).
      const serves = n > 1 ? backlogged : [...backlogged, "idle"];
      const shared = summarize(await timeClaims(own, pool, c, backlogged, serves));
      emit({
        tenants: n,
        agent_tenants: serves.length,
        items: c.items,
        claims: c.claims,
        max: c.max,
        shared_ms_p50: round(shared.p50, 3),
        shared_ms_p90: round(shared.p90, 3),
        plain_ms_p50: round(plain.p50, 3),
        plain_ms_p90: round(plain.p90, 3),
        shared_over_plain: ratio(shared.p50, plain.p50),
      });
    }
  } finally {
    await pool.end();
    await own.close();
  }
}
