/**
 * aiflowctl's DAG-run commands as a person runs them: `node bin/aiflowctl.js …` in a child process
 * against a real daemon, with a `runs` token. Definitions are files in protobuf JSON (or stdin); a
 * TestAgent serving engine kind `dag` in tenant `t` runs the nodes. Checked: the printed tables and
 * tree, `--json` parsed, exit codes, and the one line of each refusal.
 */
import { execFile } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, it, vi } from "vitest";
import { AttemptStatus, NodeStatus, RunStatus } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { TOKENS } from "./support/daemon.js";
import { DagClient, definition, work } from "./support/dag.js";
import { until, useTestDaemon } from "./support/kit.js";
import { TestAgent } from "./support/queue.js";
import { makeTempDir, removeTempDir } from "./support/temp-dir.js";

const CLI = fileURLToPath(new URL("../bin/aiflowctl.js", import.meta.url));
/** Each run starts node (about a second of CPU); these limits only matter when something hangs. */
const CLI_TIMEOUT_MS = 60_000;
vi.setConfig({ testTimeout: 120_000 });
const fx = useTestDaemon({ label: "ctlruns", config: { instanceId: "ctl-runs", sweepInterval: 50, heartbeatInterval: 3_600_000 } });
let dag: DagClient;
let dir: string;
/** Iterations that have failed, as "<run id>:<index>": a payload's failAt iteration fails once, so a resume completes it. */
const failed = new Set<string>();

beforeAll(async () => {
  dag = fx.closers.add(new DagClient(fx.address));
  dir = await makeTempDir("ctl-runs");
  fx.closers.defer(() => removeTempDir(dir));
  const agent = fx.closers.add(await TestAgent.register(fx.address, "runs-agent", { tenants: ["t"], engineKinds: ["dag"], slots: 16 }));
  const w = work(agent, (item, p) => {
    const payload = (p ?? {}) as { n?: number; i?: number; x?: number; failAt?: number | null };
    if (item.taskName === "split") return { items: Array.from({ length: payload.n ?? 0 }, (_, i) => i) };
    const once = `${item.runId}:${payload.i}`;
    if (payload.i !== undefined && payload.i === payload.failAt && !failed.has(once)) {
      failed.add(once);
      throw new Error(`iteration ${payload.i} broke`);
    }
    return payload.x !== undefined ? payload.x * payload.x : "ok";
  });
  fx.closers.defer(() => w.stop());
});

interface Result {
  code: number;
  stdout: string;
  stderr: string;
}

const env = () => {
  const e: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1" };
  for (const k of ["AIFLOW_ADDRESS", "AIFLOW_TOKEN", "AIFLOW_TLS_CA", "AIFLOW_TLS_CERT", "AIFLOW_TLS_KEY"]) delete e[k];
  return e;
};

/** Runs aiflowctl with a runs token (or `token`; null: none) to completion, `stdin` on its standard input. */
function ctl(args: readonly string[], opts: { token?: string | null; stdin?: string } = {}): Promise<Result> {
  const token = opts.token === undefined ? TOKENS.runs : opts.token;
  const argv = [CLI, "--address", fx.address, ...(token === null ? [] : ["--token", token]), ...args];
  return new Promise((resolve, reject) => {
    const child = execFile(process.execPath, argv, { env: env(), timeout: CLI_TIMEOUT_MS }, (err, stdout, stderr) => {
      if (err && typeof err.code !== "number") return reject(Object.assign(err, { stdout, stderr }));
      resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
    });
    child.stdin?.end(opts.stdin ?? "");
  });
}

async function ctlJson<T>(args: readonly string[]): Promise<T> {
  const r = await ctl([...args, "--json"]);
  if (r.code !== 0) throw new Error(`aiflowctl ${args.join(" ")} exited ${r.code}: ${r.stderr}`);
  return JSON.parse(r.stdout) as T;
}

/** A definition file in protobuf JSON, as a person writes one. */
function defFile(name: string, def: unknown): string {
  const path = join(dir, `${name}.json`);
  writeFileSync(path, JSON.stringify(def, null, 2));
  return path;
}

const CHAIN = {
  id: "chain",
  nodes: [
    { name: "first", engineKind: "dag", payloadJson: "{}" },
    { name: "second", engineKind: "dag", dependsOn: ["first"], payloadJson: "{}" },
  ],
};
const FAN = (n: number) => ({
  id: "squares",
  nodes: [
    { name: "split", engineKind: "dag", payloadJson: JSON.stringify({ n }) },
    {
      name: "square",
      engineKind: "dag",
      dependsOn: ["split"],
      fanOut: "context.split.items",
      payloadJson: '{"x": "{{ item }}", "i": "{{ index }}", "failAt": "{{ context.failAt }}"}',
    },
  ],
});

