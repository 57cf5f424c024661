/**
 * Starts real daemon instances for end-to-end tests: real HTTP/2 on a loopback port, real Postgres,
 * in a schema of the test's own.
 */
import { defaultConfig, type Config } from "../../src/config.js";
import { startDaemon, type Daemon } from "../../src/daemon.js";
import type { Clock } from "../../src/clock.js";
import { silentLogger, type Logger } from "../../src/log.js";
import { parseTokenSpec } from "../../src/domain/tokens.js";
import { databaseUrl } from "./database-url.js";

export const TOKENS = {
  agent: "agent-token-123",
  engine: "engine-token-123",
  ops: "ops-token-1234",
  /** An engine token limited to tenant "t1". */
  engineT1: "engine-t1-token",
  /** Two callers of DagService, and one limited to tenant "t1". */
  runs: "runs-token-1234",
  runs2: "runs-token-5678",
  runsT1: "runs-t1-token",
} as const;

export const testTokens = () => [
  parseTokenSpec(`agent:${TOKENS.agent}`, "test"),
  parseTokenSpec(`engine:${TOKENS.engine}`, "test"),
  parseTokenSpec(`ops:${TOKENS.ops}`, "test"),
  parseTokenSpec(`engine:${TOKENS.engineT1}:t1`, "test"),
  parseTokenSpec(`runs:${TOKENS.runs}`, "test"),
  parseTokenSpec(`runs:${TOKENS.runs2}`, "test"),
  parseTokenSpec(`runs:${TOKENS.runsT1}:t1`, "test"),
];

export interface TestDaemonOptions {
  schema: string;
  prefix?: string;
  clock?: Clock;
  log?: Logger;
  config?: Partial<Config>;
}

export async function startTestDaemon(opts: TestDaemonOptions): Promise<Daemon> {
  const config = defaultConfig({
    databaseUrl: databaseUrl(),
    schema: opts.schema,
    tablePrefix: opts.prefix ?? "aiflow_",
    listen: { host: "127.0.0.1", port: 0 },
    tokens: testTokens(),
    shutdownGrace: 2_000,
    ...opts.config,
  });
  return startDaemon(config, { log: opts.log ?? silentLogger(), clock: opts.clock });
}

export const bearer = (token: string) => ({ authorization: `Bearer ${token}` });
