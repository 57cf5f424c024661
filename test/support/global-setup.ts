/**
 * Vitest global setup: gives every test file a Postgres. DATABASE_URL, when set, names one to use;
 * otherwise an embedded Postgres is started in a fresh temp dir on a free port for this run.
 * Test files read the URL with databaseUrl() from ./database-url.ts. TEST_LOG_LEVEL (default "warn")
 * sets how much of the embedded server's log reaches stderr.
 *
 * It first builds the daemon (scripts/build.mjs daemon, incremental), because the tests that run
 * `bin/aiflowd.js` and `bin/aiflowctl.js` as operators do run the compiled JavaScript — but only when
 * dist/ is not the build of the sources as they are now (dist/.build-stamp, scripts/build-stamp.mjs):
 * a build with nothing to do still takes several seconds, and most runs change no source.
 */
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { pino } from "pino";
import { isCurrent } from "../../scripts/build-stamp.mjs";
import type { TestProject } from "vitest/node";
import { startEmbeddedPostgres } from "../../src/db/embedded.js";
import { freePort } from "./free-port.js";
import { makeTempDir, removeTempDir } from "./temp-dir.js";

declare module "vitest" {
  export interface ProvidedContext {
    databaseUrl: string;
  }
}

const ROOT = fileURLToPath(new URL("../..", import.meta.url));

/** Builds dist/ unless it is current. */
function buildDaemon(): void {
  if (isCurrent(ROOT, `${ROOT}dist`)) return;
  try {
    execFileSync(process.execPath, [`${ROOT}scripts/build.mjs`, "daemon"], { stdio: ["ignore", "ignore", "inherit"] });
  } catch {
    // tsc still emits what it can; the type errors it printed fail `npm run typecheck` (and CI).
    // Such a build leaves no stamp, so the next run builds again.
    process.stderr.write("global setup: the daemon's build reported errors (above); tests run what it emitted\n");
  }
}

export default async function setup(project: TestProject): Promise<(() => Promise<void>) | undefined> {
  buildDaemon();
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
