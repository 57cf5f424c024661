/**
 * Fixture for the work-queue tests: connect-es clients over a connection of their own (one per agent
 * or producer, closed by `close()`), agents that register and then claim, complete,
 * fail, extend and release, producers that enqueue and read back, and raw readers of the queue table.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { Client } from "@connectrpc/connect";
import {
  AgentService,
  type AgentCapacitySchema,
  type AgentMetricsSchema,
  type CancelDirective,
  type Directive,
} from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import type { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import { QueueService, type EnqueueItemSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import type { ItemOutcome, WorkItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { plainItem, type NewItem } from "../../src/store/work-items.js";
import { bearer, TOKENS } from "./daemon.js";
import type { TestDb } from "./db.js";
import { Connection, until } from "./kit.js";

export type { WorkItem };

/** A plain item as the store takes it (engine kind dag, due now, no selector or keys), with overrides. */
export const newItem = (over: Partial<NewItem> = {}): NewItem => plainItem("dag", over);

/** One HTTP/2 connection to a daemon (kit.ts), with both clients on it. */
export class Conn {
  readonly #conn: Connection;
  readonly agent: Client<typeof AgentService>;
  readonly queue: Client<typeof QueueService>;

  constructor(address: string) {
    this.#conn = new Connection(address);
    this.agent = this.#conn.client(AgentService);
    this.queue = this.#conn.client(QueueService);
  }

  close(): void {
    this.#conn.close();
  }
}

export interface AgentSpec {
  tenants: string[];
  engineKinds: string[];
  tags?: Record<string, string>;
  slots?: number;
  capacity?: MessageInitShape<typeof AgentCapacitySchema>;
}

const agentCall = { headers: bearer(TOKENS.agent) };

/** A registered agent on a connection of its own. */
export class TestAgent {
  readonly conn: Conn;

  private constructor(
    readonly name: string,
    address: string,
  ) {
    this.conn = new Conn(address);
  }

  static async register(address: string, name: string, spec: AgentSpec): Promise<TestAgent> {
    const a = new TestAgent(name, address);
    try {
      await a.conn.agent.register(
        { name, metadata: { tenants: spec.tenants, engineKinds: spec.engineKinds, tags: spec.tags ?? {}, slots: spec.slots ?? 4, capacity: spec.capacity } },
        agentCall,
      );
    } catch (err) {
      a.close();
      throw err;
    }
    return a;
  }

  async claim(max = 1, waitMs = 0): Promise<WorkItem[]> {
    const res = await this.conn.agent.claim({ name: this.name, maxItems: max, wait: waitMs > 0 ? durationFromMs(waitMs) : undefined }, agentCall);
    return res.items;
  }

  /** A claim carrying completions (each item completed with `result`, when given). */
  async claimCompleting(
    max: number,
    done: readonly { id: string; leaseToken: string }[],
    opts: { waitMs?: number; result?: unknown; waitWithCompletions?: boolean } = {},
  ) {
    const resultJson = opts.result === undefined ? "" : JSON.stringify(opts.result);
    return this.conn.agent.claim(
      {
        name: this.name,
        maxItems: max,
        wait: opts.waitMs ? durationFromMs(opts.waitMs) : undefined,
        waitWithCompletions: opts.waitWithCompletions ?? false,
        completions: done.map((i) => ({ workItemId: i.id, leaseToken: i.leaseToken, resultJson })),
      },
      agentCall,
    );
  }

  async claimWithStatus(max = 1): Promise<{ items: WorkItem[]; status: AgentStatus }> {
    return this.conn.agent.claim({ name: this.name, maxItems: max }, agentCall);
  }

  async complete(items: readonly (WorkItem | { id: string; leaseToken: string })[], result?: unknown): Promise<ItemOutcome[]> {
    const res = await this.conn.agent.complete(
      {
        name: this.name,
        items: items.map((i) => ({ workItemId: i.id, leaseToken: i.leaseToken, resultJson: result === undefined ? "" : JSON.stringify(result) })),
      },
      agentCall,
    );
    return res.outcomes;
  }

  async fail(
    items: readonly { id: string; leaseToken: string }[],
    opts: { error?: string; retryable?: boolean; retryDelayMs?: number } = {},
  ): Promise<ItemOutcome[]> {
    const res = await this.conn.agent.fail(
      {
        name: this.name,
        items: items.map((i) => ({
          workItemId: i.id,
          leaseToken: i.leaseToken,
          error: opts.error ?? "boom",
          retryable: opts.retryable ?? true,
          retryDelay: opts.retryDelayMs === undefined ? undefined : durationFromMs(opts.retryDelayMs),
        })),
      },
      agentCall,
    );
    return res.outcomes;
  }

