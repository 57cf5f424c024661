import { execFile, spawnSync } from "node:child_process";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { cpuMeter, pidsNamed, runLengthMeter, sampleProc, sampleRuns, startChild } from "../bench/proc.js";
import { gcFigures, latencyRatio, percentile, perSecond, ratio, summarize } from "../bench/stats.js";
import { openLoop } from "../bench/baseline.js";
import { perItem } from "../bench/floor.js";
import { BenchArgError, parseOptions } from "../bench/options.js";
import { sql } from "../bench/pg.js";
import { databaseUrl } from "./support/database-url.js";

const run = promisify(execFile);

describe("benchmark options", () => {
  it("reads counts, durations and sections, and --smoke's small run", () => {
    const { o, only, help } = parseOptions(["--items", "500", "--rate=200", "--duration", "5s", "--prefetch", "0", "--only", "drain,latency"]);
    expect(help).toBe(false);
    expect(o).toMatchObject({ items: 500, rate: 200, durationMs: 5000, prefetch: 0 });
    expect([...only]).toEqual(["drain", "latency"]);
    expect(parseOptions(["--smoke"]).o).toMatchObject({ items: 300, durationMs: 1000 });
    expect(parseOptions(["--help"]).help).toBe(true);
    // --tls compares the drain and the steady rate with their TLS runs, so it brings both along.
    const tls = parseOptions(["--tls", "--only", "enqueue"]);
    expect(tls.o.tls).toBe(true);
    expect([...tls.only].sort()).toEqual(["drain", "enqueue", "latency"]);
    // --observability compares the steady rate with traces and metrics on against this run's, off.
    const obs = parseOptions(["--observability", "--only", "drain"]);
    expect(obs.o.observability).toBe(true);
    expect([...obs.only].sort()).toEqual(["drain", "latency"]);
  });

  it.each([
    [["--duration", "10"], /--duration 10 is 10 ms, shorter than 1000 ms \(a bare number is milliseconds: write 10s\)/],
    [["--items", "lots"], /--items needs a whole number ≥ 1, not 'lots'/],
    [["--agents", "0"], /--agents needs a whole number ≥ 1/],
    [["--warmup", "soon"], /--warmup/],
    [
      ["--only", "drain,latncy"],
      /--only takes a comma list of enqueue, drain, mixed, tenants, latency, streams, heartbeat, dag, triggers, fast-path, agent-path, sdk-transport, claim_cost, console, python; not .latncy./,
    ],
    [["--itmes", "5"], /unknown option --itmes/],
  ])("refuses %j with a message naming the option", (argv, message) => {
    expect(() => parseOptions(argv)).toThrow(BenchArgError);
    expect(() => parseOptions(argv)).toThrow(message);
  });
});

