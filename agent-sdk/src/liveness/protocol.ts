/** Messages between the agent and its heartbeat thread (thread.js). */

/** What the thread is spawned with (its workerData). */
export interface ThreadInit {
  name: string;
  /** Base URLs of the daemons, in failover order. */
  baseUrls: string[];
  token: string | undefined;
  rpcTimeoutMs: number;
  mounts: string[];
  /** A google.protobuf.FileDescriptorSet holding agent.proto and its imports, so the thread needs no generated code. */
  descriptorSet: Uint8Array;
  /**
   * One Int32 the agent keeps its in-flight count in. Shared memory, not messages: the count changes
   * twice per item, and a message each time woke the thread thousands of times a second.
   */
  inFlight: SharedArrayBuffer;
}

export type ToThread =
  /** Registered: beat now, then every `intervalMs`, first to the daemon at `addressIndex`. */
  | { type: "start"; intervalMs: number; addressIndex: number }
  /** A registration brought a new interval. */
  | { type: "interval"; ms: number };

export type FromThread =
  /** Loaded and measured once: it can beat the moment it is told to start. */
  | { type: "ready" }
  /** A HeartbeatResponse, binary-encoded. */
  | { type: "reply"; bytes: Uint8Array }
  /** A heartbeat failed; `code` is the gRPC code. The thread moves on to the next address when it is transient. */
  | { type: "failed"; code: number; message: string; address: string };