interface RunJson {
  id: string;
  definitionId: string;
  status: string;
  reason: string;
  nodes: {
    name: string;
    status: string;
    iterations: number;
    iterationsDone: number;
    attempts: { name: string; status: string; worker: string; attempt: number }[];
  }[];
}

describe("help", () => {
  it("--help lists the run commands; runs --help and run --help show their flags, the runs role and the exit codes", async () => {
    const [main, runs, run] = await Promise.all([ctl(["--help"]), ctl(["runs", "--help"]), ctl(["run", "--help"])]);
    expect(main.code).toBe(0);
    for (const cmd of ["runs list", "run ID", "run start FILE", "run cancel ID", "run resume ID", "run signal ID EVENT"])
      expect(main.stdout).toContain(`  ${cmd}`);
    expect(runs.code).toBe(0);
    expect(runs.stdout).toMatch(/--status S \(repeatable\) +only runs in this status: running, completed, failed, cancelled/);
    expect(runs.stdout).toMatch(/--limit N +at most N runs, read page by page; default: 50/);
    expect(runs.stdout).toContain("Needs a token with role 'runs'.");
    expect(runs.stdout).not.toContain("run start");
    expect(run.code).toBe(0);
    for (const flag of ["--tenant T", "--all", "--context JSON", "--idempotency-key K", "--wait", "--reason TEXT", "--payload JSON"])
      expect(run.stdout).toContain(flag);
    expect(run.stdout).toContain("Needs a token with role 'runs'.");
    expect(run.stdout).toMatch(/Exit codes:\n( {2}.*\n)* {2}1 also with start --wait: the run failed or was cancelled/);
    // --help after a subcommand (or a run ID) is the same help, exit 0, nothing sent.
    const subs = await Promise.all(
      [
        ["runs", "list"],
        ["run", "start"],
        ["run", "cancel", "01ABC"],
        ["run", "resume"],
        ["run", "signal"],
        ["run", "01ABC"],
      ].map((a) => ctl([...a, "--help"])),
    );
    for (const [i, r] of subs.entries()) expect([r.code, r.stdout, r.stderr]).toEqual([0, i === 0 ? runs.stdout : run.stdout, ""]);
  });
});