describe("benchmark arithmetic", () => {
  it("takes nearest-rank percentiles", () => {
    const xs = Array.from({ length: 100 }, (_, i) => i + 1);
    expect(percentile(xs, 50)).toBe(50);
    expect(percentile(xs, 90)).toBe(90);
    expect(percentile(xs, 99)).toBe(99);
    expect(percentile(xs, 100)).toBe(100);
    expect(percentile([7], 99)).toBe(7);
    expect(percentile([], 50)).toBeNaN();
  });

  it("summarises unsorted values", () => {
    const s = summarize([5, 1, 4, 2, 3]);
    expect(s).toMatchObject({ count: 5, mean: 3, p50: 3, max: 5 });
  });

  it("reads the steady section's CPU shares as CPU per item", () => {
    expect(perItem({ daemons_cpu_pct: 55, producer_cpu_pct: 34 }, 1000)).toEqual({ daemons_us_per_item: 550, producer_us_per_call: 340 });
    expect(perItem({ daemons_cpu_pct: 10, producer_cpu_pct: 5 }, 100)).toEqual({ daemons_us_per_item: 1000, producer_us_per_call: 500 });
  });

  it("sums a process group's GC pauses", () => {
    expect(gcFigures("agents", [3.24, 20.5, 1])).toEqual({ agents_gc_pauses: 3, agents_gc_ms: 24.7, agents_gc_max_ms: 20.5 });
    expect(gcFigures("agents", [])).toEqual({ agents_gc_pauses: 0, agents_gc_ms: 0, agents_gc_max_ms: 0 });
    expect(gcFigures("agents", undefined)).toEqual({});
  });

  it("computes ours ÷ baseline and guards against missing figures", () => {
    expect(ratio(10_000, 28_000)).toBe(0.357);
    expect(ratio(5, 0)).toBeNaN();
    expect(ratio(Number.NaN, 3)).toBeNaN();
  });

  it("gives no latency ratio when the baseline fell behind the rate", () => {
    expect(latencyRatio({ p50: 6, p99: 20 }, { p50: 1.5, p99: 40 })).toEqual({
      ours_p50_ms: 6,
      baseline_p50_ms: 1.5,
      p50_ours_over_baseline: 4,
      p99_ours_over_baseline: 0.5,
      baseline_kept_up: 1,
    });
    const behind = latencyRatio({ p50: 6, p99: 20 }, { p50: 12_000, p99: 14_000 });
    expect(behind).toMatchObject({ baseline_p50_ms: 12_000, baseline_kept_up: 0 });
    expect(behind.p50_ours_over_baseline).toBeNaN();
    expect(behind.p99_ours_over_baseline).toBeNaN();
  });

  it("turns a nanosecond span into a rate", () => {
    expect(perSecond(20_000, 2_000_000_000n)).toBe(10_000);
    expect(perSecond(1, 0n)).toBeNaN();
  });

  it("sends at the asked rate without waiting for slow calls (open loop)", async () => {
    let started = 0;
    let allStarted!: () => void;
    const last = new Promise<void>((resolve) => (allStarted = resolve));
    const sent = await openLoop(200, 250, () => {
      if (++started === 50) allStarted();
      // No call finishes before the last one has started: a loop that waited for its calls would never start it.
      return last;
    });
    expect(sent).toBe(50);
    expect(started).toBe(50);
  });
});

describe("benchmark process lifecycle", () => {
  it("waits for the ready line, forwards later lines, samples /proc and stops the child", async () => {
    const child = startChild("test/support/ready-child.ts", [], { ready: (l) => l.includes('"ready"'), stderr: "ignore" });
    await child.ready;
    const sample = sampleProc(child.pid);
    expect(sample.rssBytes).toBeGreaterThan(0);
    const bye = new Promise<string>((resolve) => child.onLine((l) => l.includes("bye") && resolve(l)));
    expect(await child.stop()).toBe(0);
    expect(await bye).toContain("bye");
  });

  it("delivers a child's last lines before it counts as exited, however long they are", async () => {
    const child = startChild("test/support/ready-child.ts", ["big"], { ready: (l) => l.includes('"ready"'), stderr: "ignore" });
    await child.ready;
    let got = 0;
    child.onLine((l) => l.includes("bye") && (got = l.length));
    void child.stop();
    await child.exited;
    expect(got).toBeGreaterThan(1 << 20);
  });

  it("finds processes by name, and meters a group whose process goes away without failing", async () => {
    const child = startChild("test/support/ready-child.ts", ["named"], { ready: (l) => l.includes('"ready"'), stderr: "ignore" });
    await child.ready;
    expect(pidsNamed("aiflow-named")).toEqual([child.pid]);
    expect(pidsNamed("aiflow-no-such-name")).toEqual([]);
    const meter = cpuMeter({ named: [child.pid] });
    await child.stop();
    expect(pidsNamed("aiflow-named")).toEqual([]);
    expect(meter().groupMs.named).toBe(0);
  });

  it("measures how long a process's runs on a CPU last, and gives none for a process that is gone", () => {
    const meter = runLengthMeter([process.pid]);
    const until = performance.now() + 20;
    while (performance.now() < until);
    // Waiting for a child blocks this thread, so it is taken off the CPU and put back: one more run.
    spawnSync("true");
    const ms = meter();
    expect(ms).not.toBeNull();
    expect(ms!).toBeGreaterThan(0);
    expect(sampleRuns(process.pid)!.runs).toBeGreaterThan(0);
    expect(sampleRuns(2 ** 22 + 1)).toBeNull();
    expect(runLengthMeter([2 ** 22 + 1])()).toBeNull();
  });

  it("rejects `ready` when the child dies first", async () => {
    const child = startChild("test/support/ready-child.ts", [], { ready: () => false, stderr: "ignore" });
    void child.stop();
    await expect(child.ready).rejects.toThrow(/before it was ready/);
  });
});

