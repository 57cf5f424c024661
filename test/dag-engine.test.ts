/**
 * The DAG engine end to end on one daemon, with real agents over gRPC: linear, diamond and fan-out
 * runs complete with every attempt's workerid an agent name and the results in the run context; a
 * failing node fails the run and ResumeRun completes it running only what had not completed; skip,
 * affinity, stored definitions and WatchRun.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { AttemptStatus, NodeStatus, RunStatus } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import type { Daemon } from "../src/daemon.js";
import { useTestDb } from "./support/kit.js";
import { TestAgent } from "./support/queue.js";
import { chain, DagClient, definition, RetryableError, work, type Handler } from "./support/dag.js";

const fx = useTestDb("dagengine");
let D: Daemon;
let client: DagClient;
let agent: TestAgent;

beforeAll(async () => {
  D = await fx.startDaemon({});
  client = fx.closers.add(new DagClient(D.address));
  agent = fx.closers.add(await TestAgent.register(D.address, "dag-agent-1", { tenants: ["t"], engineKinds: ["dag"], slots: 64 }));
});

const table = (t: "task" | "run" | "checkpoint" | "engine_run" | "work_item") => fx.db.tables.qualified(t);

describe("DAG runs", () => {
  it("a linear chain runs in order, each node's result in the context for the next", async () => {
    const w = work(agent, (_item, p) => ({ got: (p as { step: number }).step, prev: (p as { prev?: unknown }).prev ?? null }));
    try {
      const nodes = chain(3).map((n, i) => ({ ...n, payloadJson: i === 0 ? `{"step":0}` : `{"step":${i},"prev":"{{ context.n${i - 1}.got }}"}` }));
      const run = await client.start("t", definition(nodes, { id: "chain3" }), { seed: 1 });
      expect(run.status).toBe(RunStatus.RUNNING);
      const done = await client.until("t", run.id, RunStatus.COMPLETED);
      expect(JSON.parse(done.contextJson)).toEqual({ seed: 1, n0: { got: 0, prev: null }, n1: { got: 1, prev: 0 }, n2: { got: 2, prev: 1 } });
      expect(done.nodes.map((n) => n.status)).toEqual([NodeStatus.COMPLETED, NodeStatus.COMPLETED, NodeStatus.COMPLETED]);
      for (const n of done.nodes) {
        expect(n.attempts).toHaveLength(1);
        expect(n.attempts[0]).toMatchObject({ worker: "dag-agent-1", status: AttemptStatus.COMPLETED, attempt: 1, iteration: -1 });
      }
      expect(w.ran.map((i) => i.taskName)).toEqual(["n0", "n1", "n2"]);
      // The work items say what they are for: the run, the attempt's row, the node.
      for (const i of w.ran) expect(i.runId).toBe(run.id);
      const rows = await fx.db.raw<{ id: string; workerid: string; name: string }>(
        `SELECT id, workerid, name FROM ${table("task")} WHERE runid = $1 ORDER BY name`,
        [run.id],
      );
      expect(rows.map((r) => [r.name, r.workerid])).toEqual([
        ["n0", "dag-agent-1"],
        ["n1", "dag-agent-1"],
        ["n2", "dag-agent-1"],
      ]);
      expect(new Set(w.ran.map((i) => i.taskId))).toEqual(new Set(rows.map((r) => r.id)));
      const dir = await fx.db.raw(`SELECT engine_kind, ended_on::text AS ended_on, definition_id, tenant_key FROM ${table("engine_run")} WHERE run_id = $1`, [
        run.id,
      ]);
      expect(dir).toEqual([{ engine_kind: "dag", ended_on: done.endTime!.toString(), definition_id: "chain3", tenant_key: "t" }]);
      const [row] = await fx.db.raw<{ runtype: string; state: string; duration: string; starttime: string }>(
        `SELECT runtype, states -> -1 ->> 'state' AS state, duration::text, starttime::text FROM ${table("run")} WHERE id = $1`,
        [run.id],
      );
      expect(row).toMatchObject({ runtype: "dag", state: "completed" });
      expect(BigInt(row!.duration)).toBe(done.endTime! - BigInt(row!.starttime));
    } finally {
      await w.stop();
    }
  });

  it("a diamond's join starts only after both branches, and reads both results", async () => {
    const w = work(agent, (item, p) =>
      item.taskName === "d"
        ? { sum: (p as { b: number; c: number }).b + (p as { b: number; c: number }).c }
        : { v: item.taskName === "b" ? 2 : item.taskName === "c" ? 3 : 1 },
    );
    try {
      const run = await client.start(
        "t",
        definition([
          { name: "a" },
          { name: "b", dependsOn: ["a"] },
          { name: "c", dependsOn: ["a"] },
          { name: "d", dependsOn: ["b", "c"], payloadJson: `{"b":"{{ context.b.v }}","c":"{{ context.c.v }}"}` },
        ]),
      );
      const done = await client.until("t", run.id, RunStatus.COMPLETED);
      expect(JSON.parse(done.contextJson).d).toEqual({ sum: 5 });
      const order = w.ran.map((i) => i.taskName);
      expect(order[0]).toBe("a");
      expect(order.at(-1)).toBe("d");
      expect(order).toHaveLength(4);
    } finally {
      await w.stop();
    }
  });

  it("a fan-out runs one iteration per element, its results in element order, its checkpoint complete", async () => {
    const w = work(agent, (item, p) => {
      if (item.taskName === "split") return { items: Array.from({ length: 50 }, (_, i) => i + 1) };
      if (item.taskName === "join") return { total: (p as { squares: number[] }).squares.reduce((x, y) => x + y, 0) };
      const { x, i } = p as { x: number; i: number };
      expect(item.taskName).toBe(`sq[${i}]`);
      return x * x;
    });
    try {
      const run = await client.start(
        "t",
        definition([
          { name: "split" },
          {
            name: "sq",
            dependsOn: ["split"],
            fanOut: "context.split.items",
            payloadJson: `{"x":"{{ item }}","i":"{{ index }}","label":"item {{ index }} of {{ run_id }}"}`,
          },
          { name: "join", dependsOn: ["sq"], payloadJson: `{"squares":"{{ context.sq }}"}` },
        ]),
      );
      const done = await client.until("t", run.id, RunStatus.COMPLETED);
      const ctx = JSON.parse(done.contextJson);
      expect(ctx.sq).toEqual(Array.from({ length: 50 }, (_, i) => (i + 1) * (i + 1)));
      expect(ctx.join).toEqual({ total: 42925 });
      const sq = done.nodes.find((n) => n.name === "sq")!;
      expect(sq).toMatchObject({ status: NodeStatus.COMPLETED, iterations: 50, iterationsDone: 50 });
      expect(sq.attempts.map((a) => a.name).sort()).toEqual(Array.from({ length: 50 }, (_, i) => `sq[${i}]`).sort());
      const cps = await fx.db.raw(`SELECT node_name, iterator_type, cursor, idx::int, total::int, done FROM ${table("checkpoint")} WHERE run_id = $1`, [
        run.id,
      ]);
      expect(cps).toEqual([{ node_name: "sq", iterator_type: "map", cursor: "0-49", idx: 50, total: 50, done: true }]);
      const labels = w.ran.filter((i) => i.taskName.startsWith("sq[")).map((i) => JSON.parse(i.payloadJson).label as string);
      expect(labels).toContain(`item 7 of ${run.id}`);
    } finally {
      await w.stop();
    }
  });

  it("a failed node fails the run; ResumeRun re-runs only the failed iterations and nodes, then completes", async () => {
    const failOnce = new Set([7, 13]);
    let flakyFails = 1;
    const handler: Handler = (item, p) => {
      if (item.taskName === "split") return { items: Array.from({ length: 20 }, (_, i) => i) };
      if (item.taskName === "flaky") {
        if (flakyFails-- > 0) throw new Error("flaky broke");
        return "fine";
      }
      if (item.taskName === "join") return "joined";
      const { x } = p as { x: number };
      if (failOnce.delete(x)) throw new Error(`iteration ${x} broke`);
      return x;
    };
    let w = work(agent, handler);
    const ran = () => w.ran;
    try {
      const run = await client.start(
        "t",
        definition([
          { name: "split" },
          { name: "sq", dependsOn: ["split"], fanOut: "context.split.items", payloadJson: `{"x":"{{ item }}"}` },
          { name: "join", dependsOn: ["sq"] },
          { name: "flaky", dependsOn: ["join"] },
        ]),
      );
      const failed = await client.until("t", run.id, RunStatus.FAILED);
      expect(failed.reason).toMatch(/node 'sq' failed: iteration (7|13): iteration (7|13) broke/);
      // The other iterations were left to finish: all 18 completed, and the checkpoint says so.
      await expectEventually(async () => (await client.get("t", run.id)).nodes.find((n) => n.name === "sq")!.iterationsDone === 18);
      const [cp] = await fx.db.raw<{ idx: number; done: boolean }>(`SELECT idx::int, done FROM ${table("checkpoint")} WHERE run_id = $1`, [run.id]);
      expect(cp).toEqual({ idx: 18, done: false });
      const dirEnded = await fx.db.raw<{ ended_on: string | null }>(`SELECT ended_on::text AS ended_on FROM ${table("engine_run")} WHERE run_id = $1`, [
        run.id,
      ]);
      expect(dirEnded[0]!.ended_on).not.toBeNull();

      // With no agent working, the resumed run is seen live again, in the directory too.
      await w.stop();
      const before = w.ran;
      const resumed = (await client.dag.resumeRun({ tenantKey: "t", runId: run.id })).run!;
      expect(resumed.status).toBe(RunStatus.RUNNING);
      expect(resumed.endTime).toBeUndefined();
      const reopened = await fx.db.raw<{ ended_on: string | null }>(`SELECT ended_on::text AS ended_on FROM ${table("engine_run")} WHERE run_id = $1`, [
        run.id,
      ]);
      expect(reopened).toEqual([{ ended_on: null }]);
      w = work(agent, handler);
      const failedAgain = await client.until("t", run.id, RunStatus.FAILED);
      expect(failedAgain.reason).toBe("node 'flaky' failed: flaky broke");
      await client.dag.resumeRun({ tenantKey: "t", runId: run.id });
      const done = await client.until("t", run.id, RunStatus.COMPLETED);
      const ctx = JSON.parse(done.contextJson);
      expect(ctx.sq).toEqual(Array.from({ length: 20 }, (_, i) => i));
      // Counted from what the agent ran: split and join once, every iteration once but 7 and 13 twice, flaky twice.
      const runs = new Map<string, number>();
      for (const i of [...before, ...ran()]) runs.set(i.taskName, (runs.get(i.taskName) ?? 0) + 1);
      expect(runs.get("split")).toBe(1);
      expect(runs.get("join")).toBe(1);
      expect(runs.get("flaky")).toBe(2);
      for (let i = 0; i < 20; i++) expect(runs.get(`sq[${i}]`), `sq[${i}]`).toBe(i === 7 || i === 13 ? 2 : 1);
      const sq = done.nodes.find((n) => n.name === "sq")!;
      expect(
        sq.attempts
          .filter((a) => a.attempt === 2)
          .map((a) => a.iteration)
          .sort((a, b) => a - b),
      ).toEqual([7, 13]);
      expect(done.nodes.find((n) => n.name === "flaky")!.attempts.map((a) => [a.attempt, a.status])).toEqual([
        [1, AttemptStatus.FAILED],
        [2, AttemptStatus.COMPLETED],
      ]);
      const ended = await fx.db.raw<{ ended_on: string | null }>(`SELECT ended_on::text AS ended_on FROM ${table("engine_run")} WHERE run_id = $1`, [run.id]);
      expect(ended[0]!.ended_on).toBe(done.endTime!.toString());
      // The states history tells the story.
      const [hist] = await fx.db.raw<{ s: string[] }>(
        `SELECT array(SELECT e ->> 'state' FROM jsonb_array_elements(states) e) AS s FROM ${table("run")} WHERE id = $1`,
        [run.id],
      );
      expect(hist!.s).toEqual(["running", "failed", "running", "failed", "running", "completed"]);
    } finally {
      await w.stop();
    }
  });

  it("a node's retries are its work item's: a retryable failure within max_retries does not fail the node, past them it does", async () => {
    let left = 1;
    const w = work(agent, (item) => {
      if (item.taskName === "retried" && left-- > 0) throw new RetryableError("transient");
      if (item.taskName === "exhausted") throw new RetryableError("always");
      return item.retryCount;
    });
    try {
      const ok = await client.start("t", definition([{ name: "retried", maxRetries: 1 }]));
      const done = await client.until("t", ok.id, RunStatus.COMPLETED);
      expect(JSON.parse(done.contextJson)).toEqual({ retried: 1 });
      expect(done.nodes[0]!.attempts).toHaveLength(1);
      const bad = await client.start("t", definition([{ name: "exhausted", maxRetries: 2 }]));
      const failed = await client.until("t", bad.id, RunStatus.FAILED);
      expect(failed.reason).toBe("node 'exhausted' failed: always");
      expect(w.ran.filter((i) => i.taskName === "exhausted")).toHaveLength(3);
    } finally {
      await w.stop();
    }
  });

  it("a node that may be skipped does not fail the run: its dependents run without its result", async () => {
    const w = work(agent, (item) => {
      if (item.taskName === "optional") throw new Error("not today");
      return item.taskName;
    });
    try {
      const run = await client.start(
        "t",
        definition([
          { name: "optional", skip: true },
          { name: "after", dependsOn: ["optional"] },
        ]),
      );
      const done = await client.until("t", run.id, RunStatus.COMPLETED);
      expect(done.nodes.map((n) => [n.name, n.status, n.error])).toEqual([
        ["optional", NodeStatus.SKIPPED, "not today"],
        ["after", NodeStatus.COMPLETED, ""],
      ]);
      expect(JSON.parse(done.contextJson)).toEqual({ after: "after" });
    } finally {
      await w.stop();
    }
  });

  it("affinity run pins every node of a run to the agent that took its first", async () => {
    const other = fx.closers.add(await TestAgent.register(D.address, "dag-agent-2", { tenants: ["t"], engineKinds: ["dag"], slots: 64 }));
    const w1 = work(agent, (item) => item.taskName);
    const w2 = work(other, (item) => item.taskName);
    try {
      const runs = await Promise.all(Array.from({ length: 4 }, () => client.start("t", definition(chain(6), { runAffinity: true }))));
      for (const r of runs) {
        const done = await client.until("t", r.id, RunStatus.COMPLETED);
        const workers = new Set(done.nodes.map((n) => n.attempts[0]!.worker));
        expect(workers.size, `run ${r.id}`).toBe(1);
      }
      const keys = await fx.db.raw<{ affinity_key: string }>(`SELECT DISTINCT affinity_key FROM ${table("work_item")} WHERE run_id = ANY($1)`, [
        runs.map((r) => r.id),
      ]);
      expect(keys.map((k) => k.affinity_key).sort()).toEqual(runs.map((r) => `run:${r.id}`).sort());
    } finally {
      await Promise.all([w1.stop(), w2.stop()]);
    }
  });

  it("a stored definition starts by id; the run keeps the plan it started with", async () => {
    const w = work(agent, (item) => item.taskName);
    try {
      const put = await client.dag.putDefinition({ tenantKey: "t", definition: definition(chain(2), { id: "stored-chain" }) });
      expect(put).toMatchObject({ definitionId: "stored-chain", created: true });
      const run = (await client.dag.startRun({ tenantKey: "t", source: { case: "definitionId", value: "stored-chain" } })).run!;
      const again = await client.dag.putDefinition({ tenantKey: "t", definition: definition(chain(5), { id: "stored-chain" }) });
      expect(again.created).toBe(false);
      const done = await client.until("t", run.id, RunStatus.COMPLETED);
      expect(done.definitionId).toBe("stored-chain");
      expect(done.nodes).toHaveLength(2);
    } finally {
      await w.stop();
    }
  });

  it("WatchRun sends the run now and after each change, and ends with the ended run", async () => {
    const held: { id: string; leaseToken: string }[] = [];
    const run = await client.start("t", definition(chain(2)));
    const seen: RunStatus[] = [];
    const nodeStates: string[] = [];
    const attempts: number[] = [];
    const watching = (async () => {
      for await (const m of client.dag.watchRun({ tenantKey: "t", runId: run.id, withAttempts: true })) {
        seen.push(m.run!.status);
        attempts.push(m.run!.nodes.reduce((n, node) => n + node.attempts.length, 0));
        nodeStates.push(m.run!.nodes.map((n) => NodeStatus[n.status]).join(","));
      }
    })();
    await expectEventually(async () => seen.length >= 1);
    for (let i = 0; i < 2; i++) {
      let items: Awaited<ReturnType<TestAgent["claim"]>> = [];
      await expectEventually(async () => (items = await agent.claim(1, 100)).length === 1);
      held.push(...items);
      await agent.complete(items, i);
    }
    await watching;
    expect(seen[0]).toBe(RunStatus.RUNNING);
    expect(seen.at(-1)).toBe(RunStatus.COMPLETED);
    expect(nodeStates.at(-1)).toBe("COMPLETED,COMPLETED");
    expect(nodeStates).toContain("COMPLETED,RUNNING");
    expect(attempts.at(-1)).toBe(2);
    // Without with_attempts, the nodes' states alone.
    const quiet = await client.dag.watchRun({ tenantKey: "t", runId: run.id })[Symbol.asyncIterator]().next();
    expect(quiet.value.run.nodes.map((n: { attempts: unknown[] }) => n.attempts.length)).toEqual([0, 0]);
  });
});

async function expectEventually(check: () => Promise<boolean>): Promise<void> {
  const { until } = await import("./support/kit.js");
  await until("the condition holds", check, 20_000, 20);
}
