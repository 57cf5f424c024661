/**
 * The settings table: every setting's flag, AIFLOW_* environment variables, default, help line and
 * parser, by area (one file each beside this one), in the order `aiflowd --help` prints them.
 * ../config.ts reads argv and the environment through it; scripts/config-doc.ts prints
 * docs/configuration.md from AREAS.
 */
import { SERVING_SETTINGS } from "./serving.js";
import { DATABASE_SETTINGS } from "./database.js";
import { INSTANCE_SETTINGS } from "./instance.js";
import { QUEUE_SETTINGS } from "./queue.js";
import { ENGINES_SETTINGS } from "./engines.js";
import { INTAKE_SETTINGS } from "./intake.js";
import { LIMITS_SETTINGS } from "./limits.js";
import type { Setting } from "./parsers.js";

export type { Setting } from "./parsers.js";

/** An area of the table: its name (a docs heading), what it covers, and its settings in --help's order. */
export interface SettingsArea {
  name: string;
  about: string;
  settings: Record<string, Setting<unknown>>;
}

/** The areas, in the order `aiflowd --help` prints them. */
export const AREAS: readonly SettingsArea[] = [
  {
    name: "Serving",
    about: "Where the daemon serves: its gRPC and HTTP addresses, /metrics and the web console, and transport security (TLS, mutual TLS, or plaintext).",
    settings: SERVING_SETTINGS,
  },
  {
    name: "Database",
    about: "The database: its URL or the embedded Postgres, the schema and table prefix, the pool and the wait for it at start.",
    settings: DATABASE_SETTINGS,
  },
  {
    name: "Instance",
    about: "This instance: who may call it (tokens), where it audits and logs, its id, the tenants it serves, and its shutdown.",
    settings: INSTANCE_SETTINGS,
  },
  {
    name: "Queue",
    about: "The work queue and the fleet: heartbeats and liveness, leases, claims, retries and backoff, wake-ups, affinity, placement, fair share and aging.",
    settings: QUEUE_SETTINGS,
  },
  { name: "Engines", about: "The engines: DAG definitions' bounds and how much of a run's history is kept.", settings: ENGINES_SETTINGS },
  {
    name: "Intake",
    about: "What enters the queue from callers and triggers: enqueue quotas, the triggers file, webhooks, cron catch-up and firings kept.",
    settings: INTAKE_SETTINGS,
  },
  {
    name: "Limits",
    about: "Limits against hostile or broken callers: connections, HTTP/2 and request bounds, bytes in flight, authentication failures, health watches.",
    settings: LIMITS_SETTINGS,
  },
];

export const SETTINGS = {
  ...SERVING_SETTINGS,
  ...DATABASE_SETTINGS,
  ...INSTANCE_SETTINGS,
  ...QUEUE_SETTINGS,
  ...ENGINES_SETTINGS,
  ...INTAKE_SETTINGS,
  ...LIMITS_SETTINGS,
};
