/**
 * The CI-sized chaos run (`npm run chaos -- --small`), once with the agents in the SDK's default
 * stream mode and once with `stream: false` (unary claims): 2 daemons, 3 agents, 300 items and 10 DAG
 * runs advancing through the faults, one fault of each kind, on a Postgres of its own that it
 * restarts. The global setup has built the daemon.
 * A fixed seed, so a failure here replays with `npm run chaos -- --small --mode stream --seed 29`.
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";

const run = promisify(execFile);

const FAULT_KINDS = [
  "agent-kill",
  "agents-kill",
  "daemon-kill",
  "daemons-down",
  "daemon-term",
  "pg-fast",
  "pg-immediate",
  "pg-outage",
  "pg-outage-long",
  "overlap",
];

async function chaosSmall(mode: "stream" | "unary"): Promise<void> {
  const result = await run(process.execPath, ["--import", "tsx", "bench/chaos/run.ts", "--small", "--mode", mode, "--seed", "29"], {
    env: { ...process.env, NO_COLOR: "1" },
    maxBuffer: 16 * 1024 * 1024,
  }).then(
    (r) => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
    (err: { code?: number; stdout?: string; stderr?: string }) => ({ code: err.code ?? -1, stdout: err.stdout ?? "", stderr: err.stderr ?? "" }),
  );
  // A failure shows the run's figures and the end of what its processes wrote to stderr (where a
  // process that died on its own left its stack).
  const story = `${result.stdout}\n-- stderr (last 8 kB) --\n${result.stderr.slice(-8192)}`;
  const sets = result.stdout
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  const invariants = sets.find((s) => s.figures === "invariants");
  expect(invariants, story).toBeDefined();
  expect(sets.find((s) => s.figures === "setup")?.mode, story).toBe(mode);
  expect(
    sets
      .filter((s) => s.figures === "fault")
      .map((s) => s.kind as string)
      .sort(),
    story,
  ).toEqual([...FAULT_KINDS].sort());
  expect(invariants, story).toMatchObject({
    mode,
    enqueued: 300,
    rows: 300,
    completed: 300,
    lost: 0,
    stuck: 0,
    doubled: 0,
    overRun: 0,
    holderDidNotRun: 0,
    deadLetters: 0,
    cancelled: 0,
    agentsNotActiveAtEnd: [],
    crashes: 0,
    inactiveMarkedLive: 0,
    unrecovered: 0,
    refused: 0,
    internal: 0,
    hung: 0,
    // The DAG runs: every one started ended (completed), every node (each fan-out iteration) exactly once.
    dagRuns: 10,
    dagRunsStarted: 10,
    dagRunsEnded: 10,
    dagRunsNotEnded: 0,
    dagNodes: 100,
    dagNodesCompleted: 100,
    dagNodesDoubled: 0,
    dagNodesMissing: 0,
    dagItems: 100,
    dagItemsCompleted: 100,
    dagItemsStuck: 0,
    dagItemsFailed: 0,
    dagItemsDoubled: 0,
    dagItemsOverRun: 0,
    dagItemsHolderDidNotRun: 0,
  });
  expect(invariants!.broken, story).toEqual([]);
  expect(result.code, story).toBe(0);
}

describe("chaos run, small", () => {
  it("in the SDK's default stream mode: loses, doubles, strands and refuses no work, ends every DAG run with each node completed once, and recovers from every fault", {
    timeout: 240_000,
  }, async () => {
    await chaosSmall("stream");
  });

  it("with unary claims (stream: false): loses, doubles, strands and refuses no work, ends every DAG run with each node completed once, and recovers from every fault", {
    timeout: 240_000,
  }, async () => {
    await chaosSmall("unary");
  });
});
