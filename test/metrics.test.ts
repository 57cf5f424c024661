/**
 * The daemon's /metrics, scraped over real HTTP and read with a Prometheus text-format parser, moves
 * with real RPCs: an enqueue and a claim, a completion, a retry and a dead letter, a lease that
 * runs out and the zombie completion refused after it, an empty claim, a direct hand-off, a refused
 * token; the queue and fleet gauges come from a snapshot that scrapes share for --metrics-refresh.
 * The daemon runs on a fake clock, so waits and run times are exact, and its sweeps run when a test
 * runs them.
 */
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { beforeAll, describe, expect, it } from "vitest";
import { AgentService } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { Health } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { bearer, TOKENS } from "./support/daemon.js";
import { codeOf, until, useTestDb } from "./support/kit.js";
import { DAEMON_METRICS, Exposition, httpGet, scrapeMetrics } from "./support/metrics.js";
import { Producer, TestAgent } from "./support/queue.js";

const f = useTestDb("metrics");
const clock = new FakeClock(Date.UTC(2026, 11, 1));
const REFRESH = 5_000;
const LEASE = 30_000;
let daemon: Daemon;
let producer: Producer;
const scrape = () => scrapeMetrics(daemon.httpUrl!);

beforeAll(async () => {
  daemon = await f.startDaemon({
    clock,
    config: {
      httpListen: { host: "127.0.0.1", port: 0 },
      metricsRefresh: REFRESH,
      metricsMaxAgents: 2,
      leaseTtl: LEASE,
      // The sweeps run when a test runs them (daemon.maintenance), on the fake clock.
      sweepInterval: 3_600_000,
      heartbeatFlush: 3_600_000,
      heartbeatInterval: 1_800_000,
      backoffBase: 60_000,
      backoffCap: 60_000,
      backoffJitter: "none",
    },
  });
  producer = f.closers.add(new Producer(daemon.address));
});

/** A registered agent of `kind` (tenant t1), closed after the file. */
const agentOf = async (name: string, kind: string) => f.closers.add(await TestAgent.register(daemon.address, name, { tenants: ["t1"], engineKinds: [kind] }));
const enqueue = (kind: string, over: Record<string, unknown> = {}) => producer.one("t1", { engineKind: kind, payloadJson: "{}", ...over });