/**
 * --smoke made smaller still: the run's length is its processes starting (a daemon, agents, producers
 * and baseline workers for each section), not the work; its heartbeat idle window is a second.
 */
const TINY = [
  "--smoke",
  "--items",
  "50",
  "--drain-warmup",
  "10",
  "--agents",
  "1",
  "--slots",
  "4",
  "--rate",
  "20",
  "--warmup",
  "0",
  "--hb-agents",
  "5",
  "--hb-duration",
  "1s",
  "--tls",
];

describe("benchmark smoke run", () => {
  it("runs every section end to end on a tiny workload, over h2c and TLS, and prints each figure set", { timeout: 180_000 }, async () => {
    const { stdout } = await run(process.execPath, ["--import", "tsx", "bench/run.ts", ...TINY], {
      env: { ...process.env, DATABASE_URL: databaseUrl(), NO_COLOR: "1" },
      maxBuffer: 16 * 1024 * 1024,
    });
    const sets = stdout
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    const names = sets.map((s) => s.bench);
    expect(names).toEqual([
      "enqueue",
      "drain",
      "drain_baseline",
      "drain_graphile",
      "drain_ratio",
      "drain_mixed",
      "mixed_ratio",
      "drain_tenants",
      "tenant_shares",
      "tenants_ratio",
      "latency",
      "latency_baseline",
      "latency_graphile",
      "latency_ratio",
      "http2_floor",
      "drain_tls",
      "latency_tls",
      "tls_ratio",
      "streams",
      "heartbeat",
      "dag_plain",
      "dag_chain",
      "dag_fanout",
      "graph_chain",
      "dag_ratio",
      "triggers_startrun",
      "triggers_webhook",
      "triggers_ratio",
    ]);
    expect(sets.find((s) => s.bench === "drain_tls")!.items).toBe(50);
    expect(sets.find((s) => s.bench === "drain_graphile")!.items).toBe(50);
    expect(typeof sets.find((s) => s.bench === "drain_ratio")!.ours_over_graphile).toBe("number");
    const tls = sets.find((s) => s.bench === "tls_ratio")!;
    expect(tls.drain_tls_over_h2c).toBeGreaterThan(0);
    expect(typeof tls.p99_tls_minus_h2c_ms).toBe("number");
    expect(sets.find((s) => s.bench === "drain_mixed")!.items).toBe(50);
    expect(sets.find((s) => s.bench === "mixed_ratio")!.mixed_over_plain).toBeGreaterThan(0);
    expect(sets.find((s) => s.bench === "drain_tenants")!.items).toBe(50);
    expect(sets.find((s) => s.bench === "tenants_ratio")!.tenants_over_plain).toBeGreaterThan(0);
    expect(typeof sets.find((s) => s.bench === "tenant_shares")!.max_abs_diff).toBe("number");
    const drain = sets.find((s) => s.bench === "drain")!;
    expect(drain.items).toBe(50);
    expect(typeof drain.items_per_s).toBe("number");
    const latency = sets.find((s) => s.bench === "latency")!;
    expect(typeof latency.p99_ms).toBe("number");
    // The agents report their GC pauses (there may be none in so short a run).
    expect(typeof latency.agents_gc_pauses).toBe("number");
    expect(typeof drain.agents_gc_max_ms).toBe("number");
    const streams = sets.find((s) => s.bench === "streams")!;
    expect(streams).toMatchObject({ streams: 20, pushed_after_wake: 1 });
    expect(typeof streams.daemon_rss_mb).toBe("number");
    const heartbeat = sets.find((s) => s.bench === "heartbeat")!;
    expect(typeof heartbeat.reregistered).toBe("number");
    // The test role may create databases: the heartbeats ran in one of their own, dropped after.
    expect(heartbeat.own_database).toBe(1);
    expect(await sql(databaseUrl(), "SELECT datname FROM pg_database WHERE datname LIKE 'aiflow\\_bench\\_%'")).toEqual([]);
    // The DAG section: its own plain items, then chains and a fan-out (--smoke's sizes) by the same agents.
    expect(sets.find((s) => s.bench === "dag_plain")).toMatchObject({ items: 300, own_database: 1 });
    expect(sets.find((s) => s.bench === "dag_chain")).toMatchObject({ runs: 10, completed: 10, nodes: 100, handoffs: 90 });
    expect(sets.find((s) => s.bench === "dag_fanout")).toMatchObject({ width: 50, runs: 1, completed: 1, nodes: 52 });
    expect(sets.find((s) => s.bench === "graph_chain")).toMatchObject({ runs: 10, completed: 10, steps: 100 });
    const dag = sets.find((s) => s.bench === "dag_ratio")!;
    expect(dag.graph_step_over_chain_node).toBeGreaterThan(0);
    expect(dag.chain_node_over_plain).toBeGreaterThan(0);
    expect(dag.fanout_node_over_plain).toBeGreaterThan(0);
    // The triggers section: as many webhook starts as StartRun calls (--smoke's 50), and their ratios.
    expect(sets.find((s) => s.bench === "triggers_startrun")).toMatchObject({ starts: 50 });
    expect(sets.find((s) => s.bench === "triggers_webhook")).toMatchObject({ starts: 50 });
    expect(sets.find((s) => s.bench === "triggers_ratio")!.webhook_starts_per_s_over_startrun).toBeGreaterThan(0);
    const floor = sets.find((s) => s.bench === "http2_floor")!;
    // Figures, not values: at 20 calls/s for half a second a process's CPU can be under one tick of
    // /proc's 10 ms clock, so a figure of 0 is a real reading here.
    expect(floor.server_us_per_call).toBeGreaterThanOrEqual(0);
    expect(floor.client_us_per_call).toBeGreaterThanOrEqual(0);
    expect(typeof floor.daemons_us_per_item).toBe("number");
  });
});

