/**
 * The demo DAG (demo/dag.json: split → 100 iterations of square → sum → flaky → report) run by two
 * processes of the DAG example worker (agent-sdk/examples/dag-worker.ts) against a real daemon.
 * flaky fails the run the first time; one ResumeRun completes it, and the workers' own log lines —
 * one per node they ran — show split, sum, report and every square iteration ran exactly once and
 * flaky twice: a resume re-runs what failed and nothing that completed.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { fromJson, type JsonValue } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { beforeAll, describe, expect, it } from "vitest";
import { AttemptStatus, DefinitionSchema, NodeStatus, RunStatus } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { TOKENS } from "./support/daemon.js";
import { DagClient } from "./support/dag.js";
import { codeOf, until, useTestDb } from "./support/kit.js";
import { makeTempDir, removeTempDir } from "./support/temp-dir.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const TENANT = "t";
const ITERATIONS = 100;
const SUM_OF_SQUARES = (ITERATIONS * (ITERATIONS + 1) * (2 * ITERATIONS + 1)) / 6;

const fx = useTestDb("demodag");
let client: DagClient;
let address: string;
let flakyDir: string;

/** The worker's pino lines on stdout, parsed; `node ran` is the line it writes for each node it runs. */
interface LogLine {
  msg?: string;
  node?: string;
  task?: string;
  run?: string;
  attempt?: number;
  agent?: string;
}

interface Worker {
  readonly name: string;
  readonly proc: ChildProcess;
  readonly lines: LogLine[];
}

function spawnWorker(name: string): Worker {
  const args = [
    "--import",
    "tsx",
    "agent-sdk/examples/dag-worker.ts",
    "--address",
    address,
    "--token",
    TOKENS.agent,
    "--name",
    name,
    "--tenants",
    TENANT,
    "--slots",
    "16",
    "--flaky-dir",
    flakyDir,
    "--grace",
    "5000",
  ];
  const proc = spawn(process.execPath, args, { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] });
  fx.closers.defer(() => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
  });
  const lines: LogLine[] = [];
  createInterface({ input: proc.stdout! }).on("line", (line) => {
    try {
      lines.push(JSON.parse(line) as LogLine);
    } catch {
      // Not a log line: nothing to count.
    }
  });
  return { name, proc, lines };
}

beforeAll(async () => {
  const daemon = await fx.startDaemon({ config: { heartbeatInterval: 1_000, heartbeatFlush: 50 } });
  address = daemon.address;
  client = fx.closers.add(new DagClient(address, TOKENS.runs));
  flakyDir = await makeTempDir("demo-dag-flaky");
  fx.closers.defer(() => removeTempDir(flakyDir));
});

describe("the demo DAG with the example DAG worker", () => {
  it("fails at flaky, and one ResumeRun completes it without re-running a finished node or iteration (counted from the workers' logs)", {
    timeout: 90_000,
  }, async () => {
    const workers = [spawnWorker("demo-dag-worker-1"), spawnWorker("demo-dag-worker-2")];
    for (const w of workers) await until(`${w.name} registered`, () => w.lines.some((l) => l.msg === "registered"), 30_000);

    const definition = fromJson(DefinitionSchema, JSON.parse(readFileSync(`${ROOT}/demo/dag.json`, "utf8")) as JsonValue);
    await client.dag.putDefinition({ tenantKey: TENANT, definition });
    const started = (await client.dag.startRun({ tenantKey: TENANT, source: { case: "definitionId", value: definition.id }, contextJson: "{}" })).run!;
    const ranFor = (task: string) => workers.flatMap((w) => w.lines).filter((l) => l.msg === "node ran" && l.run === started.id && l.task === task).length;

    const failed = await client.until(TENANT, started.id, RunStatus.FAILED, 60_000);
    expect(failed.reason).toBe(`node 'flaky' failed: NonRetryableError: failing the first time for run ${started.id} (resume the run to go on)`);
    expect(failed.nodes.map((n) => [n.name, NodeStatus[n.status]])).toEqual([
      ["split", "COMPLETED"],
      ["square", "COMPLETED"],
      ["sum", "COMPLETED"],
      ["flaky", "FAILED"],
      ["report", "PENDING"],
    ]);
    // The failure was reported after the handler's line was written; wait for the pipe to bring it.
    await until("flaky's first run is in a worker's log", () => ranFor("flaky") === 1);

    const resumed = (await client.dag.resumeRun({ tenantKey: TENANT, runId: started.id })).run!;
    expect(resumed.status).toBe(RunStatus.RUNNING);
    const done = await client.until(TENANT, started.id, RunStatus.COMPLETED, 60_000);

    const ctx = JSON.parse(done.contextJson) as Record<string, unknown>;
    expect(ctx.split).toEqual({ items: Array.from({ length: ITERATIONS }, (_, i) => i + 1) });
    expect(ctx.square).toEqual(Array.from({ length: ITERATIONS }, (_, i) => ({ value: (i + 1) * (i + 1) })));
    expect(ctx.sum).toEqual({ total: SUM_OF_SQUARES, count: ITERATIONS });
    expect(ctx.flaky).toEqual({ checked: SUM_OF_SQUARES });
    expect(ctx.report).toEqual({ text: `run ${started.id}: the squares of 1..${ITERATIONS} add up to ${SUM_OF_SQUARES}` });

    // Drained and exited, every line a worker wrote has been read.
    for (const w of workers) w.proc.kill("SIGTERM");
    const codes = await Promise.all(workers.map(async (w) => (w.proc.exitCode ?? (await once(w.proc, "exit"))[0]) as number | null));
    expect(codes).toEqual([0, 0]);

    const runs = new Map<string, number>();
    for (const l of workers.flatMap((w) => w.lines)) {
      if (l.msg !== "node ran") continue;
      expect(l.run).toBe(started.id);
      // Each run was its item's first try: no retry or redelivery hides behind a count of one.
      expect(l.attempt, l.task).toBe(1);
      runs.set(l.task!, (runs.get(l.task!) ?? 0) + 1);
    }
    const expected = new Map<string, number>([
      ["split", 1],
      ...Array.from({ length: ITERATIONS }, (_, i) => [`square[${i}]`, 1] as [string, number]),
      ["sum", 1],
      ["flaky", 2],
      ["report", 1],
    ]);
    expect(Object.fromEntries(runs)).toEqual(Object.fromEntries(expected));

    // The run's own record agrees: one attempt of everything but flaky, which failed once and then completed.
    const attempts = (name: string) => done.nodes.find((n) => n.name === name)!.attempts.map((a) => [a.attempt, AttemptStatus[a.status]]);
    expect(attempts("split")).toEqual([[1, "COMPLETED"]]);
    expect(attempts("square")).toEqual(Array.from({ length: ITERATIONS }, () => [1, "COMPLETED"]));
    expect(attempts("sum")).toEqual([[1, "COMPLETED"]]);
    expect(attempts("flaky")).toEqual([
      [1, "FAILED"],
      [2, "COMPLETED"],
    ]);
    expect(attempts("report")).toEqual([[1, "COMPLETED"]]);
    expect(done.nodes.find((n) => n.name === "square")).toMatchObject({ iterations: ITERATIONS, iterationsDone: ITERATIONS });
    // Only a failed run resumes.
    expect(await codeOf(client.dag.resumeRun({ tenantKey: TENANT, runId: started.id }))).toBe(Code.FailedPrecondition);
  });
});
