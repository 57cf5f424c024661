/**
 * The agent's own metrics (`metricsPort`) against a real daemon: scraped over real HTTP and read
 * with a Prometheus text-format parser, the counters follow real work (completed, retried, failed),
 * claims, failed calls and reconnects; OpenMetrics when asked for; a port in use fails start();
 * stop() frees the port; two agents in one process keep their counts apart.
 */
import net from "node:net";
import { once } from "node:events";
import parsePrometheusTextFormat, { type MetricFamily } from "parse-prometheus-text-format";
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../../src/daemon.js";
import { agentRow } from "../../test/support/agents.js";
import { useTestDb } from "../../test/support/kit.js";
import { AgentFailedError, createAgent, NonRetryableError, type Agent } from "../src/index.js";
import { wantsOpenMetrics } from "@aiflow/wire/metrics";
import { deferred, Producer, testAgent, testLogger, until } from "./support.js";

const fx = useTestDb("sdkmetrics");
let daemon: Daemon;
let producer: Producer;

const daemonConfig = { backoffBase: 10, backoffCap: 20, backoffJitter: "none" as const, heartbeatInterval: 500, heartbeatFlush: 50, sweepInterval: 50 };

beforeAll(async () => {
  daemon = await fx.startDaemon({ config: daemonConfig });
  producer = fx.closers.add(new Producer(daemon.address, "t1"));
});

interface Scrape {
  status: number;
  contentType: string | null;
  text: string;
}

async function get(agent: Agent, headers: Record<string, string> = {}): Promise<Scrape> {
  const res = await fetch(`http://${agent.metricsAddress}/metrics`, { headers });
  return { status: res.status, contentType: res.headers.get("content-type"), text: await res.text() };
}

/** One scrape in the Prometheus text format, parsed. */
async function scrape(agent: Agent): Promise<MetricFamily[]> {
  const s = await get(agent);
  expect(s.status).toBe(200);
  expect(s.contentType).toBe("text/plain; version=0.0.4; charset=utf-8");
  return parsePrometheusTextFormat(s.text);
}

const family = (families: MetricFamily[], name: string) => families.find((f) => f.name === name);

/** The value of the counter's or gauge's series whose labels include `labels`; undefined when there is none. */
function value(families: MetricFamily[], name: string, labels: Record<string, string> = {}): number | undefined {
  const sample = family(families, name)?.metrics.find((m) => Object.entries(labels).every(([k, v]) => m.labels?.[k] === v));
  return sample?.value === undefined ? undefined : Number(sample.value);
}

/**
 * How many observations a histogram of one series holds: its `+Inf` bucket. The parser keeps the
 * buckets of one series per histogram family and drops labelled `_sum`/`_count` lines (its issue
 * #13), so this is asked only of families with one series.
 */
function observations(families: MetricFamily[], name: string): number | undefined {
  const inf = family(families, name)?.metrics[0]?.buckets?.["+Inf"];
  return inf === undefined ? undefined : Number(inf);
}

const handled = (families: MetricFamily[], outcome: string) => value(families, "aiflow_sdk_items_handled_total", { engine_kind: "metered", outcome }) ?? 0;

describe("the counters follow real work", () => {
  it.each([
    ["over the stream", true],
    ["by unary claims", false],
  ])(
    "an item completed, one retried then completed, one failed for good: items by outcome, handler runs, claims, slots and the process metrics (%s)",
    async (_how, stream) => {
      const agent = testAgent(daemon.address, {
        engineKinds: ["metered"],
        slots: 2,
        stream,
        claimWaitMs: 100,
        metricsPort: 0,
        handlers: {
          metered: {
            ok: () => "done",
            flaky: (item) => {
              if (item.attempt === 1) throw new Error("the first attempt fails");
              return "second time lucky";
            },
            bad: () => {
              throw new NonRetryableError("this one cannot succeed");
            },
          },
        },
      });
      await agent.start();
      expect(agent.metricsAddress).toMatch(/^127\.0\.0\.1:\d+$/);
      const ids = await producer.enqueue([
        { engineKind: "metered", taskName: "ok" },
        { engineKind: "metered", taskName: "flaky", maxRetries: 1 },
        { engineKind: "metered", taskName: "bad", maxRetries: 3 },
      ]);
      await producer.waitDone(ids);

      let m: MetricFamily[] = [];
      // The daemon has the outcomes before the agent has its answers: wait for the agent's count.
      await until("the agent counted the three items' outcomes", async () => {
        m = await scrape(agent);
        return handled(m, "completed") === 2 && handled(m, "retried") === 1 && handled(m, "failed") === 1;
      });
      expect(family(m, "aiflow_sdk_items_handled_total")?.type).toBe("COUNTER");
      expect(
        family(m, "aiflow_sdk_items_handled_total")
          ?.metrics.map((s) => s.labels?.outcome)
          .sort(),
      ).toEqual(["completed", "failed", "retried"]);
      expect(family(m, "aiflow_sdk_handler_seconds")?.type).toBe("HISTOGRAM");
      expect(observations(m, "aiflow_sdk_handler_seconds")).toBe(4);
      expect(value(m, "aiflow_sdk_slots")).toBe(2);
      expect(value(m, "aiflow_sdk_in_flight_items")).toBe(0);
      expect(value(m, "aiflow_sdk_claims_total", { result: "items" })).toBeGreaterThanOrEqual(2);
      expect(value(m, "aiflow_sdk_reconnects_total")).toBe(0);
      expect(family(m, "aiflow_sdk_rpc_errors_total")?.metrics ?? []).toEqual([]);
      // prom-client's process metrics are served beside the agent's own.
      expect(family(m, "process_cpu_user_seconds_total")?.type).toBe("COUNTER");
      expect(family(m, "nodejs_eventloop_lag_seconds")?.type).toBe("GAUGE");
      expect(family(m, "nodejs_gc_duration_seconds")?.type).toBe("HISTOGRAM");

      // Idle now: its long-polls come back empty (a stream's pushes are never empty).
      if (stream) expect(value(m, "aiflow_sdk_claims_total", { result: "empty" })).toBeUndefined();
      else await until("an empty claim was counted", async () => (value(await scrape(agent), "aiflow_sdk_claims_total", { result: "empty" }) ?? 0) >= 1);
    },
  );

  it("a running handler is in flight until it settles", async () => {
    const running = deferred();
    const gate = deferred();
    const agent = testAgent(daemon.address, {
      engineKinds: ["metered-slow"],
      metricsPort: 0,
      handlers: {
        "metered-slow": async () => {
          running.resolve();
          await gate.promise;
        },
      },
    });
    await agent.start();
    const ids = await producer.enqueue([{ engineKind: "metered-slow" }]);
    await running.promise;
    expect(value(await scrape(agent), "aiflow_sdk_in_flight_items")).toBe(1);
    gate.resolve();
    await producer.waitDone(ids);
    await until("the slot is free again", async () => value(await scrape(agent), "aiflow_sdk_in_flight_items") === 0);
  });
});

