/**
 * Fixture for the affinity tests: the daemon of an affinity-*.test.ts file with its policy, items
 * that name an affinity key, raw readers of the binding table, and a lock held on a binding row from
 * a connection of the test's own (to line up racing claims deterministically, with untilLockWait
 * from queue.ts).
 */
import pg from "pg";
import { beforeAll } from "vitest";
import { FakeClock } from "../../src/clock.js";
import type { Config } from "../../src/config.js";
import type { Daemon } from "../../src/daemon.js";
import type { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import type { TestDb } from "./db.js";
import { useTestDaemon, type Closers, type Session } from "./kit.js";
import { opsSession, OpsTestAgent, sorted, type AgentOptions, type ItemInit, type WorkItem } from "./ops.js";
import { itemRow, Producer } from "./queue.js";

export const GRACE = 60_000;
export const IDLE = 600_000;
/** Backoff of an item an agent gave back by leaving: exactly base × 2^retries (no jitter). */
export const BACKOFF = 1_000;

const config = (instanceId: string, policy: "hold" | "rebind"): Partial<Config> => ({
  instanceId,
  sweepInterval: 3_600_000,
  heartbeatFlush: 3_600_000,
  heartbeatInterval: 86_400_000,
  leaseTtl: 86_400_000,
  affinityPolicy: policy,
  affinityGrace: GRACE,
  affinityIdle: IDLE,
  backoffJitter: "none",
  backoffBase: BACKOFF,
});

/**
 * A daemon running one affinity policy with its grace, on a schema of the file's own, with a fake
 * clock that only moves when a test moves it. Nothing runs on a timer (the tests call
 * maintenance.runOnce()); agents never miss a heartbeat and leases never run out while the clock moves.
 */
export interface AffinityEnv {
  readonly db: TestDb;
  readonly daemon: Daemon;
  readonly clock: FakeClock;
  readonly ops: Session<typeof OpsService>;
  readonly producer: Producer;
  readonly closers: Closers;
}

export function useAffinityDaemon(label: string, policy: "hold" | "rebind"): AffinityEnv {
  const clock = new FakeClock(Date.UTC(2026, 4, 1));
  const fx = useTestDaemon({ label, clock, config: config(`aff-${policy}`, policy) });
  let clients: { ops: Session<typeof OpsService>; producer: Producer } | undefined;
  beforeAll(() => {
    clients = { ops: fx.closers.add(opsSession(fx.address)), producer: fx.closers.add(new Producer(fx.address)) };
  });
  const made = () => {
    if (!clients) throw new Error("the clients are made in beforeAll");
    return clients;
  };
  return {
    get db() {
      return fx.db;
    },
    get daemon() {
      return fx.daemon;
    },
    clock,
    get ops() {
      return made().ops;
    },
    get producer() {
      return made().producer;
    },
    closers: fx.closers,
  };
}

/** A registered agent (engine kind "k" unless told), closed after the file's tests. */
export const agent = async (e: AffinityEnv, name: string, opts: Partial<AgentOptions> & { tenants: string[] }) =>
  e.closers.add(await OpsTestAgent.register(e.daemon.address, name, { engineKinds: ["k"], ...opts }));
export const deregister = (a: OpsTestAgent) => a.s.client.deregister({ name: a.name }, a.s.call);
export const enqueue = (e: AffinityEnv, tenant: string, items: ItemInit[]) => e.producer.ids(tenant, items);
/** Ids of items, sorted. */
export const ids = (items: readonly WorkItem[]) => sorted(items.map((i) => i.id));
/** The keys GetAgent lists for an agent. */
export const keysOf = async (e: AffinityEnv, name: string) => (await e.ops.client.getAgent({ name }, e.ops.call)).affinityKeys;
export const statuses = async (e: AffinityEnv, itemIds: readonly string[]) => Promise.all(itemIds.map(async (id) => (await itemRow(e.db, id)).status));
export const at = (ms: number) => new Date(ms);

export interface BindingDbRow {
  id: string;
  tenant_key: string;
  affinity_key: string;
  agent_id: string;
  createdby: string;
  createdon: Date;
  updatedby: string | null;
  updatedon: Date | null;
}

/** Binding rows, ordered by createdon (the spec's order), read on a connection of their own. */
export async function bindingRows(db: TestDb, where = "true", values: unknown[] = []): Promise<BindingDbRow[]> {
  return db.raw<BindingDbRow & Record<string, unknown>>(
    `SELECT id, tenant_key, affinity_key, agent_id, createdby, createdon, updatedby, updatedon FROM ${db.tables.qualified("affinity_binding")}
      WHERE ${where} ORDER BY createdon, id`,
    values,
  );
}

/** The binding of one key, or undefined; fails when a key somehow has two rows. */
export async function bindingOf(db: TestDb, key: string): Promise<BindingDbRow | undefined> {
  const rows = await bindingRows(db, "affinity_key = $1", [key]);
  if (rows.length > 1) throw new Error(`key ${key} has ${rows.length} binding rows`);
  return rows[0];
}

export interface ItemExtra {
  selector?: Record<string, string>;
  priority?: number;
}

/** An item of engine kind `kind` naming `key` (retries left, so an agent leaving puts it back). */
export const keyed = (kind: string, key: string, extra: ItemExtra = {}): ItemInit => ({
  engineKind: kind,
  maxRetries: 5,
  priority: extra.priority ?? 0,
  workerParams: { selector: extra.selector ?? {}, affinityKey: key },
});

/** An item without a key. */
export const plain = (kind: string, extra: ItemExtra = {}): ItemInit => ({
  engineKind: kind,
  maxRetries: 5,
  priority: extra.priority ?? 0,
  workerParams: extra.selector ? { selector: extra.selector } : undefined,
});

/** A transaction holding a binding row's lock (SELECT … FOR UPDATE) until released. */
export interface HeldLock {
  release(): Promise<void>;
}

export async function lockBinding(db: TestDb, key: string): Promise<HeldLock> {
  const c = new pg.Client({ connectionString: db.url });
  await c.connect();
  try {
    await c.query("BEGIN");
    const res = await c.query(`SELECT id FROM ${db.tables.qualified("affinity_binding")} WHERE affinity_key = $1 FOR UPDATE`, [key]);
    if (res.rowCount !== 1) throw new Error(`no binding row for ${key} to lock`);
  } catch (err) {
    await c.end();
    throw err;
  }
  let released = false;
  return {
    release: async () => {
      if (released) return;
      released = true;
      try {
        await c.query("ROLLBACK");
      } finally {
        await c.end();
      }
    },
  };
}

/** Reads the queue and binding tables on one connection kept open (for tests that read in a loop). */
export class Reader {
  readonly #c: pg.Client;

  private constructor(
    private readonly db: TestDb,
    c: pg.Client,
  ) {
    this.#c = c;
  }

  static async open(db: TestDb): Promise<Reader> {
    const c = new pg.Client({ connectionString: db.url });
    await c.connect();
    return new Reader(db, c);
  }

  async bindings(key: string): Promise<BindingDbRow[]> {
    const res = await this.#c.query<BindingDbRow>(
      `SELECT id, tenant_key, affinity_key, agent_id, createdby, createdon, updatedby, updatedon FROM ${this.db.tables.qualified("affinity_binding")}
        WHERE affinity_key = $1 ORDER BY createdon, id`,
      [key],
    );
    return res.rows;
  }

  /** id, status and agent of the items matching `where`. */
  async items(where: string, values: unknown[]): Promise<{ id: string; status: string; agent_id: string | null; affinity_key: string | null }[]> {
    const res = await this.#c.query<{ id: string; status: string; agent_id: string | null; affinity_key: string | null }>(
      `SELECT id, status, agent_id, affinity_key FROM ${this.db.tables.qualified("work_item")} WHERE ${where} ORDER BY priority, createdon, id`,
      values,
    );
    return res.rows;
  }

  async close(): Promise<void> {
    await this.#c.end();
  }
}
