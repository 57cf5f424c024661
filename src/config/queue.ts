/**
 * The work queue and the fleet: heartbeats and liveness, leases, claims, retries and backoff,
 * wake-ups, affinity, placement, fair share and aging.
 */
import { DEFAULT_CREDIT } from "../domain/fair-share.js";
import { int, duration, oneOf, tenantWeights, type Setting } from "./parsers.js";

export const QUEUE_SETTINGS = {
  heartbeatInterval: { flag: "--heartbeat-interval", env: ["AIFLOW_HEARTBEAT_INTERVAL"], default: "5s", help: "interval agents are told to heartbeat at", parse: duration(100) },
  livenessIntervals: {
    flag: "--liveness-intervals",
    env: ["AIFLOW_LIVENESS_INTERVALS"],
    default: "3",
    help: "heartbeat intervals an agent may miss before it is marked inactive",
    parse: int(1, 1000),
  },
  heartbeatFlush: { flag: "--heartbeat-flush", env: ["AIFLOW_HEARTBEAT_FLUSH"], default: "1s", help: "how often coalesced heartbeats are written (one statement each)", parse: duration(10) },
  leaseTtl: { flag: "--lease-ttl", env: ["AIFLOW_LEASE_TTL"], default: "30s", help: "lease length of a claimed work item", parse: duration(100) },
  sweepInterval: { flag: "--sweep-interval", env: ["AIFLOW_SWEEP_INTERVAL"], default: "1s", help: "how often liveness and lease-expiry sweeps run", parse: duration(10) },
  metadataMaxBytes: { flag: "--metadata-max-bytes", env: ["AIFLOW_METADATA_MAX_BYTES"], default: "65536", help: "largest agent metadata accepted", parse: int(1024) },
  payloadMaxBytes: { flag: "--payload-max-bytes", env: ["AIFLOW_PAYLOAD_MAX_BYTES"], default: "1048576", help: "largest work item payload accepted", parse: int(1024) },
  claimMaxItems: { flag: "--claim-max-items", env: ["AIFLOW_CLAIM_MAX_ITEMS"], default: "256", help: "claims asking for more items are clamped to this", parse: int(1, 10_000) },
  claimMaxWait: { flag: "--claim-max-wait", env: ["AIFLOW_CLAIM_MAX_WAIT"], default: "30s", help: "longest a claim long-poll may wait", parse: duration(0) },
  claimMaxWaitingPerAgent: {
    flag: "--claim-max-waiting-per-agent",
    env: ["AIFLOW_CLAIM_MAX_WAITING_PER_AGENT"],
    // The SDK holds one or two waiting claims per agent; more is a loop that never waits for its answers.
    default: "8",
    help: "waiting (long-poll) claims one agent may hold on this daemon; more are RESOURCE_EXHAUSTED",
    parse: int(1, 100_000),
  },
  claimMaxWaitingPerToken: {
    flag: "--claim-max-waiting-per-token",
    env: ["AIFLOW_CLAIM_MAX_WAITING_PER_TOKEN"],
    default: "1000",
    help: "waiting (long-poll) claims all agents of one token may hold on this daemon; more are RESOURCE_EXHAUSTED",
    parse: int(1, 1_000_000),
  },
  maxRedeliveries: {
    flag: "--max-redeliveries",
    env: ["AIFLOW_MAX_REDELIVERIES"],
    default: "3",
    help: "times an item goes back to the queue after a lost lease (its agent died, hung, was cut off or went inactive) before it fails, unless its Enqueue says; lost leases spend none of max_retries",
    parse: int(0, 1000),
  },
  backoffBase: { flag: "--backoff-base", env: ["AIFLOW_BACKOFF_BASE"], default: "1s", help: "retry backoff base (full jitter: rand(0, min(cap, base*2^retry)))", parse: duration(0) },
  grpcFastPath: {
    flag: "--grpc-fast-path",
    env: ["AIFLOW_GRPC_FAST_PATH"],
    default: "on",
    help: "on: plain gRPC unary calls and bidirectional streams (the agent stream) are served straight from the HTTP/2 stream (wire/src/server/unary-fast-path.ts, bidi-fast-path.ts); off: connect-node serves every call",
    parse: oneOf(["on", "off"]),
  },
  backoffJitter: { flag: "--backoff-jitter", env: ["AIFLOW_BACKOFF_JITTER"], default: "full", help: "full (random in [0, bound]) or none (exactly the bound)", parse: oneOf(["full", "none"]) },
  enqueueWindow: {
    flag: "--enqueue-window",
    env: ["AIFLOW_ENQUEUE_WINDOW"],
    default: "8ms",
    help: "under sustained Enqueue load, insert statements start at most once per window (fewer, larger inserts); 0: each starts when the last returns",
    // Every Enqueue under load may wait this long: a second is far past any use.
    parse: duration(0, 1000),
  },
  notifyWindow: { flag: "--notify-window", env: ["AIFLOW_NOTIFY_WINDOW"], default: "5ms", help: "enqueues within this window share one NOTIFY to other daemons", parse: duration(0) },
  doneNotifyWindow: {
    flag: "--done-notify-window",
    env: ["AIFLOW_DONE_NOTIFY_WINDOW"],
    default: "50ms",
    help: "completions within this window share one NOTIFY (it wakes Wait calls on other daemons)",
    parse: duration(0),
  },
  backoffCap: { flag: "--backoff-cap", env: ["AIFLOW_BACKOFF_CAP"], default: "5m", help: "retry backoff cap", parse: duration(0) },
  affinityPolicy: {
    flag: "--affinity-policy",
    env: ["AIFLOW_AFFINITY_POLICY"],
    default: "rebind",
    help: "when a key's agent cannot take work: hold (its items wait, then fail after the grace) or rebind (the key moves after the grace)",
    parse: oneOf(["hold", "rebind"]),
  },
  affinityGrace: { flag: "--affinity-grace", env: ["AIFLOW_AFFINITY_GRACE"], default: "60s", help: "how long a key waits for its agent before the policy acts", parse: duration(0) },
  unplaceableGrace: {
    flag: "--unplaceable-grace",
    env: ["AIFLOW_UNPLACEABLE_GRACE"],
    default: "0s",
    help: "a pending item no registered agent could ever run (its requirements fit no capacity) becomes a dead letter after this long; 0: it waits",
    parse: duration(0),
  },
  // Fair share and aging (src/domain/fair-share.ts).
  tenantWeights: {
    flag: "--tenant-weights",
    env: ["AIFLOW_TENANT_WEIGHTS"],
    default: "",
    help: "tenants' fair-share weights, tenant=weight[,tenant=weight…] (default 1; an operator's weight set by aiflowctl wins)",
    parse: tenantWeights,
  },
  fairShareCredit: { flag: "--fair-share-credit", env: ["AIFLOW_FAIR_SHARE_CREDIT"], default: String(DEFAULT_CREDIT), help: "items' worth of turns an idle tenant may bank for its next burst", parse: int(0, 1_000_000) },
  priorityAging: { flag: "--priority-aging", env: ["AIFLOW_PRIORITY_AGING"], default: "0s", help: "waiting this long is worth one priority level inside a tenant; 0: priority is strict", parse: duration(0) },
  affinityIdle: { flag: "--affinity-idle", env: ["AIFLOW_AFFINITY_IDLE"], default: "1h", help: "a binding whose key has had no unfinished item for this long is removed", parse: duration(0) },
} satisfies Record<string, Setting<unknown>>;
