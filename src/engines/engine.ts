/**
 * What an engine is to the rest of the daemon: the one interface the trigger firer, the advance loop
 * and the composition root call, whatever the engine. The DAG, graph and state-machine engines
 * (./dag/, ./graph/, ./machine/) each implement it on the one substrate of this folder:
 *  - ./run-transaction.ts: one transaction per change of a run, under its row's lock, that writes the
 *    run, its directory row and its work items together and tells watchers at commit;
 *  - ./advancer.ts: one loop that applies every engine's events (aiflow_engine_event, written by one
 *    item-ended trigger, migration 0017) to its runs;
 *  - ./run-watch.ts: one set of watchers, on one NOTIFY channel.
 * The next engine is a folder that implements Engine, its entry in src/domain/engine-kinds.ts, its
 * line in ./engines.ts and its service; nothing here branches on the kind.
 */
import type { EngineKind } from "../domain/engine-kinds.js";
import type { EngineEvent, RunTable } from "../store/engine-events.js";
import type { Cause, RunHooks, Scope } from "./deps.js";
import type { RunTx } from "./run-transaction.js";

export type { Cause, EngineDeps, RunHooks, Scope } from "./deps.js";

export interface Engine {
  readonly kind: EngineKind;
  /** Its run table: an advance locks the run's row there, as every call that changes the run does. */
  readonly runTable: RunTable;
  /** Starts a run of the tenant's stored definition (NOT_FOUND when there is none); returns its run id. */
  startStored(scope: Scope, definitionId: string, context: Record<string, unknown>, cause: Cause, hooks: RunHooks): Promise<string>;
  /** Delivers `event` to one of the scope's runs (FAILED_PRECONDITION from an engine whose runs take none). */
  signal(scope: Scope, runId: string, event: string, payload: unknown, hooks: RunHooks): Promise<unknown>;
  /** Applies a locked run's due events, oldest first, in the advance's transaction. */
  advance(w: RunTx, runId: string, events: readonly EngineEvent[]): Promise<void>;
}
