/**
 * Read-only aggregate queries over aiflow_work_item for operators: queue depth, age, rates, and
 * what one agent holds. Kept apart from the queue's write path in work-items.ts.
 */
import { sql, type CommonQueryMethods } from "slonik";
import { msToNs } from "../clock.js";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import { canTakeWork } from "./agents.js";
import { ITEM_COLUMNS, ITEM_STATUSES, workItemRow, type WorkItemRow } from "./work-items.js";

const depthRow = z.object({ tenant_key: z.string(), engine_kind: z.string(), status: z.enum(ITEM_STATUSES), n: z.bigint() });

const gaugeRow = z.object({
  tenant_key: z.string(),
  engine_kind: z.string(),
  status: z.enum(ITEM_STATUSES),
  n: z.number(),
  /** When (ns) the pending item that has been due longest became due (see dueNs); null when none is due. */
  oldest_due_ns: z.bigint().nullable(),
});
export type QueueGaugeRow = z.infer<typeof gaugeRow>;

export interface QueueStats {
  depth: readonly z.infer<typeof depthRow>[];
  oldestPendingMs: number | null;
  dispatchedLastMinute: number;
  completedLastMinute: number;
  /** Of the items dispatched in the last minute: ms from due (enqueued, or its retry's time) to dispatched, p50 and p99; null when none was. */
  waitP50Ms: number | null;
  waitP99Ms: number | null;
}

const requirementGroup = z.object({
  tenant_key: z.string(),
  engine_kind: z.string(),
  requirements: z.record(z.unknown()),
  n: z.number(),
  oldest: z.number(),
});
export type RequirementGroup = z.infer<typeof requirementGroup>;
const unservedGroup = z.object({
  tenant_key: z.string(),
  engine_kind: z.string(),
  n: z.number(),
  /** createdon (ms) of the oldest of them. */
  oldest: z.number(),
  /** Registered (not removed) agents serving both that may not take work now: draining or inactive. */
  not_active: z.number(),
});
export type UnservedGroup = z.infer<typeof unservedGroup>;
const pendingNeed = z.object({ id: z.string(), tenant_key: z.string(), engine_kind: z.string(), requirements: z.record(z.unknown()) });
export type PendingNeed = z.infer<typeof pendingNeed>;

/**
 * When an item became due, as every wait and age here counts it: its next_attempt_at, but never
 * before it was created. An item cannot have waited before it existed, and rows queued with
 * next_attempt_at 0 (the engines' items before issue 52, or a not_before in the past) would
 * otherwise read as waiting since 1970 and fire every queue-age alert.
 */
const dueNs = sql.fragment`greatest(coalesce(next_attempt_at, 0), (extract(epoch FROM createdon) * 1e9)::int8)`;