describe("refusals", () => {
  it("a missing --tenant, ID, FILE or EVENT, a bad status or file: exit 2 with one line, nothing sent", async () => {
    const bad = defFile("bad", { nodes: [{ name: "a", dependsOnn: [] }] });
    const notJson = join(dir, "not.json");
    writeFileSync(notJson, "{nodes:");
    const results = await Promise.all([
      ctl(["runs", "list"]),
      ctl(["run", "01ABC"]),
      ctl(["run", "start", defFile("chain-untenanted", CHAIN)]),
      ctl(["run", "cancel", "01ABC"]),
      ctl(["run", "resume", "--tenant", "t"]),
      ctl(["run", "signal", "01ABC", "--tenant", "t"]),
      ctl(["run", "start", "--tenant", "t"]),
      ctl(["runs", "list", "--tenant", "t", "--status", "done"]),
      ctl(["run", "start", join(dir, "missing.json"), "--tenant", "t"]),
      ctl(["run", "start", notJson, "--tenant", "t"]),
      ctl(["run", "start", bad, "--tenant", "t"]),
      ctl(["run"]),
    ]);
    const stderr = results.map((r) => (expect([r.code, r.stdout]).toEqual([2, ""]), r.stderr));
    expect(stderr.slice(0, 4)).toEqual(Array(4).fill("aiflowctl: give the tenant: --tenant T\n"));
    expect(stderr[4]).toBe("aiflowctl: give the run ID: aiflowctl run resume ID --tenant T\n");
    expect(stderr[5]).toBe("aiflowctl: give the EVENT: aiflowctl run signal ID EVENT --tenant T [--payload JSON]\n");
    expect(stderr[6]).toBe("aiflowctl: give the definition FILE (or - for stdin): aiflowctl run start FILE --tenant T\n");
    expect(stderr[7]).toBe("aiflowctl: unknown run status 'done' (running, completed, failed, cancelled)\n");
    expect(stderr[8]).toBe(`aiflowctl: FILE: cannot read ${join(dir, "missing.json")} (no such file)\n`);
    expect(stderr[9]).toMatch(new RegExp(`^aiflowctl: ${notJson}: is not JSON \\(.+\\)\n$`));
    expect(stderr[10]).toMatch(new RegExp(`^aiflowctl: ${bad}: is not an aiflow\\.dag\\.v1\\.Definition in protobuf JSON \\(.*dependsOnn.*\\)\n$`));
    expect(stderr[11]).toBe("aiflowctl: give the run ID, or start, cancel, resume or signal (see aiflowctl run --help)\n");
    expect((await dag.dag.listRuns({ tenantKey: "t" })).runs).toEqual([]);
  });

  it("a definition the daemon refuses names the file and the node (exit 2); an unknown run, another token's run, no token, an ops token: exit 1", async () => {
    const cycle = defFile("cycle", {
      nodes: [
        { name: "a", engineKind: "dag", dependsOn: ["b"] },
        { name: "b", engineKind: "dag", dependsOn: ["a"] },
      ],
    });
    const mine = await dag.start("t", definition([{ name: "solo", engineKind: "idle" }]));
    const [refused, unknown, badId, other, noToken, ops] = await Promise.all([
      ctl(["run", "start", cycle, "--tenant", "t"]),
      ctl(["run", "01NOSUCHRUN", "--tenant", "t"]),
      ctl(["run", "no such run", "--tenant", "t"]),
      ctl(["run", mine.id, "--tenant", "t"], { token: TOKENS.runs2 }),
      ctl(["runs", "list", "--tenant", "t"], { token: null }),
      ctl(["runs", "list", "--tenant", "t"], { token: TOKENS.ops }),
    ]);
    expect(refused).toEqual({ code: 2, stdout: "", stderr: `aiflowctl: ${cycle}: node 'a': is on a cycle: a -> b -> a\n` });
    expect(unknown).toEqual({ code: 1, stdout: "", stderr: "aiflowctl: tenant 't' has no run '01NOSUCHRUN' of yours\n" });
    expect(badId.code).toBe(2);
    expect(badId.stderr).toMatch(/^aiflowctl: ID: 'no such run' may only contain/);
    expect(other).toEqual({ code: 1, stdout: "", stderr: `aiflowctl: tenant 't' has no run '${mine.id}' of yours\n` });
    expect(noToken).toEqual({
      code: 1,
      stdout: "",
      stderr: "aiflowctl: no token: give --token TOKEN or set AIFLOW_TOKEN (runs needs a token with role 'runs')\n",
    });
    expect(ops).toEqual({ code: 1, stdout: "", stderr: expect.stringMatching(/^aiflowctl: \S*ListRuns needs a token with role 'runs'\n$/) });
    await dag.dag.cancelRun({ tenantKey: "t", runId: mine.id });
  });
});