  async extend(items: readonly { id: string; leaseToken: string }[]) {
    return this.conn.agent.extendLease({ name: this.name, leases: items.map((i) => ({ workItemId: i.id, leaseToken: i.leaseToken })) }, agentCall);
  }

  async release(items: readonly { id: string; leaseToken: string }[]): Promise<ItemOutcome[]> {
    const res = await this.conn.agent.release({ name: this.name, leases: items.map((i) => ({ workItemId: i.id, leaseToken: i.leaseToken })) }, agentCall);
    return res.outcomes;
  }

  /** A heartbeat, with metrics when given (simulated GPUs, memory, disks). */
  heartbeat(metrics?: MessageInitShape<typeof AgentMetricsSchema>) {
    return this.conn.agent.heartbeat({ name: this.name, metrics }, agentCall);
  }

  close(): void {
    this.conn.close();
  }
}

/**
 * An agent's WatchDirectives stream (connect client), read in the background. `cancelFor(id)`
 * resolves with the cancel directive for an item as soon as it arrives (or already has).
 */
export class DirectiveWatch {
  readonly received: Directive[] = [];
  readonly #abort = new AbortController();
  #wake: (() => void)[] = [];
  #ended: unknown;

  constructor(readonly agent: TestAgent) {
    void (async () => {
      try {
        for await (const m of agent.conn.agent.watchDirectives({ name: agent.name }, { ...agentCall, signal: this.#abort.signal })) {
          if (m.directive) this.received.push(m.directive);
          this.#poke();
        }
        this.#ended = new Error("stream ended");
      } catch (err) {
        this.#ended = err;
      }
      this.#poke();
    })();
  }

  /** Resolves once the first message (the agent's status) arrived: the stream is subscribed. */
  ready(timeoutMs = 10_000): Promise<Directive> {
    return this.#until(() => this.received[0], "the first directive", timeoutMs);
  }

  cancelFor(workItemId: string, timeoutMs = 10_000): Promise<CancelDirective> {
    return this.#until(
      () => this.received.flatMap((d) => (d.kind.case === "cancel" && d.kind.value.workItemId === workItemId ? [d.kind.value] : []))[0],
      `a cancel directive for ${workItemId}`,
      timeoutMs,
    );
  }

  close(): void {
    this.#abort.abort();
  }

  async #until<T>(find: () => T | undefined, what: string, timeoutMs: number): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const found = find();
      if (found !== undefined) return found;
      if (this.#ended) throw new Error(`${what} never came: ${String(this.#ended)}`);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`${what} did not come within ${timeoutMs}ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.#wake.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  #poke(): void {
    const wake = this.#wake;
    this.#wake = [];
    for (const w of wake) w();
  }
}

export type ItemInit = MessageInitShape<typeof EnqueueItemSchema>;

/** A producer (role engine) on a connection of its own. */
export class Producer {
  readonly conn: Conn;
  readonly #opts: { headers: Record<string, string> };

  constructor(address: string, token: string = TOKENS.engine) {
    this.conn = new Conn(address);
    this.#opts = { headers: bearer(token) };
  }

  get q(): Client<typeof QueueService> {
    return this.conn.queue;
  }

