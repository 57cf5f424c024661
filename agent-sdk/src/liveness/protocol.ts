/** Messages between the agent and its heartbeat thread (thread.js). */
import type { TlsPem, TlsSource } from "../tls.js";
import type { Metrics } from "./metrics.js";

/** What the thread is spawned with (its workerData). */
export interface ThreadInit {
  name: string;
  /** Base URLs of the daemons, in failover order. */
  baseUrls: string[];
  token: string | undefined;
  /** The agent's TLS options, and the material the agent read from them (the thread's fallback). */
  tls: { source: TlsSource; initial: TlsPem } | undefined;
  rpcTimeoutMs: number;
  /** The mounts whose disks heartbeats report, the registered disks first and in their order. */
  mounts: string[];
  /** Reported in place of what the thread measures (the agent's `heartbeatMetrics`). */
  metricsOverride: Partial<Metrics>;
  /** A google.protobuf.FileDescriptorSet holding agent.proto and its imports, so the thread needs no generated code. */
  descriptorSet: Uint8Array;
  /**
   * One Int32 the agent keeps its in-flight count in. Shared memory, not messages: the count changes
   * twice per item, and a message each time woke the thread thousands of times a second.
   */
  inFlight: SharedArrayBuffer;
}

/** A lease the agent holds: the item, and the fencing token of the dispatch it holds it under. */
export interface Lease {
  id: string;
  token: string;
}

/** A lease the daemon said is no longer held, in its words. */
export interface LostLease extends Lease {
  message: string;
}

export type ToThread =
  /** Registered: beat now, then every `intervalMs`, first to the daemon at `addressIndex`. */
  | { type: "start"; intervalMs: number; addressIndex: number }
  /** A registration brought a new interval. */
  | { type: "interval"; ms: number }
  /**
   * The thread renews the leases it holds every third of `ttlMs`, first at the daemon at
   * `addressIndex`; `ttlMs` 0 stops it (the main thread renews, or nothing does any more).
   */
  | { type: "renew"; ttlMs: number; addressIndex: number }
  /** Claimed: renew these too. One for an item already held replaces it (a newer dispatch). */
  | { type: "hold"; leases: Lease[] }
  /** No longer held (finished, given back): stop renewing these, unless the item is held under another token. */
  | { type: "drop"; leases: Lease[] };

export type FromThread =
  /** Loaded and measured once: it can beat the moment it is told to start. */
  | { type: "ready" }
  /** A HeartbeatResponse, binary-encoded. */
  | { type: "reply"; bytes: Uint8Array }
  /** A heartbeat failed; `code` is the gRPC code. The thread moves on to the next address when it is transient. */
  | { type: "failed"; code: number; message: string; address: string }
  /** A renewal round reached a daemon; `leases` were renewed. */
  | { type: "renewed"; leases: number }
  /** The daemon said these leases are no longer held: the thread stopped renewing them. */
  | { type: "lost"; leases: LostLease[] }
  /** A renewal round failed and is retried next tick (at the next daemon when `code` is transient). */
  | { type: "renewalFailed"; code: number; message: string; address: string; leases: number };
