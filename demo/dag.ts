/**
 * The DAG part of npm run demo: the demo DAG (demo/dag.json: split → square, 100 iterations → sum →
 * flaky → report) stored and started with the `runs` certificate, run by two processes of the DAG
 * example worker (agent-sdk/examples/dag-worker.ts). flaky fails the run the first time it runs;
 * the demo watches the run fail, resumes it, watches it complete, and counts from the workers' own
 * log lines (one per node they ran) that only flaky ran again.
 */
import { readFileSync } from "node:fs";
import { fromJson, type JsonValue } from "@bufbuild/protobuf";
import { createClient, type Transport } from "@connectrpc/connect";
import { DagService, DefinitionSchema, NodeStatus, RunStatus, type Run } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { startChild, type Child } from "../bench/proc.js";
import { table } from "../src/cli/ctl/format.js";

export interface DagDemoOptions {
  address: string;
  /** A transport whose calls carry a `runs` identity (DagService). */
  runs: Transport;
  /** The daemon's CA and an agent certificate, for the workers. */
  tls: { ca: string; cert: string; key: string };
  tenant: string;
  /** Where the workers record the runs flaky has failed for (shared, so it fails once per run between them). */
  flakyDir: string;
  /** The workers join these, so the caller stops them with the rest should the demo fail midway. */
  children: Child[];
  say: (msg: string) => void;
}

const WORKERS = ["demo-dag-worker-1", "demo-dag-worker-2"];
/** Longer than the run ever takes; a run that has not ended by then is a failure of the demo. */
const WATCH_TIMEOUT_MS = 120_000;

/** Runs the DAG part; true when the run completed after one resume with nothing but flaky run twice. */
export async function dagDemo(o: DagDemoOptions): Promise<boolean> {
  const nodeLines: { task: string; run: string }[] = [];
  const workers: Child[] = [];
  o.say(`starting ${WORKERS.length} DAG example agents (agent-sdk/examples/dag-worker.ts)`);
  for (const name of WORKERS) {
    const worker = startChild(
      "agent-sdk/examples/dag-worker.ts",
      [
        "--address",
        o.address,
        "--tls-ca",
        o.tls.ca,
        "--tls-cert",
        o.tls.cert,
        "--tls-key",
        o.tls.key,
        "--name",
        name,
        "--tenants",
        o.tenant,
        "--slots",
        "16",
        "--flaky-dir",
        o.flakyDir,
        "--grace",
        "10000",
      ],
      { ready: (l) => l.includes('"msg":"registered"'), stderr: "ignore" },
    );
    o.children.push(worker);
    workers.push(worker);
    // The worker logs pino JSON on stdout; "node ran" is its line for each node it runs.
    worker.onLine((line) => {
      if (!line.includes('"msg":"node ran"')) return;
      const l = JSON.parse(line) as { task: string; run: string };
      nodeLines.push({ task: l.task, run: l.run });
    });
    await worker.ready;
  }

  const dag = createClient(DagService, o.runs);
  const definition = fromJson(DefinitionSchema, JSON.parse(readFileSync(new URL("./dag.json", import.meta.url), "utf8")) as JsonValue);
  await dag.putDefinition({ tenantKey: o.tenant, definition });
  const started = (await dag.startRun({ tenantKey: o.tenant, source: { case: "definitionId", value: definition.id }, contextJson: "{}" })).run!;
  o.say(
    `started run ${started.id} of definition '${definition.id}' (demo/dag.json): ${definition.nodes.map((n) => n.name + (n.fanOut ? ` (one per ${n.fanOut})` : "")).join(" → ")}`,
  );

  const failed = await watch(dag, o.tenant, started.id, o.say);
  o.say(`run ${RunStatus[failed.status]}: ${failed.reason}`);
  if (failed.status !== RunStatus.FAILED) return false;

  o.say("ResumeRun: the failed node runs again as attempt 2; what completed does not run again");
  await dag.resumeRun({ tenantKey: o.tenant, runId: started.id });
  const done = await watch(dag, o.tenant, started.id, o.say);
  o.say(`run ${RunStatus[done.status]}`);

  // A worker's lines can trail the run's end through the pipe: count once the workers have drained
  // and exited ("close": their output has been read to its end).
  await Promise.all(workers.map((w) => w.stop(15_000)));
  const byTask = new Map<string, number>();
  for (const l of nodeLines) if (l.run === started.id) byTask.set(l.task, (byTask.get(l.task) ?? 0) + 1);
  const rows = done.nodes.map((n) => {
    const tasks = [...byTask].filter(([task]) => task === n.name || task.startsWith(`${n.name}[`));
    const runs = tasks.reduce((sum, [, c]) => sum + c, 0);
    const most = Math.max(0, ...tasks.map(([, c]) => c));
    const ran = n.iterations > 0 ? `${runs} (${tasks.length} iterations, each ${most === 1 ? "once" : `up to ${most} times`})` : String(runs);
    return [n.name, NodeStatus[n.status]!, ran, String(n.attempts.length)];
  });
  console.log("");
  console.log(table(["NODE", "STATUS", "RAN (WORKERS' LOGS)", "ATTEMPTS (RUN)"], rows));

  const context = JSON.parse(done.contextJson) as { sum?: { total?: number; count?: number }; report?: { text?: string } };
  console.log("");
  console.log(`context.sum: ${JSON.stringify(context.sum)}`);
  console.log(`context.report: ${context.report?.text}`);

  const count = context.sum?.count ?? 0;
  const onceEach = [...byTask].every(([task, c]) => c === (task === "flaky" ? 2 : 1));
  const everyTask = byTask.size === done.nodes.reduce((n, node) => n + Math.max(1, node.iterations), 0);
  const ok = done.status === RunStatus.COMPLETED && onceEach && everyTask && context.sum?.total === (count * (count + 1) * (2 * count + 1)) / 6;
  if (!ok)
    o.say(
      "the DAG run did not go as it should: it must complete after one resume, every node and iteration run once but flaky twice, with the sum of the squares",
    );
  return ok;
}

/**
 * Follows the run with WatchRun until it ends, printing a line whenever a node's status changes and
 * as a fan-out node's iterations complete; returns the ended run with every node's attempts (the
 * ATTEMPTS (RUN) column counts them: without with_attempts, WatchRun sends none and it read 0).
 */
export async function watch(dag: ReturnType<typeof createClient<typeof DagService>>, tenant: string, runId: string, say: (msg: string) => void): Promise<Run> {
  let last: Run | undefined;
  const seen = new Map<string, string>();
  for await (const m of dag.watchRun({ tenantKey: tenant, runId, withAttempts: true }, { signal: AbortSignal.timeout(WATCH_TIMEOUT_MS) })) {
    last = m.run!;
    for (const n of last.nodes) {
      const status = NodeStatus[n.status]!.toLowerCase();
      const line = `  ${n.name}: ${status}${n.iterations > 0 ? ` (${n.iterationsDone}/${n.iterations} iterations)` : ""}${n.error ? ` — ${n.error}` : ""}`;
      if (seen.get(n.name) === line) continue;
      seen.set(n.name, line);
      say(line);
    }
  }
  if (!last) throw new Error(`WatchRun sent nothing for run ${runId}`);
  return last;
}