  /** Cancels items of the tenant by id; the ids it cancelled. */
  async cancel(tenant: string, ids: readonly string[]): Promise<string[]> {
    return (await this.conn.queue.cancel({ tenantKey: tenant, ids: [...ids] }, this.#opts)).cancelledIds;
  }

  get call(): { headers: Record<string, string> } {
    return this.#opts;
  }

  async enqueue(tenant: string, items: readonly ItemInit[]): Promise<{ id: string; existing: boolean }[]> {
    const res = await this.conn.queue.enqueue({ tenantKey: tenant, items: [...items] }, this.#opts);
    return res.results.map((r) => ({ id: r.id, existing: r.existing }));
  }

  /** Enqueues items; their ids, in order. */
  async ids(tenant: string, items: readonly ItemInit[]): Promise<string[]> {
    return (await this.enqueue(tenant, items)).map((r) => r.id);
  }

  /** `n` items of one kind (payload {"n": i}); their ids. */
  many(tenant: string, kind: string, n: number, extra: { maxRetries?: number; priority?: number; runId?: string } = {}): Promise<string[]> {
    return this.ids(
      tenant,
      Array.from({ length: n }, (_, i) => ({ engineKind: kind, payloadJson: JSON.stringify({ n: i }), ...extra })),
    );
  }

  /** Enqueues one item and returns its id. */
  async one(tenant: string, item: ItemInit): Promise<string> {
    const [r] = await this.enqueue(tenant, [item]);
    return r!.id;
  }

  async get(tenant: string, id: string) {
    return this.conn.queue.getItem({ tenantKey: tenant, id }, this.#opts);
  }

  async item(tenant: string, id: string): Promise<WorkItem> {
    const res = await this.get(tenant, id);
    return res.item!;
  }

  close(): void {
    this.conn.close();
  }
}

export const notBefore = (ms: number) => timestampFromMs(ms);

export interface ItemDbRow {
  id: string;
  tenant_key: string;
  engine_kind: string;
  parent_work_item_id: string | null;
  status: string;
  priority: number | null;
  agent_id: string | null;
  leased_by: string | null;
  lease_token: string | null;
  dispatched_at: string | null;
  completed_at: string | null;
  lease_expires_at: string | null;
  next_attempt_at: string | null;
  retry_count: number | null;
  max_retries: number | null;
  redelivery_count: number;
  max_redeliveries: number;
  error: string | null;
  result: unknown;
  idempotency_key: string | null;
  updatedby: string | null;
  updatedon: Date | null;
}

/** Rows of the queue table, read on a connection of their own (int8 columns come back as text). */
export async function itemRows(db: TestDb, where = "true", values: unknown[] = []): Promise<ItemDbRow[]> {
  return db.raw<ItemDbRow & Record<string, unknown>>(
    `SELECT * FROM ${db.tables.qualified("work_item")} WHERE ${where} ORDER BY priority, createdon, id`,
    values,
  );
}

export async function itemRow(db: TestDb, id: string): Promise<ItemDbRow> {
  const [row] = await itemRows(db, "id = $1", [id]);
  if (!row) throw new Error(`no work item ${id}`);
  return row;
}

/** Counts of a tenant's items by status (statuses without items are absent). */
export async function statusCounts(db: TestDb, tenant: string): Promise<Record<string, number>> {
  const rows = await db.raw<{ status: string; n: number }>(
    `SELECT status, count(*)::int AS n FROM ${db.tables.qualified("work_item")} WHERE tenant_key = $1 GROUP BY status`,
    [tenant],
  );
  return Object.fromEntries(rows.map((r) => [r.status, r.n]));
}

export async function countItems(db: TestDb): Promise<number> {
  const [row] = await db.raw<{ n: number }>(`SELECT count(*)::int AS n FROM ${db.tables.qualified("work_item")}`);
  return row!.n;
}

/** Epoch ms as the epoch-ns text Postgres returns for the bigint columns. */
export const nsText = (ms: number) => String(BigInt(ms) * 1_000_000n);

/** How queue statements begin (pg_stat_activity keeps only the first 1 KiB of a statement). */
export const STATEMENT = {
  /** The claim. */
  claim: "WITH agent AS",
  /** Reads of items by id (Wait). */
  select: "SELECT id, tenant_key, engine_id",
  /** Enqueue's insert (its rows come from a CTE). */
  insert: "WITH v AS",
} as const;

const activity = (db: TestDb, startsWith: string, extra: string, values: unknown[]) =>
  db.raw<{ n: number }>(
    `SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE ltrim(query, E' \n\t') LIKE $1 AND query LIKE $2 AND ${extra}`,
    [`${startsWith}%`, `%${db.schema}%`, ...values],
  );

/**
 * Resolves once a statement on this schema that starts with `startsWith` has run to completion on
 * some connection after `sinceServerTime` (a clock_timestamp() read from the server): how a test
 * knows that a long-poll did its first look at the table and is now waiting, without sleeping.
 */
export function untilStatementRan(db: TestDb, startsWith: string, sinceServerTime: Date, timeoutMs = 10_000): Promise<void> {
  return until(
    `a statement '${startsWith}…' ran`,
    async () => (await activity(db, startsWith, "state = 'idle' AND query_start >= $3", [sinceServerTime]))[0]!.n > 0,
    timeoutMs,
  );
}

/**
 * Resolves once at least `n` statements on this schema that start with `startsWith` are blocked on a
 * lock: how a test knows that racing statements have taken their snapshots and queue on a row.
 */
export function untilLockWait(db: TestDb, startsWith: string, n = 1, timeoutMs = 10_000): Promise<void> {
  return until(
    `${n} statement(s) '${startsWith}…' wait for a lock`,
    async () => (await activity(db, startsWith, "wait_event_type = 'Lock'", []))[0]!.n >= n,
    timeoutMs,
  );
}

export async function serverNow(db: TestDb): Promise<Date> {
  const [row] = await db.raw<{ t: Date }>(`SELECT clock_timestamp() AS t`);
  return row!.t;
}

/** Observes a promise: whether it settled yet. */
export function track<T>(p: Promise<T>): { promise: Promise<T>; settled: () => boolean } {
  let settled = false;
  const promise = p.finally(() => (settled = true));
  return { promise, settled: () => settled };
}
