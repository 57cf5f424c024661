/**
 * The two tiers of the test suite (vitest.config.ts makes each a project):
 *
 * - fast (`npm test`): every test file under TEST_ROOTS but those below, what a developer runs after
 *   every change. Daemons run in the test's own process; no file starts a process, so none needs
 *   dist/ and the tier builds nothing.
 * - slow (`npm run test:slow`): the files below, each with why. They run processes (the daemon or
 *   aiflowctl from dist/, agents, Python, Chromium, npm pack), kill them, or run for many seconds
 *   (bench, chaos, fuzzing, races of thousands of items, daemons restarted and waited out in real
 *   time).
 *
 * test/tiers.test.ts fails when a test file is in neither tier, when an entry here names no test
 * file, and when a fast file starts a process.
 */

/** Where test files live: `<root>/**\/*.test.ts`. */
export const TEST_ROOTS = ["test", "wire/test", "agent-sdk/test", "agent-sdk/python/test"] as const;

/** The slow tier: test files (from the repository root) and why each is slow. */
export const SLOW: Readonly<Record<string, string>> = {
  "agent-sdk/python/test/agent.test.ts": "Python agent processes",
  "agent-sdk/python/test/faults-tls.test.ts": "Python agent processes, killed",
  "agent-sdk/python/test/mixed-fleet.test.ts": "Python agent processes",
  "agent-sdk/python/test/units.test.ts": "Python's unittest",
  "agent-sdk/test/blocked-handler.test.ts": "a daemon process",
  "agent-sdk/test/daemon-restart.test.ts": "a daemon stopped past the liveness window, in real time, then started again",
  "agent-sdk/test/drain-result.test.ts": "aiflowctl processes",
  "agent-sdk/test/example.test.ts": "worker processes",
  "agent-sdk/test/failback.test.ts": "daemons stopped and started again, waited out in real time",
  "agent-sdk/test/liveness.test.ts": "a daemon process and worker processes",
  "agent-sdk/test/pack.test.ts": "npm pack, and a worker process of the packed SDK",
  "agent-sdk/test/prefetch.test.ts": "1,600 items on half-second heartbeats in real time: beside other files on a busy machine, an agent misses its window",
  "agent-sdk/test/signals.test.ts": "worker processes, signalled",
  "agent-sdk/test/stuck-stream.test.ts": "every shutdown wait given up on after rpcTimeoutMs, in real time: 15-20 s",
  "test/affinity-race.test.ts": "a race of 30 rounds on two daemons",
  "test/aiflowctl-definitions.test.ts": "aiflowctl processes",
  "test/aiflowctl-engines.test.ts": "aiflowctl processes",
  "test/aiflowctl-flags.test.ts": "aiflowctl processes",
  "test/aiflowctl-queue-stats.test.ts": "aiflowctl processes",
  "test/aiflowctl-runs.test.ts": "aiflowctl processes",
  "test/aiflowctl-triggers.test.ts": "aiflowctl processes",
  "test/aiflowctl.test.ts": "aiflowctl processes",
  "test/bench.test.ts": "the bench's smoke run: every section over h2c and TLS, in processes",
  "test/chaos-small.test.ts": "the small chaos run: processes killed, Postgres restarted",
  "test/config-cli.test.ts": "aiflowd processes",
  "test/console-mtls.test.ts": "Chromium",
  "test/console.test.ts": "Chromium",
  "test/dag-cluster.test.ts": "daemon and agent processes, a daemon killed",
  "test/demo-dag.test.ts": "the demo's processes",
  "test/dispatch-races.test.ts": "races of thousands of items on two daemons",
  "test/docs-commands.test.ts": "runs the README's and docs' runnable shell blocks: the daemon, a worker, aiflowctl",
  "test/docs-config.test.ts": "runs the built aiflowd --help, to hold the configuration page to it",
  "test/embedded.test.ts": "processes owning an embedded Postgres, killed",
  "test/fair-share-cluster.test.ts": "thousands of dispatches on two daemons",
  "test/fuzz-codec.test.ts": "fuzzing",
  "test/hostile-edge-h2-reset.test.ts": "a daemon process",
  "test/native-kill.test.ts": "daemon processes, killed",
  "test/ops-drain-selector-cli.test.ts": "aiflowctl processes",
  "test/queue-cluster-load.test.ts": "thousands of items on two daemons",
  "test/start-failure.test.ts": "aiflowd processes",
  "test/tls-config-cli.test.ts": "aiflowd processes",
  "test/tracing.test.ts": "a daemon process",
};

/** vitest's include globs for every test file. */
export const ALL_TESTS = TEST_ROOTS.map((root) => `${root}/**/*.test.ts`);
