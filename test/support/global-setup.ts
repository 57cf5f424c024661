/**
 * Vitest global setup: gives every test file a Postgres. DATABASE_URL, when set, names one to use;
 * otherwise an embedded Postgres is started in a fresh temp dir on a free port for this run.
 * Test files read the URL with databaseUrl() from ./database-url.ts. TEST_LOG_LEVEL (default "warn")
 * sets how much of the embedded server's log reaches stderr.
 *
 * It is the root's global setup in vitest.config.ts: it runs once per run, whichever tiers run, and
 * each tier's files see the one URL. The slow tier's own setup (build-setup.ts) builds dist/.
 */
import { pino } from "pino";
import type { TestProject } from "vitest/node";
import { startEmbeddedPostgres } from "../../src/db/embedded.js";
import { freePort } from "./free-port.js";
import { makeTempDir, removeTempDir } from "./temp-dir.js";

declare module "vitest" {
  export interface ProvidedContext {
    databaseUrl: string;
  }
}

export default async function setup(project: TestProject): Promise<(() => Promise<void>) | undefined> {
  const given = process.env.DATABASE_URL;
  if (given) {
    project.provide("databaseUrl", given);
    return undefined;
  }
  const dir = await makeTempDir("aiflowd-test-pg");
  const log = pino({ level: process.env.TEST_LOG_LEVEL ?? "warn" }, pino.destination(2));
  try {
    const server = await startEmbeddedPostgres({ dataDir: `${dir}/pg`, port: await freePort(), log });
    project.provide("databaseUrl", server.url);
    // Vitest forks its workers after global setup with a copy of process.env, so code under test that
    // reads DATABASE_URL itself sees the same server.
    process.env.DATABASE_URL = server.url;
    return async () => {
      await server.stop();
      await removeTempDir(dir);
    };
  } catch (err) {
    await removeTempDir(dir);
    throw err;
  }
}