describe("/metrics", () => {
  it("is the Prometheus text format, with HELP and TYPE for every documented metric, the process metrics and nothing undocumented of ours", async () => {
    const m = await scrape();
    for (const [name, labels] of Object.entries(DAEMON_METRICS)) {
      const fam = m.family(name);
      expect(fam, name).toBeDefined();
      expect(fam!.help.length, name).toBeGreaterThan(10);
      for (const s of m.labelSets(name)) expect(Object.keys(s).sort(), name).toEqual([...labels].sort());
    }
    const ours = m.families.map((x) => x.name).filter((n) => n.startsWith("aiflow_") || n.startsWith("grpc_"));
    expect(ours.filter((n) => !(n in DAEMON_METRICS))).toEqual([]);
    for (const name of ["process_cpu_seconds_total", "nodejs_eventloop_lag_p99_seconds", "nodejs_gc_duration_seconds", "nodejs_heap_size_used_bytes"])
      expect(m.family(name), name).toBeDefined();
    expect(m.family("aiflow_queue_run_seconds")!.type).toBe("HISTOGRAM");
    expect(m.family("aiflow_queue_empty_claims_total")!.type).toBe("COUNTER");
    expect(m.family("aiflow_agents")!.type).toBe("GAUGE");
    for (const state of ["in_use", "idle", "waiting"])
      for (const pool of ["main", "hot"]) expect(m.has("aiflow_db_pool_connections", { pool, state }), `${pool} ${state}`).toBe(true);
  });

  it("counts an enqueue and a claim by method and code, the claim's wait since the item was due, and its run to completion", async () => {
    const agent = await agentOf("m-run", "run");
    const before = await scrape();
    const id = await enqueue("run");
    clock.advance(2_000);
    const [item] = await agent.claim(1);
    expect(item!.id).toBe(id);
    clock.advance(3_000);
    await agent.complete([item!]);
    const after = await scrape();
    const delta = (series: string, labels: Record<string, string>) => after.series(series, labels) - before.series(series, labels);

    const enq = { grpc_service: "aiflow.cluster.v1.QueueService", grpc_method: "Enqueue", grpc_type: "unary" };
    expect(delta("grpc_server_started_total", enq)).toBe(1);
    expect(delta("grpc_server_handled_total", { ...enq, grpc_code: "OK" })).toBe(1);
    expect(delta("grpc_server_handling_seconds_count", enq)).toBe(1);
    expect(delta("grpc_server_handled_total", { grpc_method: "Claim", grpc_code: "OK" })).toBe(1);
    expect(after.series("grpc_server_in_flight_calls", { grpc_method: "Enqueue" })).toBe(0);
    // Due 2 s before its dispatch: in the 2.5 s bucket, not the 1 s one.
    const wait = { tenant: "t1", engine_kind: "run" };
    expect(delta("aiflow_queue_dispatch_wait_seconds_count", wait)).toBe(1);
    expect(delta("aiflow_queue_dispatch_wait_seconds_sum", wait)).toBeCloseTo(2, 6);
    expect(delta("aiflow_queue_dispatch_wait_seconds_bucket", { ...wait, le: "1" })).toBe(0);
    expect(delta("aiflow_queue_dispatch_wait_seconds_bucket", { ...wait, le: "2.5" })).toBe(1);
    const ran = { engine_kind: "run", outcome: "completed" };
    expect(delta("aiflow_queue_run_seconds_count", ran)).toBe(1);
    expect(delta("aiflow_queue_run_seconds_sum", ran)).toBeCloseTo(3, 6);
  });

  it("counts a completion carried by a claim once, and not again when it is sent again", async () => {
    const agent = await agentOf("m-carry", "carry");
    await enqueue("carry");
    const [item] = await agent.claim(1);
    const before = await scrape();
    await agent.claimCompleting(1, [item!]);
    await agent.claimCompleting(1, [item!]);
    const after = await scrape();
    const ran = { engine_kind: "carry", outcome: "completed" };
    expect(after.series("aiflow_queue_run_seconds_count", ran) - before.series("aiflow_queue_run_seconds_count", ran)).toBe(1);
    expect(after.series("aiflow_queue_refused_completions_total") - before.series("aiflow_queue_refused_completions_total")).toBe(0);
  });

  it("counts a retry and a dead letter by engine kind, with their runs", async () => {
    const agent = await agentOf("m-fail", "fail");
    await enqueue("fail", { maxRetries: 1 });
    const before = await scrape();
    const [first] = await agent.claim(1);
    await agent.fail([first!], { retryable: true, retryDelayMs: 1 });
    clock.advance(10);
    const [second] = await agent.claim(1);
    expect(second!.id).toBe(first!.id);
    await agent.fail([second!], { retryable: true });
    const after = await scrape();
    const delta = (series: string, labels: Record<string, string>) => after.series(series, labels) - before.series(series, labels);
    expect(delta("aiflow_queue_retries_total", { engine_kind: "fail" })).toBe(1);
    expect(delta("aiflow_queue_dead_letters_total", { engine_kind: "fail" })).toBe(1);
    expect(delta("aiflow_queue_run_seconds_count", { engine_kind: "fail", outcome: "retried" })).toBe(1);
    expect(delta("aiflow_queue_run_seconds_count", { engine_kind: "fail", outcome: "failed" })).toBe(1);
  });

  it("counts a lease that ran out, its redelivery, and the zombie's late completion refused", async () => {
    const zombie = await agentOf("m-zombie", "zombie");
    await enqueue("zombie");
    const [item] = await zombie.claim(1);
    const before = await scrape();
    clock.advance(LEASE + 1);
    await daemon.maintenance.runOnce();
    const [outcome] = await zombie.complete([item!]);
    expect(outcome!.ok).toBe(false);
    const after = await scrape();
    const delta = (series: string, labels: Record<string, string> = {}) => after.series(series, labels) - before.series(series, labels);
    expect(delta("aiflow_queue_lease_expiries_total")).toBe(1);
    expect(delta("aiflow_queue_redeliveries_total")).toBe(1);
    expect(delta("aiflow_queue_refused_completions_total")).toBe(1);
    expect(delta("aiflow_queue_run_seconds_count", { engine_kind: "zombie", outcome: "lost" })).toBe(1);
  });

  it("counts the run of a dispatched item that was cancelled", async () => {
    const agent = await agentOf("m-cancel", "cancel");
    const id = await enqueue("cancel");
    expect(await agent.claim(1)).toHaveLength(1);
    const before = await scrape();
    clock.advance(1_500);
    await producer.q.cancel({ tenantKey: "t1", ids: [id], reason: "metrics test" }, producer.call);
    const after = await scrape();
    const ran = { engine_kind: "cancel", outcome: "cancelled" };
    expect(after.series("aiflow_queue_run_seconds_count", ran) - before.series("aiflow_queue_run_seconds_count", ran)).toBe(1);
    expect(after.series("aiflow_queue_run_seconds_sum", ran) - before.series("aiflow_queue_run_seconds_sum", ran)).toBeCloseTo(1.5, 6);
  });

  it("counts a claim answered empty, and an item handed by its Enqueue straight to a waiting claim", async () => {
    const agent = await agentOf("m-wait", "wait");
    const before = await scrape();
    expect(await agent.claim(1)).toEqual([]);
    const waiting = agent.claim(1, 20_000);
    await until("the claim waits", async () => (await scrape()).series("grpc_server_in_flight_calls", { grpc_method: "Claim" }) === 1);
    const id = await enqueue("wait");
    const [handed] = await waiting;
    expect(handed!.id).toBe(id);
    const after = await scrape();
    expect(after.series("aiflow_queue_empty_claims_total") - before.series("aiflow_queue_empty_claims_total")).toBe(1);
    expect(after.series("aiflow_queue_direct_dispatches_total") - before.series("aiflow_queue_direct_dispatches_total")).toBe(1);
  });

  it("holds a stream in flight while it is open, and counts it handled as Canceled once its client goes away", async () => {
    const watch = { grpc_service: "grpc.health.v1.Health", grpc_method: "Watch" };
    const before = await scrape();
    const abort = new AbortController();
    const stream = f.clientAt(daemon.address, Health).watch({ service: "" }, { signal: abort.signal });
    const first = await stream[Symbol.asyncIterator]().next();
    expect(first.done).toBe(false);
    expect((await scrape()).series("grpc_server_in_flight_calls", watch)).toBe(1);
    abort.abort();
    await until("the stream is no longer in flight", async () => (await scrape()).series("grpc_server_in_flight_calls", watch) === 0);
    const after = await scrape();
    expect(
      after.series("grpc_server_started_total", { ...watch, grpc_type: "server_stream" }) -
        before.series("grpc_server_started_total", { ...watch, grpc_type: "server_stream" }),
    ).toBe(1);
    expect(
      after.series("grpc_server_handled_total", { ...watch, grpc_code: "Canceled" }) -
        before.series("grpc_server_handled_total", { ...watch, grpc_code: "Canceled" }),
    ).toBe(1);
  });

  it("counts a refused argument by its code, and a call refused on its token by reason", async () => {
    const before = await scrape();
    expect(await codeOf(producer.q.enqueue({ tenantKey: "", items: [{ engineKind: "k" }] }, producer.call))).not.toBe("ok");
    const stranger = f.clientAt(daemon.address, OpsService);
    expect(await codeOf(stranger.listAgents({}, { headers: bearer("not-a-token-we-know") }))).not.toBe("ok");
    const after = await scrape();
    expect(
      after.series("grpc_server_handled_total", { grpc_method: "Enqueue", grpc_code: "InvalidArgument" }) -
        before.series("grpc_server_handled_total", { grpc_method: "Enqueue", grpc_code: "InvalidArgument" }),
    ).toBe(1);
    expect(
      after.series("aiflow_server_refused_total", { reason: "auth_unknown" }) - before.series("aiflow_server_refused_total", { reason: "auth_unknown" }),
    ).toBe(1);
  });
});