describe("a run from start to end", () => {
  it("run start FILE --wait prints the id, node changes on stderr, exits 0; runs list shows it; run ID shows the tree with the agent as worker", async () => {
    const started = await ctl(["run", "start", defFile("chain", CHAIN), "--tenant", "t", "--wait"]);
    expect(started.code, started.stderr).toBe(0);
    const id = started.stdout.trim();
    expect(id).toMatch(/^[0-9A-Z]{26}$/);
    // One line per status change WatchRun showed (changes close together come as one message), then the end.
    const progress = started.stderr.trimEnd().split("\n");
    expect(progress.slice(0, -1).every((l) => /^(first|second): (running|completed)$/.test(l))).toBe(true);
    expect(progress.at(-2)).toBe("second: completed");
    expect(progress.at(-1)).toMatch(new RegExp(`^run ${id} completed after \\S+$`));

    const [list, listJson, tree, treeJson] = await Promise.all([
      ctl(["runs", "list", "--tenant", "t", "--status", "completed"]),
      ctlJson<{ runs: RunJson[]; nextPageToken: string }>(["runs", "list", "--tenant", "t", "--definition", "chain"]),
      ctl(["run", id, "--tenant", "t"]),
      ctlJson<{ run: RunJson }>(["run", id, "--tenant", "t"]),
    ]);
    expect(list.code).toBe(0);
    expect(list.stdout).toMatch(
      new RegExp(`^ID +DEFINITION +STATUS +STARTED +DURATION +REASON\n${id} +chain +completed +\\d{4}-\\d\\d-\\d\\dT[\\d:.]+Z +\\S+ +-\n$`),
    );
    expect(listJson.runs.map((r) => [r.id, r.definitionId, r.status])).toEqual([[id, "chain", "RUN_STATUS_COMPLETED"]]);
    expect(listJson.nextPageToken).toBe("");
    expect(tree.code).toBe(0);
    const lines = tree.stdout.split("\n");
    expect(lines[0]).toMatch(new RegExp(`^run ${id}  definition chain  completed  started \\S+Z  ended \\S+Z  took \\S+  by runs-\\w+$`));
    expect(lines[2]).toMatch(/^NODE \/ ATTEMPT +STATUS +WORKER +STARTED +ENDED +DURATION +ERROR$/);
    const attempt = (name: string) => new RegExp(`^  ${name} #1 +completed +runs-agent +\\d{4}-[\\d-]+T[\\d:.]+Z +\\d{4}-[\\d-]+T[\\d:.]+Z +\\d+m?s$`);
    expect(lines.slice(3)).toEqual([
      expect.stringMatching(/^first +completed$/),
      expect.stringMatching(attempt("first")),
      expect.stringMatching(/^second +completed$/),
      expect.stringMatching(attempt("second")),
      "",
    ]);
    expect(treeJson.run.nodes.map((n) => [n.name, n.status, n.attempts.map((a) => [a.name, a.status, a.worker, a.attempt])])).toEqual([
      ["first", "NODE_STATUS_COMPLETED", [["first", "ATTEMPT_STATUS_COMPLETED", "runs-agent", 1]]],
      ["second", "NODE_STATUS_COMPLETED", [["second", "ATTEMPT_STATUS_COMPLETED", "runs-agent", 1]]],
    ]);
  });

  it("a definition on stdin with --context and an idempotency key: --json prints the run; the same key returns it again", async () => {
    const def = JSON.stringify({ id: "from-stdin", nodes: [{ name: "only", engineKind: "dag", payloadJson: '{"who": "{{ context.who }}"}' }] });
    const args = ["run", "start", "-", "--tenant", "t", "--context", '{"who":"ann"}', "--idempotency-key", "k-1", "--json"];
    const first = await ctl(args, { stdin: def });
    expect(first.code).toBe(0);
    const res = JSON.parse(first.stdout) as { run: RunJson; existing: boolean };
    expect([res.run.definitionId, res.run.status, res.existing]).toEqual(["from-stdin", "RUN_STATUS_RUNNING", false]);
    const again = await ctl(["run", "start", "-", "--tenant", "t", "--idempotency-key", "k-1"], { stdin: def });
    expect(again).toEqual({
      code: 0,
      stdout: `${res.run.id}\n`,
      stderr: `run ${res.run.id} was started before with idempotency key 'k-1': nothing new started\n`,
    });
    const badContext = await ctl(["run", "start", "-", "--tenant", "t", "--context", "[1]"], { stdin: def });
    expect(badContext).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: --context: must be a JSON object\n" });
  });
});

