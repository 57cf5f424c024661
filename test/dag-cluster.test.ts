/**
 * A 1,000-node DAG on two daemon processes, run by three SDK agent processes, with one daemon
 * killed -9 mid-run and started again. No advance is lost (the run completes, every node once)
 * and none is doubled (one attempt row and one work item per node): the advance of a run and the
 * deletion of the events it applies commit together, and daemons lock runs with SKIP LOCKED.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RunStatus } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { startChild, type Child } from "../bench/proc.js";
import { DAEMON_NODE_TUNING, NODE_TUNING } from "../bench/env.js";
import { freePort } from "./support/free-port.js";
import { makeTempDir, removeTempDir } from "./support/temp-dir.js";
import { until, useTestDb } from "./support/kit.js";
import { DagClient, definition, type NodeSpec } from "./support/dag.js";

const AGENT_TOKEN = "dag-cluster-agent-token";
const RUNS_TOKEN = "dag-cluster-runs-token";
const LAYERS = 10;
const WIDTH = 100;

const fx = useTestDb("dagcluster");
let dir: string;
let ports: number[];
const daemons: (Child | undefined)[] = [];
const agents: Child[] = [];

const addresses = () => ports.map((p) => `127.0.0.1:${p}`);

async function startDaemon(i: number): Promise<void> {
  const child = startChild("bin/aiflowd.js", ["serve"], {
    nodeArgs: DAEMON_NODE_TUNING,
    stderr: "inherit",
    env: {
      DATABASE_URL: fx.db.url,
      AIFLOW_SCHEMA: fx.db.schema,
      AIFLOW_LISTEN: addresses()[i]!,
      AIFLOW_INSTANCE_ID: `dag-daemon-${i}`,
      AIFLOW_TOKENS: `agent:${AGENT_TOKEN};runs:${RUNS_TOKEN}`,
      AIFLOW_LOG_LEVEL: "info",
      AIFLOW_HTTP_LISTEN: "off",
      AIFLOW_AUDIT_LOG: join(dir, `daemon-${i}.audit.jsonl`),
      NO_COLOR: "1",
    },
    ready: (line) => line.includes("aiflowd serving gRPC"),
  });
  daemons[i] = child;
  await child.ready;
}

beforeAll(async () => {
  dir = await makeTempDir("dag-cluster");
  ports = [await freePort(), await freePort()];
  await Promise.all([startDaemon(0), startDaemon(1)]);
  for (let i = 0; i < 3; i++) {
    const child = startChild(
      "bench/chaos/child-agent.ts",
      [addresses().join(","), AGENT_TOKEN, `dag-sdk-agent-${i}`, "t", "dag", "16", "1", "4", join(dir, `agent-${i}.jsonl`), join(dir, `agent-${i}.log`)],
      { nodeArgs: NODE_TUNING, stderr: "inherit", ready: (line) => line.includes('"ready":true') },
    );
    agents.push(child);
    await child.ready;
  }
}, 60_000);

afterAll(async () => {
  await Promise.all(agents.map((a) => a.stop(5_000)));
  await Promise.all(daemons.map((d) => d?.stop(5_000)));
  await removeTempDir(dir);
});

/** Ten layers of a hundred: each node waits for two of the layer before it. */
function layered(): NodeSpec[] {
  const nodes: NodeSpec[] = [];
  for (let l = 0; l < LAYERS; l++)
    for (let i = 0; i < WIDTH; i++) nodes.push({ name: `l${l}-${i}`, dependsOn: l === 0 ? [] : [`l${l - 1}-${i}`, `l${l - 1}-${(i + 1) % WIDTH}`] });
  return nodes;
}

describe("a DAG run across daemons", () => {
  it("kill -9 of a daemon in the middle of a 1,000-node run loses no advance and doubles none", { timeout: 180_000 }, async () => {
    const client = new DagClient(addresses()[1]!, RUNS_TOKEN);
    try {
      const run = await client.start("t", definition(layered(), { id: "layered" }));
      const completedTasks = async () =>
        Number(
          (
            await fx.db.raw<{ n: string }>(
              `SELECT count(*) AS n FROM ${fx.db.tables.qualified("task")} WHERE runid = $1 AND states -> -1 ->> 'state' = 'completed'`,
              [run.id],
            )
          )[0]!.n,
        );
      await until("a third of the run has completed", async () => (await completedTasks()) >= 300, 120_000, 20);
      daemons[0]!.proc.kill("SIGKILL");
      await daemons[0]!.exited;
      await until("two thirds of the run have completed with one daemon", async () => (await completedTasks()) >= 650, 120_000, 20);
      await startDaemon(0);
      const done = await client.until("t", run.id, RunStatus.COMPLETED, 150_000);
      expect(done.nodes).toHaveLength(LAYERS * WIDTH);
      expect(Object.keys(JSON.parse(done.contextJson))).toHaveLength(LAYERS * WIDTH);
      // One attempt row and one work item per node: no advance ran twice for one completion.
      const tasks = await fx.db.raw<{ name: string; n: string; state: string }>(
        `SELECT name, count(*) AS n, min(states -> -1 ->> 'state') AS state FROM ${fx.db.tables.qualified("task")} WHERE runid = $1 GROUP BY name HAVING count(*) > 1 OR min(states -> -1 ->> 'state') <> 'completed'`,
        [run.id],
      );
      expect(tasks).toEqual([]);
      const [counts] = await fx.db.raw<{ tasks: string; items: string; names: string; workers: string[] }>(
        `SELECT (SELECT count(*) FROM ${fx.db.tables.qualified("task")} WHERE runid = $1) AS tasks,
                (SELECT count(*) FROM ${fx.db.tables.qualified("work_item")} WHERE run_id = $1 AND status = 'completed') AS items,
                (SELECT count(DISTINCT task_name) FROM ${fx.db.tables.qualified("work_item")} WHERE run_id = $1) AS names,
                (SELECT array_agg(DISTINCT workerid ORDER BY workerid) FROM ${fx.db.tables.qualified("task")} WHERE runid = $1) AS workers`,
        [run.id],
      );
      expect(counts).toEqual({ tasks: "1000", items: "1000", names: "1000", workers: ["dag-sdk-agent-0", "dag-sdk-agent-1", "dag-sdk-agent-2"] });
      expect(await fx.db.raw(`SELECT * FROM ${fx.db.tables.qualified("engine_event")} WHERE engine_kind = 'dag' AND run_id = $1`, [run.id])).toEqual([]);
      // The agents' own records: every work item of the run was run, by the three of them.
      const ranIds = new Set(
        [0, 1, 2].flatMap((i) =>
          readFileSync(join(dir, `agent-${i}.jsonl`), "utf8")
            .split("\n")
            .filter((l) => l.startsWith('{"run"'))
            .map((l) => (JSON.parse(l) as { run: string }).run),
        ),
      );
      const itemIds = await fx.db.raw<{ id: string }>(`SELECT id FROM ${fx.db.tables.qualified("work_item")} WHERE run_id = $1`, [run.id]);
      for (const { id } of itemIds) expect(ranIds.has(id), id).toBe(true);
    } finally {
      client.close();
    }
  });
});