describe("the queue and fleet gauges", () => {
  it("count items by tenant, engine kind and status and age the oldest due item, from a snapshot shared for --metrics-refresh", async () => {
    await producer.enqueue("t1", [{ engineKind: "depth" }, { engineKind: "depth" }]);
    clock.advance(REFRESH);
    const first = await scrape();
    expect(first.series("aiflow_queue_items", { tenant: "t1", engine_kind: "depth", status: "pending" })).toBe(2);
    expect(first.series("aiflow_queue_oldest_due_pending_age_seconds", { tenant: "t1", engine_kind: "depth" })).toBe(REFRESH / 1000);
    // Within the refresh, scrapes share the snapshot: what happened since shows after it.
    await enqueue("depth");
    clock.advance(REFRESH - 1);
    expect((await scrape()).series("aiflow_queue_items", { tenant: "t1", engine_kind: "depth", status: "pending" })).toBe(2);
    clock.advance(1);
    const later = await scrape();
    expect(later.series("aiflow_queue_items", { tenant: "t1", engine_kind: "depth", status: "pending" })).toBe(3);
    expect(later.series("aiflow_queue_oldest_due_pending_age_seconds", { tenant: "t1", engine_kind: "depth" })).toBe((2 * REFRESH) / 1000);
    expect(later.series("aiflow_queue_items", { tenant: "t1", engine_kind: "run", status: "completed" })).toBe(1);
  });

  it("report agents by status, and per agent (up to --metrics-max-agents) CPU, memory, GPUs, items in flight and a drain's remaining items", async () => {
    const gpu = await agentOf("a-gpu", "gpu");
    await agentOf("b-cpu", "gpu");
    await agentOf("c-more", "gpu");
    const agents = f.clientAt(daemon.address, AgentService, TOKENS.agent);
    const GiB = 1n << 30n;
    await agents.heartbeat({
      name: "a-gpu",
      inFlight: 1,
      metrics: {
        cpuUtilization: 12.5,
        memoryUsedBytes: 2n * GiB,
        memoryTotalBytes: 8n * GiB,
        gpus: [
          { index: 0, model: "H100", utilization: 50, memoryUsedBytes: 10n * GiB, memoryTotalBytes: 80n * GiB },
          { index: 1, model: "H100", utilization: 0, memoryUsedBytes: 0n, memoryTotalBytes: 80n * GiB },
        ],
      },
    });
    await daemon.maintenance.flushHeartbeats();
    await enqueue("gpu");
    expect(await gpu.claim(1)).toHaveLength(1);
    const ops = f.clientAt(daemon.address, OpsService, TOKENS.ops);
    await ops.drainAgent({ name: "a-gpu", reason: "metrics test", deadline: durationFromMs(3_600_000) });
    clock.advance(REFRESH);
    const m = await scrape();
    const a = { agent: "a-gpu" };
    expect(m.series("aiflow_agent_cpu_utilization_ratio", a)).toBe(0.125);
    expect(m.series("aiflow_agent_memory_used_bytes", a)).toBe(2 * 2 ** 30);
    expect(m.series("aiflow_agent_memory_total_bytes", a)).toBe(8 * 2 ** 30);
    expect(m.series("aiflow_agent_gpu_utilization_ratio", { ...a, gpu: "0" })).toBe(0.5);
    expect(m.series("aiflow_agent_gpu_utilization_ratio", { ...a, gpu: "1" })).toBe(0);
    expect(m.series("aiflow_agent_gpu_memory_total_bytes", { ...a, gpu: "1" })).toBe(80 * 2 ** 30);
    expect(m.series("aiflow_agent_in_flight_items", a)).toBe(1);
    expect(m.series("aiflow_agent_drain_remaining_items", a)).toBe(1);
    expect(m.has("aiflow_agent_drain_remaining_items", { agent: "b-cpu" })).toBe(false);
    // Every other agent of this file is active; only the first two by name have series of their own.
    const listed = new Set(m.labelSets("aiflow_agent_in_flight_items").map((l) => l.agent));
    expect([...listed].sort()).toEqual(["a-gpu", "b-cpu"]);
    expect(m.series("aiflow_agents", { status: "draining" })).toBe(1);
    const active = m.series("aiflow_agents", { status: "active" });
    expect(m.series("aiflow_agents_unlisted")).toBe(active + 1 - 2);
    expect(m.series("aiflow_heartbeat_flush_rows_count")).toBeGreaterThanOrEqual(1);
  });
});

