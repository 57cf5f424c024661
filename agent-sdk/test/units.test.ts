/** The SDK's pure parts: handler choice, options, backoff, the lifecycle, results, metrics parsing. */
import { chmod, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { backoffDelay } from "../src/backoff.js";
import { ClaimAhead } from "../src/claim-ahead.js";
import { Claimer } from "../src/claimer.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { Link } from "../src/link.js";
import { describeHandlers, resolveHandler } from "../src/handlers.js";
import { NonRetryableError, RetryableError, type Handlers, type WorkItem } from "../src/index.js";
import { Lifecycle, type AgentState } from "../src/lifecycle.js";
import { MetricsSampler, parseNvidiaSmi } from "../src/liveness/metrics.js";
import { resolveOptions } from "../src/options.js";
import { ItemContext, Run, settle } from "../src/run.js";

describe("handler choice", () => {
  const named = (name: string) => Object.assign(async () => name, { label: name });
  const handlers: Handlers = {
    dag: { resize: named("dag/resize"), "*": named("dag/*") },
    graph: { only: named("graph/only") },
    test: named("test"),
    "*": { special: named("*/special"), "*": named("*/*") },
  };
  const pick = (kind: string, task?: string) => (resolveHandler(handlers, kind, task) as { label?: string } | undefined)?.label;

  it("takes the most specific handler, then the kind's wildcard, then the top-level wildcard", () => {
    expect(pick("dag", "resize")).toBe("dag/resize");
    expect(pick("dag", "other")).toBe("dag/*");
    expect(pick("dag")).toBe("dag/*");
    expect(pick("test", "anything")).toBe("test");
    expect(pick("graph", "only")).toBe("graph/only");
    expect(pick("graph", "special")).toBe("*/special");
    expect(pick("graph", "else")).toBe("*/*");
    expect(pick("unknown")).toBe("*/*");
  });

  it("finds nothing when nothing matches, and says what the agent does handle", () => {
    const strict: Handlers = { dag: { resize: async () => 1 }, test: async () => 2 };
    expect(resolveHandler(strict, "dag", "crop")).toBeUndefined();
    expect(resolveHandler(strict, "graph", "resize")).toBeUndefined();
    expect(describeHandlers(strict)).toBe("dag{resize}, test");
  });
});

describe("options", () => {
  const base = { address: "127.0.0.1:7400", name: "worker-1", tenants: ["acme"], handlers: { dag: async () => 1, test: async () => 2 } };

  it("fills the defaults; engine kinds default to the handlers' kinds", () => {
    const o = resolveOptions({ ...base, handlers: { ...base.handlers, "*": async () => 3 } });
    expect(o).toMatchObject({
      addresses: ["127.0.0.1:7400"],
      token: undefined,
      engineKinds: ["dag", "test"],
      slots: 1,
      prefetch: 3,
      mounts: ["/"],
      gracefulShutdownMs: 30_000,
      handleSignals: false,
      claimWaitMs: 20_000,
      reportCoalesceMs: 5,
      reportMaxBatch: 500,
      rpcTimeoutMs: 10_000,
      reconnect: { initialDelayMs: 200, maxDelayMs: 10_000 },
      agentType: "remote",
    });
  });

  it("refuses what cannot work, naming the option", () => {
    expect(() => resolveOptions({ ...base, address: undefined })).toThrow("createAgent: address is required (or addresses)");
    expect(() => resolveOptions({ ...base, addresses: ["a:1"] })).toThrow("address and addresses are exclusive");
    expect(() => resolveOptions({ ...base, name: "has space" })).toThrow("createAgent: name must be 1-128 characters");
    expect(() => resolveOptions({ ...base, tenants: [] })).toThrow("createAgent: tenants needs at least one tenant key");
    expect(() => resolveOptions({ ...base, handlers: {} })).toThrow("createAgent: handlers needs at least one handler");
    expect(() => resolveOptions({ ...base, handlers: { "*": async () => 1 } })).toThrow("engineKinds is required when the only handler is '*'");
    expect(() => resolveOptions({ ...base, slots: 0 })).toThrow("createAgent: slots must be a whole number in 1..100000, got 0");
    expect(() => resolveOptions({ ...base, rpcTimeoutMs: -1 })).toThrow("createAgent: rpcTimeoutMs must be a number >= 1");
    expect(() => resolveOptions({ ...base, prefetch: 1.5 })).toThrow("createAgent: prefetch must be a whole number in 0..100000, got 1.5");
    expect(() => resolveOptions({ ...base, prefetch: -1 })).toThrow("createAgent: prefetch must be a whole number in 0..100000, got -1");
  });

  it("claims ahead three times the slots by default, within the daemon's default claim cap, and as asked", () => {
    expect(resolveOptions({ ...base, slots: 32 }).prefetch).toBe(96);
    expect(resolveOptions({ ...base, slots: 100 }).prefetch).toBe(156);
    expect(resolveOptions({ ...base, slots: 500 }).prefetch).toBe(0);
    expect(resolveOptions({ ...base, slots: 32, prefetch: 0 }).prefetch).toBe(0);
  });
});

describe("claiming ahead", () => {
  it("claims nothing ahead until both a handler's time and an at-once claim's round trip are known", () => {
    const ahead = new ClaimAhead(4, 100);
    expect(ahead.allowance).toBe(0);
    ahead.handlerTook(1);
    expect(ahead.allowance).toBe(0);
    const other = new ClaimAhead(4, 100);
    other.claimTook(10);
    expect(other.allowance).toBe(0);
    ahead.claimTook(10);
    expect(ahead.allowance).toBe(40);
  });

  it("claims ahead what the slots finish in one round trip (Little's law), within the cap", () => {
    const ahead = new ClaimAhead(8, 1_000);
    ahead.handlerTook(20);
    ahead.claimTook(5);
    // 8 slots finish 8 × 5 / 20 = 2 items in a 5 ms round trip.
    expect(ahead.allowance).toBe(2);
    const fast = new ClaimAhead(32, 96);
    fast.handlerTook(0);
    fast.claimTook(25);
    expect(fast.allowance).toBe(96);
  });

  it("claims nothing ahead for handlers much slower than a round trip, or when turned off", () => {
    const slow = new ClaimAhead(32, 96);
    slow.handlerTook(60_000);
    slow.claimTook(20);
    expect(slow.allowance).toBe(0);
    const off = new ClaimAhead(32, 0);
    off.handlerTook(0);
    off.claimTook(20);
    expect(off.allowance).toBe(0);
  });

  it("follows the handlers' time as it changes, weighting the newest samples", () => {
    const ahead = new ClaimAhead(10, 1_000);
    ahead.claimTook(10);
    ahead.handlerTook(1);
    expect(ahead.allowance).toBe(100);
    // The handlers slow down to a second each: within a few dozen items nothing is claimed ahead.
    for (let i = 0; i < 30; i++) ahead.handlerTook(1_000);
    expect(ahead.allowance).toBe(0);
  });
});

describe("backoff", () => {
  it("doubles up to the cap, with jitter in the upper half", () => {
    const opts = { initialDelayMs: 100, maxDelayMs: 1_000 };
    expect([0, 1, 2, 3, 4, 10, 100].map((a) => backoffDelay(a, opts, () => 1))).toEqual([100, 200, 400, 800, 1_000, 1_000, 1_000]);
    expect([0, 1, 2, 3, 4].map((a) => backoffDelay(a, opts, () => 0))).toEqual([50, 100, 200, 400, 500]);
  });
});

describe("lifecycle", () => {
  it("allows only the documented transitions, and its iterator ends after a terminal state", async () => {
    const life = new Lifecycle();
    const seen: AgentState[] = [];
    const iterating = (async () => {
      for await (const s of life.states()) seen.push(s);
    })();
    expect(life.to("running")).toBe(false);
    expect(life.to("starting")).toBe(true);
    expect(life.to("drained")).toBe(false);
    expect(life.to("running")).toBe(true);
    expect(life.to("starting")).toBe(false);
    expect(life.to("draining")).toBe(true);
    expect(life.to("drained")).toBe(true);
    expect(life.to("stopped")).toBe(true);
    expect(life.to("failed")).toBe(false);
    await iterating;
    expect(seen).toEqual(["initialized", "starting", "running", "draining", "drained", "stopped"]);
    expect(await life.settled()).toBe("stopped");
  });
});

describe("handler results", () => {
  const item = { id: "01ITEM", tenant: "t1", engineKind: "k", attempt: 1 } as WorkItem;
  const log = pino({ level: "silent" });
  const run = () => new Run(item, "token-1");
  const settleWith = (fn: () => unknown) => {
    const r = run();
    return settle(r, async () => fn(), new ItemContext(r, log, "a"));
  };

  it("a handler's context carries the agent's name, the run's signal, and a logger with the item bound (made once)", () => {
    const lines: Record<string, unknown>[] = [];
    const agentLog = pino({ base: { agent: "a" } }, { write: (line: string) => void lines.push(JSON.parse(line)) });
    const item = { id: "01CTX", tenant: "t2", engineKind: "render", taskName: "frames", attempt: 3 } as WorkItem;
    const r = new Run(item, "token-2");
    const ctx = new ItemContext(r, agentLog, "agent-7");
    expect(ctx.agent).toBe("agent-7");
    // The run (which can abort the item) is not handed to the handler with it.
    expect(Object.keys(ctx)).toEqual(["agent"]);
    expect(ctx.log).toBe(ctx.log);
    ctx.log.info("hello");
    expect(lines).toEqual([
      expect.objectContaining({ agent: "a", item: "01CTX", tenant: "t2", engineKind: "render", task: "frames", attempt: 3, msg: "hello" }),
    ]);
    expect(ctx.signal).toBe(r.signal);
    r.abort("cancelled", "stop");
    expect(ctx.signal.aborted).toBe(true);
  });

  it("a run aborted before its handler read the signal hands out an aborted signal with the reason", () => {
    const r = run();
    expect(r.aborted).toBe(false);
    r.abort("cancelled", "the operator cancelled it");
    r.abort("lease-lost", "a second abort changes nothing");
    expect(r.aborted).toBe(true);
    expect(r.signal.aborted).toBe(true);
    expect(r.signal.reason).toMatchObject({ kind: "cancelled", message: "the operator cancelled it" });
    const read = run();
    const signal = read.signal;
    read.abort("lease-lost", "gone");
    expect(signal.aborted).toBe(true);
    expect(read.aborted).toBe(true);
  });

  it("turns values into completions and errors into failures", async () => {
    expect(await settleWith(() => ({ a: 1 }))).toEqual({ kind: "complete", id: "01ITEM", token: "token-1", resultJson: '{"a":1}' });
    expect(await settleWith(() => undefined)).toMatchObject({ kind: "complete", resultJson: "" });
    expect(await settleWith(() => null)).toMatchObject({ kind: "complete", resultJson: "null" });
    expect(await settleWith(() => () => 1)).toMatchObject({ kind: "complete", resultJson: "" });
    expect(await settleWith(() => 10n)).toMatchObject({
      kind: "fail",
      retryable: false,
      error: expect.stringMatching(/^the handler's result is not JSON-serialisable: TypeError/),
    });
    const circular: Record<string, unknown> = {};
    circular.self = circular;
    expect(await settleWith(() => circular)).toMatchObject({ kind: "fail", retryable: false });
    const fail = (err: unknown) =>
      settleWith(() => {
        throw err;
      });
    expect(await fail(new Error("boom"))).toMatchObject({ kind: "fail", retryable: true, error: "Error: boom", retryDelayMs: undefined });
    expect(await fail(new NonRetryableError("bad input"))).toMatchObject({ retryable: false, error: "NonRetryableError: bad input" });
    expect(await fail(new RetryableError("later", { retryDelayMs: 1_500 }))).toMatchObject({ retryable: true, retryDelayMs: 1_500 });
    expect(await fail("a string")).toMatchObject({ retryable: true, error: "thrown value: a string" });
    expect(((await fail(new Error("x".repeat(20_000)))) as { error: string }).error.length).toBeLessThan(8_200);
  });
});

describe("metrics", () => {
  it("parses nvidia-smi's CSV, in bytes, skipping GPUs whose numbers it does not have", () => {
    const csv = ["0, NVIDIA H100 80GB HBM3, 97, 40960, 81559", "1, NVIDIA A10G, [N/A], 10, 23028", "2, Tesla T4, 0, 0, 15360", ""].join("\n");
    expect(parseNvidiaSmi(csv)).toEqual([
      { index: 0, model: "NVIDIA H100 80GB HBM3", utilization: 97, memoryUsedBytes: 40960n * 1048576n, memoryTotalBytes: 81559n * 1048576n },
      { index: 2, model: "Tesla T4", utilization: 0, memoryUsedBytes: 0n, memoryTotalBytes: 15360n * 1048576n },
    ]);
  });

  it("reports the GPUs nvidia-smi lists, and none at all without nvidia-smi", async () => {
    const dir = await mkdtemp(join(tmpdir(), "fake-nvidia-smi-"));
    try {
      const fake = join(dir, "nvidia-smi");
      await writeFile(
        fake,
        `#!/bin/sh\n[ "$1" = "--query-gpu=index,name,utilization.gpu,memory.used,memory.total" ] || exit 9\necho "0, Fake GPU, 42, 1024, 2048"\n`,
      );
      await chmod(fake, 0o755);
      const withGpu = await new MetricsSampler(["/"], { nvidiaSmi: fake }).sample();
      expect(withGpu.gpus).toEqual([{ index: 0, model: "Fake GPU", utilization: 42, memoryUsedBytes: 1024n * 1048576n, memoryTotalBytes: 2048n * 1048576n }]);
      expect(withGpu.disks).toEqual([{ mount: "/", freeBytes: expect.any(BigInt), totalBytes: expect.any(BigInt) }]);
      const without = await new MetricsSampler([], { nvidiaSmi: join(dir, "absent") }).sample();
      expect(without.gpus).toEqual([]);
      expect(without.disks).toEqual([]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe("claimer", () => {
  it("claims for the slots free when it claims, after gathering, not for those free when it began", async () => {
    const opts = resolveOptions({ address: "127.0.0.1:1", name: "gatherer", tenants: ["t"], engineKinds: ["k"], slots: 16, handlers: { k: async () => null } });
    let free = 1;
    const asked: number[] = [];
    let claimer!: Claimer;
    let claimedOnce!: () => void;
    const claimed = new Promise<void>((resolve) => (claimedOnce = resolve));
    const link = {
      generation: 1,
      client: {
        claim: async (req: { maxItems: number }) => {
          asked.push(req.maxItems);
          claimedOnce();
          void claimer.stop();
          return { items: [], status: AgentStatus.ACTIVE, completionOutcomes: [] };
        },
      },
    } as unknown as Link;
    claimer = new Claimer(link, opts, { room: () => free, answeredAtOnce: () => {}, onItems: () => {}, onStatus: () => {}, lend: () => undefined });
    claimer.start();
    // One slot is free: the claimer gathers for more (a quarter of 16). Three more come free meanwhile.
    free = 4;
    claimer.nudge();
    await claimed;
    await claimer.stop();
    expect(asked).toEqual([4]);
  });
});
