/** Types of renewals.js (plain JavaScript so the heartbeat thread loads it without a TypeScript loader). */
import type { Code } from "@connectrpc/connect";
import type { FromThread, Lease } from "./protocol.js";

export declare const TRANSIENT: ReadonlySet<Code>;
export declare const MAX_BATCH: number;

export interface Outcome {
  workItemId: string;
  ok: boolean;
  message: string;
}

/** One daemon: its address (for reports) and its AgentService.ExtendLease. */
export interface Daemon {
  address: string;
  extendLease(leases: { workItemId: string; leaseToken: string }[], timeoutMs: number): Promise<Outcome[]>;
}

export declare class Renewals {
  constructor(daemons: readonly Daemon[], rpcTimeoutMs: number, post: (message: FromThread) => void);
  hold(leases: readonly Lease[]): void;
  drop(leases: readonly Lease[]): void;
  renewEvery(ttlMs: number, addressIndex: number): void;
}
