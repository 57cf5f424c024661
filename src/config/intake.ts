/**
 * What enters the queue from callers and triggers: enqueue quotas, the triggers file, webhooks,
 * cron catch-up and firings kept.
 */
import { text, int, duration, type Setting } from "./parsers.js";

export const INTAKE_SETTINGS = {
  // Quotas on what callers queue (src/queue/enqueue-quota.ts).
  maxItemsPerCall: {
    flag: "--max-items-per-call",
    env: ["AIFLOW_MAX_ITEMS_PER_CALL"],
    default: "10000",
    help: "most work items one call queues: an Enqueue's items, a DAG fan-out node's iterations, all a run's start or signal queues; more is RESOURCE_EXHAUSTED (a fan-out an engine reaches on its own fails its node)",
    parse: int(1, 1_000_000),
  },
  maxEnqueueRate: {
    flag: "--max-enqueue-rate",
    env: ["AIFLOW_MAX_ENQUEUE_RATE"],
    default: "100000",
    help: "work items one tenant may queue a second on this daemon (a bucket holding a second's worth); calls past it are RESOURCE_EXHAUSTED, engine advances are charged; 0: no limit",
    parse: int(0, 100_000_000),
  },
  triggersFile: {
    flag: "--triggers-file",
    env: ["AIFLOW_TRIGGERS_FILE"],
    default: undefined,
    help: "JSON file of webhook and cron triggers, put at each start (the file's triggers it no longer names are deleted)",
    parse: text,
  },
  webhookMaxBytes: {
    flag: "--webhook-max-bytes",
    env: ["AIFLOW_WEBHOOK_MAX_BYTES"],
    default: "1048576",
    help: "largest webhook body accepted; a larger one is refused (413) and not kept",
    parse: int(1024, 64 * 1024 * 1024),
  },
  cronCatchUp: {
    flag: "--cron-catch-up",
    env: ["AIFLOW_CRON_CATCH_UP"],
    default: "1h",
    help: "a cron tick missed while no daemon ran still fires when it is at most this old",
    parse: duration(0),
  },
  firingRetention: {
    flag: "--firing-retention-days",
    env: ["AIFLOW_FIRING_RETENTION_DAYS"],
    default: "30",
    help: "days trigger firings are kept (payloads may hold senders' secrets)",
    parse: int(1, 36500),
  },
} satisfies Record<string, Setting<unknown>>;