export class WorkItemStatsStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /** Stats over these tenants (null: every tenant). */
  async stats(tenants: readonly string[] | null, nowMs: number): Promise<QueueStats> {
    const w = this.t.id("work_item");
    const scope = tenants ? sql.fragment`tenant_key = ANY(${sql.array([...tenants], "text")})` : sql.fragment`true`;
    const since = msToNs(nowMs - 60_000);
    return withDbErrors(async () => {
      const depth = await this.db.any(sql.type(depthRow)`
        SELECT tenant_key, engine_kind, status, count(*) AS n FROM ${w} WHERE ${scope} GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`);
      const row = await this.db.one(
        sql.type(
          z.object({ oldest: z.number().nullable(), dispatched: z.number(), completed: z.number(), p50: z.number().nullable(), p99: z.number().nullable() }),
        )`
        SELECT (SELECT min(createdon) FROM ${w} WHERE ${scope} AND status = 'pending') AS oldest,
               d.dispatched, d.p50, d.p99,
               (SELECT count(*)::int FROM ${w} WHERE ${scope} AND status = 'completed' AND completed_at >= ${since}) AS completed
          FROM (SELECT count(*)::int AS dispatched,
                       percentile_cont(0.5) WITHIN GROUP (ORDER BY wait_ms) AS p50,
                       percentile_cont(0.99) WITHIN GROUP (ORDER BY wait_ms) AS p99
                  FROM (SELECT greatest(0, dispatched_at - ${dueNs}) / 1e6 AS wait_ms
                          FROM ${w} WHERE ${scope} AND dispatched_at >= ${since}) AS waits) AS d`,
      );
      return {
        depth,
        oldestPendingMs: row.oldest,
        dispatchedLastMinute: row.dispatched,
        completedLastMinute: row.completed,
        waitP50Ms: row.p50,
        waitP99Ms: row.p99,
      };
    });
  }

  /**
   * The queue's gauges for /metrics in one statement: items by tenant, engine kind and status, and
   * per pair the pending item due longest ago. One pass over the table, run at most once per
   * --metrics-refresh however many scrape (src/observability/fleet-gauges.ts).
   */
  gauges(nowMs: number): Promise<readonly QueueGaugeRow[]> {
    const w = this.t.id("work_item");
    return withDbErrors(() =>
      this.db.any(sql.type(gaugeRow)`
        SELECT tenant_key, engine_kind, status, count(*)::int AS n,
               min(${dueNs}) FILTER (WHERE status = 'pending' AND next_attempt_at <= ${msToNs(nowMs)}) AS oldest_due_ns
          FROM ${w} GROUP BY 1, 2, 3`),
    );
  }

  /** Pending items that state requirements, grouped by tenant, engine kind and requirements (the largest groups first). */
  requirementGroups(tenants: readonly string[] | null, limit: number): Promise<readonly RequirementGroup[]> {
    const w = this.t.id("work_item");
    const scope = tenants ? sql.fragment`AND tenant_key = ANY(${sql.array([...tenants], "text")})` : sql.fragment``;
    return withDbErrors(() =>
      this.db.any(sql.type(requirementGroup)`
        SELECT tenant_key, engine_kind, worker_params -> 'requirements' AS requirements, count(*)::int AS n, min(createdon) AS oldest
          FROM ${w} WHERE status = 'pending' AND worker_params ? 'requirements' ${scope}
         GROUP BY 1, 2, 3 ORDER BY n DESC, 1, 2 LIMIT ${limit}`),
    );
  }

  /**
   * Due pending items grouped by tenant and engine kind where no agent may claim them: none that may
   * take work (canTakeWork: ACTIVE, not removed) serves both, as the claim's term 3 reads an agent's
   * lists (./work-items/claim-rule.ts). Oldest group first. The pending items are grouped before the
   * agents are looked at, so the registry is read once per group, not once per item; the grouping
   * is one pass over the pending items, as the depth in stats() is over the table.
   */
  unservedGroups(tenants: readonly string[] | null, nowMs: number, limit: number): Promise<readonly UnservedGroup[]> {
    const w = this.t.id("work_item");
    const a = this.t.id("agent");
    const scope = tenants ? sql.fragment`AND tenant_key = ANY(${sql.array([...tenants], "text")})` : sql.fragment``;
    const serves = sql.fragment`ag.deletedon IS NULL AND ag.metadata -> 'tenants' ? due.tenant_key AND ag.metadata -> 'engineKinds' ? due.engine_kind`;
    return withDbErrors(() =>
      this.db.any(sql.type(unservedGroup)`
        WITH due AS (
          SELECT tenant_key, engine_kind, count(*)::int AS n, min(createdon) AS oldest
            FROM ${w} WHERE status = 'pending' AND next_attempt_at <= ${msToNs(nowMs)} ${scope}
           GROUP BY 1, 2)
        SELECT due.tenant_key, due.engine_kind, due.n, due.oldest,
               (SELECT count(*)::int FROM ${a} ag WHERE ${serves}) AS not_active
          FROM due
         WHERE NOT EXISTS (SELECT 1 FROM ${a} ag WHERE ${serves} AND ${canTakeWork("ag")})
         ORDER BY due.oldest, 1, 2 LIMIT ${limit}`),
    );
  }

  /** Pending items that state requirements and have waited, unchanged, since before `beforeMs` (oldest first). */
  waitingNeeds(beforeMs: number, limit: number): Promise<readonly PendingNeed[]> {
    const w = this.t.id("work_item");
    return withDbErrors(() =>
      this.db.any(sql.type(pendingNeed)`
        SELECT id, tenant_key, engine_kind, worker_params -> 'requirements' AS requirements FROM ${w}
         WHERE status = 'pending' AND worker_params ? 'requirements' AND updatedon < ${new Date(beforeMs).toISOString()}::timestamptz
         ORDER BY updatedon LIMIT ${limit}`),
    );
  }

  /** Items dispatched to an agent now, in dispatch order. */
  dispatchedTo(agent: string): Promise<readonly WorkItemRow[]> {
    const w = this.t.id("work_item");
    return withDbErrors(() =>
      this.db.any(sql.type(workItemRow)`SELECT ${ITEM_COLUMNS} FROM ${w} WHERE agent_id = ${agent} AND status = 'dispatched' ORDER BY dispatched_at, id`),
    );
  }
}