describe("fan-out, failure, resume, cancel, signal", () => {
  it("a failed fan-out: --wait exits 1; run ID summarises its iterations and shows the failed one (--all: every one); resume runs it again", async () => {
    const res = await ctl(["run", "start", defFile("fan", FAN(12)), "--tenant", "t", "--context", '{"failAt": 3}', "--wait"]);
    const id = res.stdout.trim();
    expect(res.code, `stderr: ${res.stderr}`).toBe(1);
    // The run fails at the first failed iteration; the iterations already out go on and are recorded.
    expect(res.stderr).toMatch(/\nsquare: failed \d+\/12: iteration 3: iteration 3 broke\n/);
    expect(res.stderr.trimEnd().split("\n").at(-1)).toMatch(new RegExp(`^run ${id} failed after \\S+: node 'square' failed: iteration 3: iteration 3 broke$`));
    await until(
      "every iteration has ended",
      async () => (await dag.get("t", id)).nodes[1]!.attempts.every((a) => a.status !== AttemptStatus.QUEUED && a.status !== AttemptStatus.RUNNING),
      20_000,
      20,
    );

    const [tree, all] = await Promise.all([ctl(["run", id, "--tenant", "t"]), ctl(["run", id, "--tenant", "t", "--all"])]);
    expect(tree.code).toBe(0);
    expect(tree.stdout).toMatch(
      /\nsquare +failed 11\/12 .*iteration 3 broke\n {2}12 attempts: 11 completed, 1 failed; showing the 1 failed or running \(--all: every attempt\)\n {2}square\[3\] #1 +failed +runs-agent .*iteration 3 broke\n$/,
    );
    expect(tree.stdout).not.toContain("square[0]");
    expect(all.stdout.match(/^ {2}square\[\d+\] #1 /gm)).toHaveLength(12);

    expect(await ctl(["run", "resume", id, "--tenant", "t"])).toEqual({ code: 0, stdout: `run ${id} is running\n`, stderr: "" });
    const done = await dag.until("t", id, RunStatus.COMPLETED);
    expect(done.nodes[1]!.attempts.map((a) => `${a.name}#${a.attempt}`).filter((n) => n.startsWith("square[3]"))).toEqual(["square[3]#1", "square[3]#2"]);
    const again = await ctl(["run", "resume", id, "--tenant", "t"]);
    expect(again).toEqual({ code: 1, stdout: "", stderr: `aiflowctl: run '${id}' is completed; only a failed run resumes\n` });
  });

  it("cancel prints the run's status (exit 0) and a second cancel exits 1; runs list --status filters and pages to --limit", async () => {
    const file = defFile("idle", { id: "idle", nodes: [{ name: "never", engineKind: "idle" }] });
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await ctl(["run", "start", file, "--tenant", "t"])).stdout.trim());
    const cancelled = await ctl(["run", "cancel", ids[0]!, "--tenant", "t", "--reason", "not needed"]);
    expect(cancelled).toEqual({ code: 0, stdout: `run ${ids[0]} is cancelled\n`, stderr: "" });
    const twice = await ctl(["run", "cancel", ids[0]!, "--tenant", "t"]);
    expect(twice).toEqual({ code: 1, stdout: "", stderr: `aiflowctl: run '${ids[0]}' is cancelled; only a running run can be cancelled\n` });
    const cancelledJson = await ctlJson<{ run: RunJson }>(["run", "cancel", ids[1]!, "--tenant", "t"]);
    expect([cancelledJson.run.status, cancelledJson.run.reason]).toEqual(["RUN_STATUS_CANCELLED", expect.stringMatching(/^cancelled by runs-\w+$/)]);

    const list = await ctl(["runs", "list", "--tenant", "t", "--definition", "idle", "--status", "cancelled"]);
    expect(list.stdout).toMatch(
      new RegExp(`^ID .*\n${ids[1]} +idle +cancelled +\\S+ +\\S+ +cancelled by runs-\\w+\n${ids[0]} +idle +cancelled +\\S+ +\\S+ +not needed\n$`),
    );
    const page = await ctl(["runs", "list", "--tenant", "t", "--definition", "idle", "--limit", "2"]);
    const token = /\nmore: --page-token (\S+) \(or a larger --limit\)\n$/.exec(page.stdout)?.[1];
    expect(
      page.stdout
        .split("\n")
        .slice(1, 3)
        .map((l) => l.split(/ +/)[0]),
    ).toEqual([ids[2], ids[1]]);
    const rest = await ctlJson<{ runs: RunJson[]; nextPageToken: string }>(["runs", "list", "--tenant", "t", "--definition", "idle", "--page-token", token!]);
    expect([rest.runs.map((r) => r.id), rest.nextPageToken]).toEqual([[ids[0]], ""]);
    await ctl(["run", "cancel", ids[2]!, "--tenant", "t"]);
  });

  it("signal delivers an event to a waiting node; an event no node waits for is a usage error", async () => {
    const file = defFile("approval", { id: "approval", nodes: [{ name: "approve", kind: "NODE_KIND_WAIT", event: "approved" }] });
    const id = (await ctl(["run", "start", file, "--tenant", "t"])).stdout.trim();
    await until("the wait node waits", async () => (await dag.get("t", id)).nodes[0]?.status === NodeStatus.WAITING, 20_000, 20);
    const wrong = await ctl(["run", "signal", id, "rejected", "--tenant", "t"]);
    expect(wrong).toEqual({ code: 2, stdout: "", stderr: `aiflowctl: EVENT: no wait node of run '${id}' waits for 'rejected'\n` });
    const sent = await ctl(["run", "signal", id, "approved", "--tenant", "t", "--payload", '{"by":"ann"}']);
    expect(sent.code).toBe(0);
    expect(sent.stdout).toMatch(new RegExp(`^delivered approved: run ${id} is (running|completed)\n$`));
    const done = await dag.until("t", id, RunStatus.COMPLETED);
    expect(JSON.parse(done.contextJson)).toEqual({ approve: { by: "ann" } });
  });
});
