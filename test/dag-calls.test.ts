/**
 * DagService's calls and refusals: cancel stops a run and the work its agents hold; signals reach
 * wait nodes, before or after they are reached; timeouts by the daemon's clock; idempotency keys;
 * runs are the caller's own (another caller's run is NOT_FOUND, a token of another tenant or role is
 * refused); every bad definition is refused naming what is wrong, with no row written; the audit
 * stream of aiflow_run and aiflow_task carries field names and ids, never values.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { DagOpsService, NodeStatus, RunStatus } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { captureLog } from "./support/agents.js";
import { TOKENS } from "./support/daemon.js";
import { codeOf, refusal, until, useTestDb } from "./support/kit.js";
import { TestAgent } from "./support/queue.js";
import { chain, DagClient, definition, work, type NodeSpec } from "./support/dag.js";

const clock = new FakeClock(Date.UTC(2026, 11, 1));
const captured = captureLog("info");
const fx = useTestDb("dagcalls");
let D: Daemon;
let client: DagClient;
let agent: TestAgent;

beforeAll(async () => {
  D = await fx.startDaemon({ clock, log: captured.log, config: { sweepInterval: 3_600_000, dagMaxNodes: 100 } });
  client = fx.closers.add(new DagClient(D.address));
  agent = fx.closers.add(await TestAgent.register(D.address, "calls-agent", { tenants: ["t"], engineKinds: ["dag"], slots: 64 }));
});

const table = (t: "task" | "run" | "work_item" | "checkpoint" | "engine_run") => fx.db.tables.qualified(t);
const count = async (t: "task" | "run" | "work_item" | "checkpoint" | "engine_run") =>
  Number((await fx.db.raw<{ n: string }>(`SELECT count(*) AS n FROM ${table(t)}`))[0]!.n);
const claimOne = async () => {
  let items: Awaited<ReturnType<TestAgent["claim"]>> = [];
  await until("the agent claims an item", async () => (items = await agent.claim(1, 100)).length === 1, 20_000, 1);
  return items[0]!;
};

describe("DagService calls", () => {
  it("CancelRun cancels the run, its pending nodes and the item an agent holds (whose completion is then refused)", async () => {
    const run = await client.start("t", definition(chain(3)));
    const held = await claimOne();
    expect(held.taskName).toBe("n0");
    const cancelled = (await client.dag.cancelRun({ tenantKey: "t", runId: run.id, reason: "not needed" })).run!;
    expect(cancelled.status).toBe(RunStatus.CANCELLED);
    expect(cancelled.reason).toBe("not needed");
    expect(cancelled.nodes.map((n) => n.status)).toEqual([NodeStatus.CANCELLED, NodeStatus.CANCELLED, NodeStatus.CANCELLED]);
    expect((await agent.complete([held], "late")).map((o) => [o.ok, o.code])).toEqual([[false, Code.FailedPrecondition]]);
    const items = await fx.db.raw<{ status: string }>(`SELECT status FROM ${table("work_item")} WHERE run_id = $1`, [run.id]);
    expect(items).toEqual([{ status: "cancelled" }]);
    // Applying the cancelled item's event later changes nothing, and nothing more is queued.
    await D.maintenance.runOnce();
    expect((await client.get("t", run.id)).status).toBe(RunStatus.CANCELLED);
    expect(await fx.db.raw(`SELECT status FROM ${table("work_item")} WHERE run_id = $1`, [run.id])).toHaveLength(1);
    const metrics = await D.metrics.registry.getMetricsAsJSON();
    const ended = metrics.find((m) => m.name === "aiflow_engine_runs_ended_total")!.values;
    expect(ended.find((v) => v.labels.engine === "dag" && v.labels.status === "cancelled")?.value).toBe(1);
    const steps = metrics
      .find((m) => m.name === "aiflow_engine_step_seconds")!
      .values.filter((v) => (v as { metricName?: string }).metricName === "aiflow_engine_step_seconds_count" && v.labels.engine === "dag");
    expect(new Set(steps.map((v) => v.labels.kind))).toEqual(new Set(["start", "cancel", "advance"]));
    const e = await refusal(client.dag.cancelRun({ tenantKey: "t", runId: run.id }));
    expect(e.code).toBe(Code.FailedPrecondition);
    expect(e.rawMessage).toMatch(/is cancelled; only a running run can be cancelled/);
  });

  it("a signal reaches a waiting node, or waits for it when it is not reached yet", async () => {
    const w = work(agent, (item, p) => (item.taskName === "after" ? p : "a-done"));
    try {
      const def = definition([
        { name: "a" },
        { name: "approve", wait: true, event: "approved", dependsOn: ["a"] },
        { name: "after", dependsOn: ["approve"], payloadJson: `{"by":"{{ context.approve.by }}"}` },
      ]);
      // Early: kept, then taken when the node is reached.
      await w.stop();
      const early = await client.start("t", def);
      const sig = await client.dag.signalRun({ tenantKey: "t", runId: early.id, event: "approved", payloadJson: `{"by":"ann"}` });
      expect(sig.delivered).toBe(false);
      const w2 = work(agent, (item, p) => (item.taskName === "after" ? p : "a-done"));
      try {
        const done = await client.until("t", early.id, RunStatus.COMPLETED);
        expect(JSON.parse(done.contextJson)).toMatchObject({ approve: { by: "ann" }, after: { by: "ann" } });
        // On time: the node waits, the signal completes it.
        const onTime = await client.start("t", def);
        await until("the wait node waits", async () => (await client.get("t", onTime.id)).nodes[1]!.status === NodeStatus.WAITING, 20_000, 10);
        const sig2 = await client.dag.signalRun({ tenantKey: "t", runId: onTime.id, event: "approved", payloadJson: `{"by":"bob"}` });
        expect(sig2.delivered).toBe(true);
        const done2 = await client.until("t", onTime.id, RunStatus.COMPLETED);
        expect(JSON.parse(done2.contextJson).after).toEqual({ by: "bob" });
        // An event no node waits for, and a run that ended.
        const bad = await refusal(client.dag.signalRun({ tenantKey: "t", runId: onTime.id, event: "nope" }));
        expect([bad.code, bad.rawMessage]).toEqual([Code.InvalidArgument, `event: no wait node of run '${onTime.id}' waits for 'nope'`]);
        expect(await codeOf(client.dag.signalRun({ tenantKey: "t", runId: onTime.id, event: "approved" }))).toBe(Code.FailedPrecondition);
        expect(await codeOf(client.dag.signalRun({ tenantKey: "t", runId: onTime.id, event: "approved", payloadJson: "{nope" }))).toBe(Code.InvalidArgument);
      } finally {
        await w2.stop();
      }
    } finally {
      await w.stop();
    }
  });

  it("timeouts by the daemon's clock: a wait node that waits too long, and a task held too long, fail the run", async () => {
    const waiting = await client.start("t", definition([{ name: "w", wait: true, event: "go", timeoutMs: 5_000 }]));
    const task = await client.start("t", definition([{ name: "slow", timeoutMs: 10_000, engineKind: "dag-slow" }]));
    const slowAgent = fx.closers.add(await TestAgent.register(D.address, "slow-agent", { tenants: ["t"], engineKinds: ["dag-slow"] }));
    let held: Awaited<ReturnType<TestAgent["claim"]>> = [];
    await until("the slow node is claimed", async () => (held = await slowAgent.claim(1, 100)).length === 1, 20_000, 1);
    clock.advance(6_000);
    await D.maintenance.runOnce();
    const w = await client.get("t", waiting.id);
    expect([w.status, w.reason]).toEqual([RunStatus.FAILED, "node 'w' failed: timed out after 5000 ms"]);
    expect((await client.get("t", task.id)).status).toBe(RunStatus.RUNNING);
    clock.advance(5_000);
    await D.maintenance.runOnce();
    const t = await client.get("t", task.id);
    expect([t.status, t.reason]).toEqual([RunStatus.FAILED, "node 'slow' failed: timed out after 10000 ms"]);
    expect((await slowAgent.complete(held, "too late")).map((o) => [o.ok, o.code])).toEqual([[false, Code.FailedPrecondition]]);
    expect(await fx.db.raw(`SELECT status, error FROM ${table("work_item")} WHERE run_id = $1`, [task.id])).toEqual([
      { status: "cancelled", error: "the node timed out" },
    ]);
    // An attempt that ends in time takes its timeout with it.
    const quick = await client.start("t", definition([{ name: "quick", timeoutMs: 60_000, engineKind: "dag-slow" }]));
    let item: Awaited<ReturnType<TestAgent["claim"]>> = [];
    await until("the quick node is claimed", async () => (item = await slowAgent.claim(1, 100)).length === 1, 20_000, 1);
    expect(await fx.db.raw(`SELECT kind FROM ${fx.db.tables.qualified("engine_event")} WHERE engine_kind = 'dag' AND run_id = $1`, [quick.id])).toEqual([
      { kind: "timeout" },
    ]);
    await slowAgent.complete(item, "in time");
    await client.until("t", quick.id, RunStatus.COMPLETED);
    expect(await fx.db.raw(`SELECT kind FROM ${fx.db.tables.qualified("engine_event")} WHERE engine_kind = 'dag' AND run_id = $1`, [quick.id])).toEqual([]);
  });

  it("an idempotency key starts one run per caller", async () => {
    const a = await client.dag.startRun({ tenantKey: "t", source: { case: "definition", value: definition(chain(1)) }, idempotencyKey: "once" });
    const b = await client.dag.startRun({ tenantKey: "t", source: { case: "definition", value: definition(chain(1)) }, idempotencyKey: "once" });
    expect([a.existing, b.existing, b.run!.id]).toEqual([false, true, a.run!.id]);
    const other = fx.closers.add(new DagClient(D.address, TOKENS.runs2));
    const c = await other.dag.startRun({ tenantKey: "t", source: { case: "definition", value: definition(chain(1)) }, idempotencyKey: "once" });
    expect(c.existing).toBe(false);
    expect(c.run!.id).not.toBe(a.run!.id);
  });

  it("runs are their caller's: another caller's run is NOT_FOUND everywhere; other tenants' and roles' tokens are refused", async () => {
    const mine = await client.start("t", definition(chain(1)));
    const other = fx.closers.add(new DagClient(D.address, TOKENS.runs2));
    const unknown = await refusal(other.dag.getRun({ tenantKey: "t", runId: "01JZZZZZZZZZZZZZZZZZZZZZZZ" }));
    const theirs = await refusal(other.dag.getRun({ tenantKey: "t", runId: mine.id }));
    expect(theirs.code).toBe(Code.NotFound);
    expect(theirs.rawMessage).toBe(unknown.rawMessage.replace("01JZZZZZZZZZZZZZZZZZZZZZZZ", mine.id));
    for (const call of [
      () => other.dag.cancelRun({ tenantKey: "t", runId: mine.id }),
      () => other.dag.resumeRun({ tenantKey: "t", runId: mine.id }),
      () => other.dag.signalRun({ tenantKey: "t", runId: mine.id, event: "x" }),
      async () => {
        for await (const _ of other.dag.watchRun({ tenantKey: "t", runId: mine.id })) return;
      },
    ])
      expect(await codeOf(call())).toBe(Code.NotFound);
    expect((await other.dag.listRuns({ tenantKey: "t", pageSize: 500 })).runs.map((r) => r.id)).not.toContain(mine.id);
    expect((await client.dag.listRuns({ tenantKey: "t", pageSize: 500 })).runs.map((r) => r.id)).toContain(mine.id);
    const t1 = fx.closers.add(new DagClient(D.address, TOKENS.runsT1));
    expect(await codeOf(t1.dag.getRun({ tenantKey: "t", runId: mine.id }))).toBe(Code.PermissionDenied);
    const engine = fx.closers.add(new DagClient(D.address, TOKENS.engine));
    expect(await codeOf(engine.dag.getRun({ tenantKey: "t", runId: mine.id }))).toBe(Code.PermissionDenied);
  });

  it("ListRuns pages newest first and filters by status and definition", async () => {
    const lister = fx.closers.add(new DagClient(D.address, TOKENS.runs2));
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      ids.push((await lister.start("list", definition(chain(1), { id: i % 2 === 0 ? "even" : "odd" }))).id);
      clock.advance(1);
    }
    await lister.dag.cancelRun({ tenantKey: "list", runId: ids[0]! });
    const seen: string[] = [];
    let pageToken = "";
    do {
      const page = await lister.dag.listRuns({ tenantKey: "list", pageSize: 2, pageToken });
      expect(page.runs.length).toBeLessThanOrEqual(2);
      seen.push(...page.runs.map((r) => r.id));
      pageToken = page.nextPageToken;
    } while (pageToken);
    expect(seen).toEqual([...ids].reverse());
    expect((await lister.dag.listRuns({ tenantKey: "list", statuses: [RunStatus.CANCELLED] })).runs.map((r) => r.id)).toEqual([ids[0]]);
    expect((await lister.dag.listRuns({ tenantKey: "list", definitionId: "odd" })).runs.map((r) => r.id)).toEqual([ids[3], ids[1]]);
    const first = await lister.dag.listRuns({ tenantKey: "list", pageSize: 1 });
    expect(await codeOf(lister.dag.listRuns({ tenantKey: "list", pageSize: 1, definitionId: "odd", pageToken: first.nextPageToken }))).toBe(
      Code.InvalidArgument,
    );
  });

  it("every bad definition is refused naming what is wrong, and writes nothing", async () => {
    const before = await Promise.all((["run", "task", "work_item", "checkpoint", "engine_run"] as const).map(count));
    const cases: [NodeSpec[], Code, RegExp][] = [
      [
        [
          { name: "a", dependsOn: ["c"] },
          { name: "b", dependsOn: ["a"] },
          { name: "c", dependsOn: ["b"] },
        ],
        Code.InvalidArgument,
        /^node 'a': is on a cycle: a -> c -> b -> a$/,
      ],
      [[{ name: "a", dependsOn: ["ghost"] }], Code.InvalidArgument, /^node 'a'.depends_on: names 'ghost', which is not a node of the definition$/],
      [[{ name: "a", dependsOn: ["a"] }], Code.InvalidArgument, /^node 'a'.depends_on: names the node itself$/],
      [[{ name: "a" }, { name: "a" }], Code.InvalidArgument, /^node 'a': is a duplicate name/],
      [[{ name: "bad name!" }], Code.InvalidArgument, /^nodes\[0\].name: 'bad name!' must be 1-128/],
      [[{ name: "a", payloadJson: `{"x":"{{ context.a"}` }], Code.InvalidArgument, /^node 'a'.payload_json: bad template: .* unclosed/],
      [
        [{ name: "a", payloadJson: `{"x":"{{ secrets.a }}"}` }],
        Code.InvalidArgument,
        /^node 'a'.payload_json: bad template: 'secrets.a' must start with context, item, index, run_id$/,
      ],
      [[{ name: "a", payloadJson: `{"x":"{{ item }}"}` }], Code.InvalidArgument, /^node 'a'.payload_json: uses item or index, which only a fan-out node has$/],
      [[{ name: "a", payloadJson: `{"x":` }], Code.InvalidArgument, /^node 'a'.payload_json: is not valid JSON: .* at position \d+$/],
      [[{ name: "a", fanOut: "item.list" }], Code.InvalidArgument, /^node 'a'.fan_out: 'item.list' must be a path into the run context/],
      [[{ name: "a", fanOut: "context.list..x" }], Code.InvalidArgument, /^node 'a'.fan_out: 'context.list..x' has/],
      [[{ name: "w", wait: true }], Code.InvalidArgument, /^node 'w'.event: is required for a wait node$/],
      [[{ name: "a", engineKind: "" }], Code.InvalidArgument, /^node 'a'.engine_kind: is required$/],
      [[{ name: "a", maxRetries: -1 }], Code.InvalidArgument, /^node 'a'.max_retries: -1 is outside 0..1000$/],
      [[{ name: "a", workerParams: { requirements: { gpus: -1 } } }], Code.InvalidArgument, /^node 'a'.worker_params.requirements/],
      [Array.from({ length: 101 }, (_, i) => ({ name: `n${i}` })), Code.ResourceExhausted, /^the definition has 101 nodes; the limit is 100$/],
      [[], Code.InvalidArgument, /^definition.nodes: needs at least one node$/],
    ];
    for (const [nodes, code, message] of cases) {
      const e = await refusal(client.dag.startRun({ tenantKey: "t", source: { case: "definition", value: definition(nodes) } }));
      expect([Code[e.code], e.rawMessage], JSON.stringify(nodes).slice(0, 80)).toEqual([Code[code], expect.stringMatching(message)]);
    }
    const ctx = await refusal(client.dag.startRun({ tenantKey: "t", source: { case: "definition", value: definition(chain(1)) }, contextJson: "[1]" }));
    expect(ctx.rawMessage).toBe("context_json: must be a JSON object");
    expect(await codeOf(client.dag.startRun({ tenantKey: "t", source: { case: "definitionId", value: "never-stored" } }))).toBe(Code.NotFound);
    expect(await codeOf(client.dag.startRun({ tenantKey: "t" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(client.dag.putDefinition({ tenantKey: "t", definition: definition(chain(1)) }))).toBe(Code.InvalidArgument);
    expect(await Promise.all((["run", "task", "work_item", "checkpoint", "engine_run"] as const).map(count))).toEqual(before);
  });

  it("the audit stream of aiflow_run and aiflow_task names fields and ids, never values", async () => {
    const SECRET = "ctx-secret-value-7f3a9";
    const RESULT = "result-secret-value-b21c";
    const PAYLOAD = "payload-secret-value-e9d0";
    const w = work(agent, () => ({ out: RESULT }));
    try {
      const run = await client.start("t", definition([{ name: "s1", payloadJson: JSON.stringify({ p: PAYLOAD }) }]), { token: SECRET });
      await client.until("t", run.id, RunStatus.COMPLETED);
      const audit = captured.audit().filter((a) => a.rec.table === "run" || a.rec.table === "task");
      const mine = audit.filter((a) => (a.rec.ids as string[]).includes(run.id) || a.rec.table === "task");
      expect(mine.some((a) => a.rec.table === "run" && a.rec.action === "create")).toBe(true);
      expect(mine.some((a) => a.rec.table === "task" && a.rec.action === "create")).toBe(true);
      expect(mine.some((a) => a.rec.table === "task" && a.rec.action === "update")).toBe(true);
      for (const a of audit) {
        for (const secret of [SECRET, RESULT, PAYLOAD]) expect(a.raw).not.toContain(secret);
        expect(Object.keys(a.rec).sort()).toEqual(
          ["action", "at", "by", "fields", "hostname", "ids", "level", "msg", "pid", "stream", "table", "time"].filter((k) => k in a.rec).sort(),
        );
      }
      // The values did reach the database, so their absence from the audit means something.
      const [row] = await fx.db.raw<{ c: string }>(`SELECT context::text AS c FROM ${table("run")} WHERE id = $1`, [run.id]);
      expect(row!.c).toContain(SECRET);
      expect(row!.c).toContain(RESULT);
    } finally {
      await w.stop();
    }
  });

  it("DagOpsService shows an operator any run of a tenant, whoever started it, and no run of another tenant", async () => {
    const run = await new DagClient(D.address, TOKENS.runs2).start("t", definition([{ name: "w", wait: true, event: "go" }]));
    const ops = fx.clientAt(D.address, DagOpsService, TOKENS.ops);
    const seen = (await ops.getRun({ tenantKey: "t", runId: run.id })).run!;
    expect([seen.id, seen.status, seen.nodes.map((n) => n.name)]).toEqual([run.id, RunStatus.RUNNING, ["w"]]);
    const other = await refusal(ops.getRun({ tenantKey: "u", runId: run.id }));
    expect([other.code, other.rawMessage]).toEqual([Code.NotFound, `tenant 'u' has no run '${run.id}'`]);
    // The caller's own read stays its own.
    expect(await codeOf(client.dag.getRun({ tenantKey: "t", runId: run.id }))).toBe(Code.NotFound);
  });
});