describe("benchmark: the Python agents' section", () => {
  it("drains with SDK agents, Python agents, then half of each, and prints Python ÷ TypeScript", { timeout: 120_000 }, async () => {
    const { stdout } = await run(
      process.execPath,
      ["--import", "tsx", "bench/run.ts", "--smoke", "--items", "50", "--drain-warmup", "10", "--agents", "2", "--slots", "4", "--only", "python"],
      {
        env: { ...process.env, DATABASE_URL: databaseUrl(), NO_COLOR: "1" },
      },
    );
    const sets = stdout
      .split("\n")
      .filter((l) => l.startsWith("{"))
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(sets.map((s) => s.bench)).toEqual(["drain_python_typescript", "drain_python_python", "drain_python_mixed", "python_ratio"]);
    expect(sets.slice(0, 3).map((s) => [s.items, s.python_agents, s.retries])).toEqual([
      [50, 0, 0],
      [50, 2, 0],
      [50, 1, 0],
    ]);
    const r = sets[3]!;
    expect(r.python_over_ts_items_per_s).toBeGreaterThan(0);
    // A figure, not a value: 50 items can take the SDK agents less than one 10 ms tick of /proc's
    // CPU clock, and a ratio over 0 is NaN (null in JSON).
    expect(r).toHaveProperty("python_over_ts_agents_cpu_per_item");
  });
});
