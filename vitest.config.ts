import { availableParallelism } from "node:os";
import { configDefaults, defineConfig } from "vitest/config";
import { ALL_TESTS, SLOW } from "./test/tiers.js";

/**
 * Two tiers (test/tiers.ts says which file is in which, and why): `npm test` runs the fast one
 * (`--project fast`), `npm run test:slow` the slow one, and `npx vitest run FILE…` whichever a file
 * is in. Each test file gets its own migrated schema, so files run in parallel safely.
 */
const common = {
  fileParallelism: true,
  testTimeout: 30_000,
  hookTimeout: 60_000,
};

export default defineConfig({
  test: {
    // The root's setup runs once per run, whichever tiers run: one Postgres for every file.
    globalSetup: ["test/support/global-setup.ts"],
    projects: [
      {
        test: {
          ...common,
          name: "fast",
          include: ALL_TESTS,
          exclude: [...configDefaults.exclude, ...Object.keys(SLOW)],
          // A worker runs file after file: what Node loaded from node_modules stays loaded, which
          // halves the tier's CPU time, and fresh-modules.ts evaluates the repository's own modules
          // afresh for each file. Each file has its own schema, daemons and clock, and closes what
          // it opened; files that start processes are in the slow tier (tiers.test.ts).
          isolate: false,
          setupFiles: ["test/support/fresh-modules.ts"],
          // Its files mostly wait (on Postgres, sockets, timers): more of them at once than cores.
          maxWorkers: Math.max(3, availableParallelism() - 1),
        },
      },
      {
        test: {
          ...common,
          name: "slow",
          include: Object.keys(SLOW),
          // Its files run bin/aiflowd.js and bin/aiflowctl.js, which run dist/: built when stale.
          globalSetup: ["test/support/build-setup.ts"],
        },
      },
    ],
  },
});