describe("formats", () => {
  it("OpenMetrics when the Accept header asks for it, and the Prometheus text format keeps its counter names after one", async () => {
    const agent = testAgent(daemon.address, { engineKinds: ["metered-om"], metricsPort: 0, handlers: { "metered-om": () => "ok" } });
    await agent.start();
    await producer.waitDone(await producer.enqueue([{ engineKind: "metered-om" }]));
    await until(
      "the item was counted",
      async () => value(await scrape(agent), "aiflow_sdk_items_handled_total", { engine_kind: "metered-om", outcome: "completed" }) === 1,
    );

    // What Prometheus sends.
    const om = await get(agent, {
      accept: "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    });
    expect(om.status).toBe(200);
    expect(om.contentType).toBe("application/openmetrics-text; version=1.0.0; charset=utf-8");
    expect(om.text.endsWith("# EOF\n")).toBe(true);
    expect(om.text).toContain("# TYPE aiflow_sdk_items_handled counter\n");
    expect(om.text).toContain('aiflow_sdk_items_handled_total{engine_kind="metered-om",outcome="completed"} 1\n');

    // prom-client renames counters in place for OpenMetrics; the endpoint puts the names back.
    const m = await scrape(agent);
    expect(family(m, "aiflow_sdk_items_handled_total")?.type).toBe("COUNTER");
    expect(family(m, "aiflow_sdk_claims_total")?.type).toBe("COUNTER");
    expect(family(m, "aiflow_sdk_items_handled")).toBeUndefined();
  });

  it("reads the Accept header by its q-values", () => {
    expect(wantsOpenMetrics(undefined)).toBe(false);
    expect(wantsOpenMetrics("*/*")).toBe(false);
    expect(wantsOpenMetrics("text/plain;version=0.0.4")).toBe(false);
    expect(wantsOpenMetrics("application/openmetrics-text; version=1.0.0")).toBe(true);
    expect(wantsOpenMetrics("text/plain;q=0.9, application/openmetrics-text;q=0.5")).toBe(false);
    expect(wantsOpenMetrics("application/openmetrics-text;q=0")).toBe(false);
  });

  it("answers other paths with 404 and other methods with 405", async () => {
    const agent = testAgent(daemon.address, { engineKinds: ["metered-paths"], metricsPort: 0, handlers: { "metered-paths": () => "ok" } });
    await agent.start();
    expect((await fetch(`http://${agent.metricsAddress}/`)).status).toBe(404);
    const post = await fetch(`http://${agent.metricsAddress}/metrics`, { method: "POST" });
    expect([post.status, post.headers.get("allow")]).toEqual([405, "GET, HEAD"]);
  });
});

describe("the daemon going away", () => {
  it("counts the failed calls by method and code, the failed claims, and one reconnect per recovery", async () => {
    const first = await fx.startDaemon({ config: { ...daemonConfig, instanceId: "metrics-restart-1" } });
    let registrations = 0;
    const agent = testAgent(first.address, { engineKinds: ["metered-restart"], metricsPort: 0, handlers: { "metered-restart": () => "ok" } });
    agent.on("registered", () => registrations++);
    await agent.start();
    await first.stop();

    await until("the agent's calls to the stopped daemon failed as unavailable", async () => {
      const m = await scrape(agent);
      return (
        (value(m, "aiflow_sdk_reconnects_total") ?? 0) >= 1 && (value(m, "aiflow_sdk_rpc_errors_total", { method: "Register", code: "Unavailable" }) ?? 0) >= 1
      );
    });
    const second = await fx.startDaemon({ config: { ...daemonConfig, instanceId: "metrics-restart-2", listen: { host: "127.0.0.1", port: first.port } } });
    await until("registered with the new daemon", () => registrations >= 2);
    const m = await scrape(agent);
    // Each recovery ends in one registration.
    expect(value(m, "aiflow_sdk_reconnects_total")).toBe(registrations - 1);
    const errors = family(m, "aiflow_sdk_rpc_errors_total")?.metrics ?? [];
    expect(errors.every((s) => s.labels?.method && s.labels.code && s.labels.code !== "Canceled")).toBe(true);
    const producer2 = fx.closers.add(new Producer(second.address, "t1"));
    await producer2.waitDone(await producer2.enqueue([{ engineKind: "metered-restart" }]));
  });
});

describe("the port", () => {
  it("a port in use fails start() with an error that says so, before the agent registers", async () => {
    const blocker = net.createServer().listen(0, "127.0.0.1");
    await once(blocker, "listening");
    const port = (blocker.address() as net.AddressInfo).port;
    try {
      const agent = testAgent(daemon.address, { engineKinds: ["metered-busy"], metricsPort: port, handlers: { "metered-busy": () => "ok" } });
      const started = agent.start();
      await expect(started).rejects.toBeInstanceOf(AgentFailedError);
      await expect(started).rejects.toThrow(
        `agent '${agent.name}' cannot serve metrics on 127.0.0.1:${port}: the port is in use (EADDRINUSE): give metricsPort a free one, or 0 for any`,
      );
      expect(agent.state).toBe("failed");
      expect(await agentRow(fx.db, agent.name)).toBeUndefined();
    } finally {
      blocker.close();
    }
  });

  it("stop() closes the endpoint and frees its port", async () => {
    const agent = testAgent(daemon.address, { engineKinds: ["metered-stop"], metricsPort: 0, handlers: { "metered-stop": () => "ok" } });
    await agent.start();
    const address = agent.metricsAddress!;
    // A scraper's keep-alive connection must not hold the port.
    expect((await fetch(`http://${address}/metrics`)).status).toBe(200);
    await agent.stop();
    await expect(fetch(`http://${address}/metrics`)).rejects.toThrow();
    const again = net.createServer().listen(Number(address.split(":")[1]), "127.0.0.1");
    await once(again, "listening");
    again.close();
  });

  it("without metricsPort there is no endpoint", async () => {
    const agent = testAgent(daemon.address, { engineKinds: ["metered-none"], handlers: { "metered-none": () => "ok" } });
    await agent.start();
    expect(agent.metricsAddress).toBeUndefined();
  });

  it("metricsPort and metricsHost are checked when the agent is created", () => {
    const base = { address: daemon.address, name: "metered-options", tenants: ["t1"], handlers: { x: () => "ok" }, logger: testLogger() };
    expect(() => createAgent({ ...base, metricsPort: 70_000 })).toThrow("createAgent: metricsPort must be a whole number in 0..65535, got 70000");
    expect(() => createAgent({ ...base, metricsPort: 1.5 })).toThrow("createAgent: metricsPort must be a whole number in 0..65535, got 1.5");
    expect(() => createAgent({ ...base, metricsHost: "0.0.0.0" })).toThrow("createAgent: metricsHost needs metricsPort");
    expect(() => createAgent({ ...base, metricsPort: 0, metricsHost: "" })).toThrow('createAgent: metricsHost must be a host name or address, got ""');
  });
});

describe("two agents in one process", () => {
  it("each counts its own items on its own endpoint, and both serve the process metrics", async () => {
    const a = testAgent(daemon.address, { engineKinds: ["metered-a"], metricsPort: 0, handlers: { "metered-a": () => "a" } });
    const b = testAgent(daemon.address, { engineKinds: ["metered-b"], metricsPort: 0, handlers: { "metered-b": () => "b" } });
    await Promise.all([a.start(), b.start()]);
    expect(a.metricsAddress).not.toBe(b.metricsAddress);
    await producer.waitDone(await producer.enqueue([{ engineKind: "metered-a" }, { engineKind: "metered-a" }, { engineKind: "metered-b" }]));
    const count = async (agent: Agent, kind: string) =>
      value(await scrape(agent), "aiflow_sdk_items_handled_total", { engine_kind: kind, outcome: "completed" });
    await until("both counted their items", async () => (await count(a, "metered-a")) === 2 && (await count(b, "metered-b")) === 1);
    expect(await count(a, "metered-b")).toBeUndefined();
    expect(await count(b, "metered-a")).toBeUndefined();
    for (const agent of [a, b]) expect(family(await scrape(agent), "process_resident_memory_bytes")?.type).toBe("GAUGE");
  });
});