describe("the exposition formats", () => {
  it("answers OpenMetrics when the scraper prefers it, and the text format still names counters with _total after", async () => {
    const om = await httpGet(`${daemon.httpUrl}/metrics`, {
      headers: { accept: "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1" },
    });
    expect(om.status).toBe(200);
    expect(om.headers["content-type"]).toBe("application/openmetrics-text; version=1.0.0; charset=utf-8");
    expect(om.text.endsWith("# EOF\n")).toBe(true);
    expect(om.text).toMatch(/^# TYPE aiflow_queue_empty_claims counter$/m);
    expect(om.text).toMatch(/^aiflow_queue_empty_claims_total \d+$/m);
    const text = await scrape();
    expect(text.text).toMatch(/^# TYPE aiflow_queue_empty_claims_total counter$/m);
    expect(text.family("aiflow_queue_empty_claims_total")).toBeDefined();
  });

  it("answers HEAD without a body, and refuses other methods and paths with a sentence", async () => {
    const head = await httpGet(`${daemon.httpUrl}/metrics`, { method: "HEAD" });
    expect(head).toMatchObject({ status: 200, text: "" });
    const post = await httpGet(`${daemon.httpUrl}/metrics`, { method: "POST" });
    expect(post.status).toBe(405);
    expect(post.headers.allow).toBe("GET, HEAD");
    const lost = await httpGet(`${daemon.httpUrl}/nothing`);
    expect(lost.status).toBe(404);
    expect(lost.text).toMatch(/\/metrics, \/healthz and \/readyz/);
    expect(new Exposition("").families).toEqual([]);
  });
});
