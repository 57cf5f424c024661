/**
 * This instance: who may call it (tokens), where it audits and logs, its id, the tenants it serves,
 * and its shutdown.
 */
import { parseTokenSpec } from "../domain/tokens.js";
import { text, duration, level, list, type Setting } from "./parsers.js";

export const INSTANCE_SETTINGS = {
  tokens: {
    flag: "--token",
    env: ["AIFLOW_TOKENS"],
    default: undefined,
    help: "bearer token grant ROLE:TOKEN[:TENANT,...] (role agent|engine|ops|runs); repeatable; env separates by ';'",
    parse: parseTokenSpec,
    repeatable: true,
  },
  tokensFile: {
    flag: "--tokens-file",
    env: ["AIFLOW_TOKENS_FILE"],
    default: undefined,
    help: 'JSON file: [{"role","token","tenants"?,"name"?,"agents"?}]',
    parse: text,
  },
  auditLog: {
    flag: "--audit-log",
    env: ["AIFLOW_AUDIT_LOG"],
    default: undefined,
    help: "file the audit stream is appended to (JSON lines); default: the daemon's log",
    parse: text,
  },
  logLevel: { flag: "--log-level", env: ["AIFLOW_LOG_LEVEL"], default: "info", help: "trace|debug|info|warn|error|fatal|silent", parse: level },
  instanceId: {
    flag: "--instance-id",
    env: ["AIFLOW_INSTANCE_ID"],
    default: undefined,
    help: "stable id of this daemon instance (aiflow_engine.engineid); default HOSTNAME:PORT",
    parse: text,
  },
  tenants: { flag: "--tenants", env: ["AIFLOW_TENANTS"], default: "default", help: "comma-separated tenant keys this instance serves", parse: list },
  shutdownGrace: {
    flag: "--shutdown-grace",
    env: ["AIFLOW_SHUTDOWN_GRACE"],
    default: "10s",
    help: "time in-flight calls get to finish on SIGTERM/SIGINT",
    parse: duration(0),
  },
} satisfies Record<string, Setting<unknown>>;
