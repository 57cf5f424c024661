/**
 * aiflowctl's graph and machine commands as a person runs them (`node bin/aiflowctl.js …` in a
 * child process, runs token): a graph run's path and why it stopped, a machine's state and history
 * as events move it, `--json` parsed, and a refusal's one line.
 */
import { execFile } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, it, vi } from "vitest";
import { TOKENS } from "./support/daemon.js";
import { work } from "./support/dag.js";
import { until, useTestDaemon } from "./support/kit.js";
import { GraphClient } from "./support/native.js";
import { TestAgent } from "./support/queue.js";
import { makeTempDir, removeTempDir } from "./support/temp-dir.js";

const CLI = fileURLToPath(new URL("../bin/aiflowctl.js", import.meta.url));
vi.setConfig({ testTimeout: 120_000 });
const fx = useTestDaemon({ label: "ctlengines", config: { instanceId: "ctl-engines", sweepInterval: 50, heartbeatInterval: 3_600_000 } });
let dir: string;

beforeAll(async () => {
  dir = await makeTempDir("ctl-engines");
  fx.closers.defer(() => removeTempDir(dir));
  const agent = fx.closers.add(await TestAgent.register(fx.address, "engines-agent", { tenants: ["t"], engineKinds: ["tick"], slots: 8 }));
  const w = work(agent, (_item, p) => ({ n: ((p as { n: number | null }).n ?? 0) + 1 }));
  fx.closers.defer(() => w.stop());
});

function ctl(args: readonly string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const env: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1" };
  for (const k of ["AIFLOW_ADDRESS", "AIFLOW_TOKEN", "AIFLOW_TLS_CA", "AIFLOW_TLS_CERT", "AIFLOW_TLS_KEY"]) delete env[k];
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [CLI, "--address", fx.address, "--token", TOKENS.runs, ...args], { env, timeout: 60_000 }, (err, stdout, stderr) => {
      if (err && typeof err.code !== "number") return reject(Object.assign(err, { stdout, stderr }));
      resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
    });
  });
}

const file = (name: string, body: unknown) => {
  const path = join(dir, `${name}.json`);
  writeFileSync(path, JSON.stringify(body, null, 2));
  return path;
};

describe("aiflowctl graph", () => {
  it("starts a run from a file and shows its path, steps and the bound it stopped at", async () => {
    const def = file("loop", {
      id: "loop",
      start: "tick",
      maxSteps: "3",
      nodes: [
        { name: "tick", kind: "NODE_KIND_TASK", engineKind: "tick", payloadJson: '{"n": "{{ context.tick.n }}"}' },
        { name: "done", kind: "NODE_KIND_END" },
      ],
      edges: [
        { from: "tick", to: "done", when: "result.n > 99" },
        { from: "tick", to: "tick" },
      ],
    });
    const started = await ctl(["graph", "start", def, "--tenant", "t"]);
    expect(started.code).toBe(0);
    const runId = started.stdout.trim();
    const graphs = fx.closers.add(new GraphClient(fx.address));
    await graphs.ended("t", runId);
    const shown = await ctl(["graph", runId, "--tenant", "t"]);
    expect(shown.code).toBe(0);
    expect(shown.stdout).toContain(`graph run ${runId}  stopped  definition loop`);
    expect(shown.stdout).toContain("  path:   tick → tick → tick");
    expect(shown.stdout).toContain("  steps:  3  (tick×3)");
    expect(shown.stdout).toContain("  reason: max_steps reached: 3 steps taken");
    const json = JSON.parse((await ctl(["graph", runId, "--tenant", "t", "--json"])).stdout) as { run: { path: string[]; status: string } };
    expect(json.run).toMatchObject({ path: ["tick", "tick", "tick"], status: "RUN_STATUS_STOPPED" });
    expect((await ctl(["graph", "list", "--tenant", "t"])).stdout).toMatch(new RegExp(`${runId}\\s+stopped\\s+loop\\s+tick\\s+3`));

    // --wait: each step on stderr, the end in one line, exit 1 when the run did not complete.
    const waited = await ctl(["graph", "start", def, "--tenant", "t", "--wait"]);
    expect(waited.code).toBe(1);
    expect(waited.stderr.split("\n").filter((l) => l.startsWith("  step "))).toEqual(["  step 1: tick", "  step 2: tick", "  step 3: tick"]);
    expect(waited.stderr).toMatch(/graph run \S+ stopped after 3 steps: max_steps reached/);
  });
});

describe("aiflowctl machine", () => {
  it("starts a machine, signals it along, and shows its state and history; an event it does not take is one line and exit 2 (a refused argument)", async () => {
    const def = file("door", {
      id: "door",
      initial: "closed",
      states: [
        { name: "closed", transitions: [{ event: "open", to: "opened" }] },
        {
          name: "opened",
          transitions: [
            { event: "close", to: "closed" },
            { event: "count", to: "counted", action: { engineKind: "tick", payloadJson: '{"n": 41}' } },
          ],
        },
        { name: "counted", terminal: true },
      ],
    });
    const runId = (await ctl(["machine", "start", def, "--tenant", "t"])).stdout.trim();
    expect((await ctl(["machine", "signal", runId, "open", "--tenant", "t"])).stdout.trim()).toBe("open: now in opened");
    const refused = await ctl(["machine", "signal", runId, "open", "--tenant", "t"]);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toMatch(/state 'opened' has no transition for event 'open' \(it takes: close, count\)/);
    expect((await ctl(["machine", "signal", runId, "count", "--tenant", "t", "--payload", '{"by":"ann"}'])).stdout.trim()).toBe(
      "count: running the action toward counted",
    );
    await until("the machine ended", async () => (await ctl(["machine", runId, "--tenant", "t", "--json"])).stdout.includes('"live": false'), 30_000, 50);
    const shown = (await ctl(["machine", runId, "--tenant", "t"])).stdout;
    expect(shown).toContain(`machine ${runId}  ended  definition door`);
    expect(shown).toContain("  state:   counted");
    expect(shown).toContain("  history: closed → opened → counted");
    expect(shown).toContain("  reason:  reached terminal state 'counted'");
    expect(shown).toContain('"counted":{"n":42}');
  });
});
