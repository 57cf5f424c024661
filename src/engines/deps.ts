/**
 * What every engine is built from, and what its calls name: whose run (Scope), what started it
 * (Cause), what a trigger adds to its transaction (RunHooks). The Engine interface is ./engine.ts's.
 */
import type { DatabasePool, DatabaseTransactionConnection } from "slonik";
import type { AuditLog } from "../audit.js";
import type { Clock } from "../clock.js";
import type { Config } from "../config.js";
import type { PgListener } from "../db/notify.js";
import type { Tables } from "../db/tables.js";
import type { Logger } from "../log.js";
import type { EngineEvents } from "../observability/metrics.js";
import type { WorkQueue } from "../queue/work-queue.js";
import type { WorkItemStore } from "../store/work-items.js";

/** What every engine is built from. */
export interface EngineDeps {
  pool: DatabasePool;
  tables: Tables;
  config: Config;
  clock: Clock;
  log: Logger;
  queue: WorkQueue;
  listener: PgListener;
  audit: AuditLog;
  /** The queue's statements on a transaction (no prepared statements: they run on the pool's connections). */
  itemsOn: (db: DatabaseTransactionConnection) => WorkItemStore;
  metrics: EngineEvents;
}

/** Whose runs a call may touch: the caller's, in the tenant it names. */
export interface Scope {
  by: string;
  tenantKey: string;
}

/** The trigger firing that started a run. */
export interface Cause {
  trigger: string;
  firingId: string;
}

/**
 * What a caller other than the engine's own service adds to a run's transaction (a trigger's
 * firing): `guard` runs first (under the run's lock for a change) and may throw to write nothing;
 * `record` runs after the run and its directory row are saved, before the commit.
 */
export interface RunHooks {
  guard?: (tx: DatabaseTransactionConnection) => Promise<void>;
  record?: (tx: DatabaseTransactionConnection, run: { id: string }) => Promise<void>;
}
