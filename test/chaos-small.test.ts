/**
 * The CI-sized chaos run (`npm run chaos -- --small`): 2 daemons, 2 agents, 300 items, one fault of
 * each kind, on a Postgres of its own that it restarts. The global setup has built the daemon.
 * A fixed seed, so a failure here replays with `npm run chaos -- --small --seed 29`.
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";

const run = promisify(execFile);

describe("chaos run, small", () => {
  it("loses, doubles and strands no work through agent and daemon kills, Postgres restarts and an outage", { timeout: 240_000 }, async () => {
    const result = await run(process.execPath, ["--import", "tsx", "bench/chaos/run.ts", "--small", "--seed", "29"], {
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
    expect(sets.filter((s) => s.figures === "fault").map((s) => s.kind).sort()).toEqual(["agent-kill", "daemon-kill", "pg-fast", "pg-immediate", "pg-outage"]);
    expect(invariants, story).toMatchObject({
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
    });
    expect(invariants!.broken, story).toEqual([]);
    expect(invariants!.inactiveMarkedLive, story).toBe(0);
    expect(result.code, story).toBe(0);
  });
});
