/**
 * The SDK's work loop against a real daemon over HTTP/2: claim, run, report. A producer enqueues
 * through QueueService and sees what the agent reported; the agent's own calls are counted by an
 * interceptor to show what it did and did not send.
 */
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../../src/daemon.js";
import { agentRow } from "../../test/support/agents.js";
import type { TestDb } from "../../test/support/db.js";
import { useTestDaemon } from "../../test/support/kit.js";
import { AgentFailedError, NonRetryableError, RetryableError, type AgentState, type WorkItem } from "../src/index.js";
import { callLog, deferred, finished, Producer, testAgent, until, WorkItemStatus } from "./support.js";

const fx = useTestDaemon({
  label: "sdkwork",
  config: { backoffBase: 10, backoffCap: 20, backoffJitter: "none", heartbeatInterval: 500, heartbeatFlush: 50, sweepInterval: 50 },
});
let db: TestDb;
let daemon: Daemon;
let producer: Producer;

beforeAll(() => {
  ({ db, daemon } = fx);
  producer = fx.closers.add(new Producer(daemon.address, "t1"));
});

describe("without either fast path", () => {
  it.each([
    ["over the stream", true],
    ["by unary claims", false],
  ])(
    "an agent over connect-node's transport, against a daemon that serves every call through connect-node, runs and reports its items (%s)",
    async (_how, stream) => {
      const plain = await fx.startDaemon({ config: { grpcFastPath: "off", heartbeatInterval: 500, heartbeatFlush: 50 } });
      const plainProducer = new Producer(plain.address, "t1");
      const calls = callLog();
      const agent = testAgent(plain.address, {
        engineKinds: ["plain-path"],
        fastTransport: false,
        stream,
        interceptors: [calls.interceptor],
        handlers: { "plain-path": async (item) => ({ twice: (item.payload as { n: number }).n * 2 }) },
      });
      try {
        await agent.start();
        const ids = await plainProducer.enqueue([1, 2, 3].map((n) => ({ engineKind: "plain-path", payloadJson: JSON.stringify({ n }) })));
        const done = await plainProducer.waitDone(ids);
        expect(done.map((d) => [d.status, JSON.parse(d.resultJson)])).toEqual([1, 2, 3].map((n) => [WorkItemStatus.COMPLETED, { twice: n * 2 }]));
        if (stream) {
          expect(calls.count("Claim") + calls.count("Complete")).toBe(0);
          expect(calls.streamed("completions")).toHaveLength(3);
        } else expect(calls.count("Claim")).toBeGreaterThan(0);
      } finally {
        await agent.stop();
        plainProducer.close();
        await plain.stop();
      }
    },
  );
});

describe("happy path", () => {
  it("registers, runs the item's handler with the typed item, completes it with the result, and deregisters on stop", async () => {
    const seen: WorkItem[] = [];
    const calls = callLog();
    const agent = testAgent(daemon.address, {
      engineKinds: ["happy"],
      slots: 2,
      tags: { zone: "eu-1" },
      interceptors: [calls.interceptor],
      handlers: {
        happy: async (item: WorkItem<{ n: number }>, ctx) => {
          seen.push(item);
          expect(ctx.signal.aborted).toBe(false);
          expect(ctx.agent).toBe(agent.name);
          return { doubled: item.payload.n * 2 };
        },
      },
    });
    const states: AgentState[] = [];
    const watching = (async () => {
      for await (const s of agent.states()) states.push(s);
    })();
    await agent.start();
    expect(agent.state).toBe("running");
    expect(agent.registration).toMatchObject({ address: daemon.address, created: true, heartbeatIntervalMs: 500, status: "active" });
    expect((await agentRow(db, agent.name))?.status).toBe("active");

    const [id] = await producer.enqueue([
      {
        engineKind: "happy",
        runId: "run-1",
        taskName: "double",
        payloadJson: JSON.stringify({ n: 21 }),
        workerParams: { selector: { zone: "eu-1" }, affinityKey: "run-1" },
      },
    ]);
    const [done] = await producer.waitDone([id!]);
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, agentId: agent.name });
    expect(JSON.parse(done!.resultJson)).toEqual({ doubled: 42 });
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({
      id,
      tenant: "t1",
      engineKind: "happy",
      runId: "run-1",
      taskName: "double",
      payload: { n: 21 },
      attempt: 1,
      maxRetries: 0,
      selector: { zone: "eu-1" },
      affinityKey: "run-1",
    });

    await agent.stop();
    await watching;
    expect(states).toEqual(["initialized", "starting", "running", "draining", "drained", "stopped"]);
    expect((await agentRow(db, agent.name))?.status).toBe("inactive");
    expect(calls.count("Register")).toBe(1);
    expect(calls.count("Deregister")).toBe(1);
  });

  it("over the stream, keeps every slot busy and reports each completion once, several to a message, with no Claim or Complete call", async () => {
    const calls = callLog();
    let running = 0;
    let peak = 0;
    const agent = testAgent(daemon.address, {
      engineKinds: ["bulk-stream"],
      slots: 16,
      interceptors: [calls.interceptor],
      handlers: {
        "bulk-stream": async (item) => {
          peak = Math.max(peak, ++running);
          await new Promise((r) => setTimeout(r, 2));
          running--;
          return item.payload;
        },
      },
    });
    await agent.start();
    const ids = await producer.enqueue(Array.from({ length: 200 }, (_, i) => ({ engineKind: "bulk-stream", payloadJson: String(i) })));
    const items = await producer.waitDone(ids);
    expect(items.filter((i) => i.status !== WorkItemStatus.COMPLETED).map((i) => [WorkItemStatus[i.status], i.error])).toEqual([]);
    expect(peak).toBe(16);
    const completed = calls.streamed("completions") as { workItemId: string }[];
    expect(completed.map((c) => c.workItemId).sort()).toEqual([...ids].sort());
    expect(calls.streamMessages("completions").length).toBeLessThan(100);
    expect(calls.count("Claim") + calls.count("Complete") + calls.count("WatchDirectives")).toBe(0);
    expect(calls.count("Connect")).toBe(1);
  });

  it("by unary claims, keeps every slot busy and reports completions in few calls, mostly aboard the next claim", async () => {
    const calls = callLog();
    let running = 0;
    let peak = 0;
    const agent = testAgent(daemon.address, {
      engineKinds: ["bulk"],
      slots: 16,
      stream: false,
      // Claims for the free slots only. Claiming ahead leaves the agent holding more items when the
      // queue runs dry, and their completions go in Complete calls while its claim long-polls: fewer
      // calls in all, but not mostly aboard claims, which is what this test is about.
      prefetch: 0,
      interceptors: [calls.interceptor],
      handlers: {
        bulk: async (item) => {
          peak = Math.max(peak, ++running);
          await new Promise((r) => setTimeout(r, 2));
          running--;
          return item.payload;
        },
      },
    });
    await agent.start();
    const ids = await producer.enqueue(Array.from({ length: 200 }, (_, i) => ({ engineKind: "bulk", payloadJson: String(i) })));
    const items = await producer.waitDone(ids);
    expect(items.filter((i) => i.status !== WorkItemStatus.COMPLETED).map((i) => [WorkItemStatus[i.status], i.error])).toEqual([]);
    expect(peak).toBe(16);
    // 200 completions in far fewer calls: reports that land within a few ms share one, and the
    // claim that refills the freed slots carries them; each is reported exactly once.
    const carried = (method: string, field: "items" | "completions") =>
      calls.calls.filter((c) => c.method === method).reduce((n, c) => n + (c.message as Record<typeof field, unknown[]>)[field].length, 0);
    const byComplete = carried("Complete", "items");
    const byClaim = carried("Claim", "completions");
    expect(byComplete + byClaim).toBe(200);
    expect(byClaim).toBeGreaterThan(byComplete);
    const reportingCalls =
      calls.count("Complete") + calls.calls.filter((c) => c.method === "Claim" && (c.message as { completions: unknown[] }).completions.length > 0).length;
    expect(reportingCalls).toBeLessThan(100);
  });
});

describe("items that trickle in", () => {
  it("are pushed on the stream as they are enqueued, and their completions travel on it", async () => {
    const calls = callLog();
    const agent = testAgent(daemon.address, {
      engineKinds: ["trickle-stream"],
      slots: 4,
      interceptors: [calls.interceptor],
      handlers: { "trickle-stream": async (item) => item.payload },
    });
    await agent.start();
    const all: string[] = [];
    for (let i = 0; i < 5; i++) {
      const ids = await producer.enqueue([{ engineKind: "trickle-stream", payloadJson: String(i) }]);
      expect((await producer.waitDone(ids)).map((it) => it.status)).toEqual([WorkItemStatus.COMPLETED]);
      all.push(...ids);
    }
    const pushed = calls.stream.filter((e) => e.method === "Connect" && e.dir === "received").flatMap((e) => e.message.items as { id: string }[]);
    expect(pushed.map((i) => i.id)).toEqual(all);
    expect((calls.streamed("completions") as { workItemId: string }[]).map((c) => c.workItemId)).toEqual(all);
    expect(calls.count("Claim") + calls.count("Complete")).toBe(0);
    await agent.stop();
  });

  it("by unary claims, report the completions of quick handlers aboard the next long-poll, not in Complete calls of their own", async () => {
    const calls = callLog();
    const agent = testAgent(daemon.address, {
      engineKinds: ["trickle"],
      slots: 4,
      stream: false,
      interceptors: [calls.interceptor],
      handlers: { trickle: async (item) => item.payload },
    });
    await agent.start();
    // One at a time, each finished before the next is sent: every claim that brings an item is
    // followed by a claim that waits for the next one and carries the last one's completion.
    for (let i = 0; i < 5; i++) {
      const ids = await producer.enqueue([{ engineKind: "trickle", payloadJson: String(i) }]);
      expect((await producer.waitDone(ids)).map((it) => it.status)).toEqual([WorkItemStatus.COMPLETED]);
    }
    expect(calls.count("Complete")).toBe(0);
    const carrying = calls.calls.filter((c) => c.method === "Claim" && (c.message as { completions: unknown[] }).completions.length > 0);
    expect(carrying.length).toBe(5);
    expect(carrying.every((c) => (c.message as { waitWithCompletions: boolean }).waitWithCompletions)).toBe(true);
    await agent.stop();
  });
});

describe("failures", () => {
  it("a throwing handler fails the item retryably until its retries are spent, then it is a dead letter", async () => {
    let attempts = 0;
    const agent = testAgent(daemon.address, {
      engineKinds: ["flaky"],
      handlers: {
        flaky: async (item) => {
          attempts++;
          throw new Error(`boom on attempt ${item.attempt}`);
        },
      },
    });
    await agent.start();
    const [id] = await producer.enqueue([{ engineKind: "flaky", maxRetries: 1 }]);
    const [done] = await producer.waitDone([id!]);
    expect(done).toMatchObject({ status: WorkItemStatus.FAILED, retryCount: 1, error: "Error: boom on attempt 2" });
    expect(attempts).toBe(2);
  });

  it("NonRetryableError dead-letters at once; RetryableError chooses the delay", async () => {
    const calls = callLog();
    const agent = testAgent(daemon.address, {
      engineKinds: ["strict"],
      interceptors: [calls.interceptor],
      handlers: {
        strict: {
          permanent: async () => {
            throw new NonRetryableError("bad input");
          },
          later: async (item) => {
            if (item.attempt === 1) throw new RetryableError("not yet", { retryDelayMs: 30 });
            return "second time lucky";
          },
        },
      },
    });
    await agent.start();
    const [permanent, later] = await producer.enqueue([
      { engineKind: "strict", taskName: "permanent", maxRetries: 5 },
      { engineKind: "strict", taskName: "later", maxRetries: 5 },
    ]);
    const done = await producer.waitDone([permanent!, later!]);
    expect(done.find((i) => i.id === permanent)).toMatchObject({ status: WorkItemStatus.FAILED, retryCount: 0, error: "NonRetryableError: bad input" });
    expect(done.find((i) => i.id === later)).toMatchObject({
      status: WorkItemStatus.COMPLETED,
      retryCount: 1,
      resultJson: JSON.stringify("second time lucky"),
    });
    type Failure = { workItemId: string; retryable: boolean; retryDelay?: { nanos: number } };
    const fails = [
      ...calls.calls.filter((c) => c.method === "Fail").flatMap((c) => (c.message as { items: Failure[] }).items),
      ...(calls.streamed("failures") as Failure[]),
    ];
    expect(fails).toHaveLength(2);
    expect(fails.find((f) => f.workItemId === permanent)).toMatchObject({ retryable: false });
    expect(fails.find((f) => f.workItemId === later)).toMatchObject({ retryable: true, retryDelay: { nanos: 30_000_000 } });
  });

  it("an item no handler takes is failed for good with an error that says so, not dropped", async () => {
    const agent = testAgent(daemon.address, { engineKinds: ["picky"], handlers: { picky: { known: async () => "ok" } } });
    await agent.start();
    const [id] = await producer.enqueue([{ engineKind: "picky", taskName: "unknown-task", maxRetries: 3 }]);
    const [done] = await producer.waitDone([id!]);
    expect(done).toMatchObject({ status: WorkItemStatus.FAILED, retryCount: 0 });
    expect(done!.error).toBe(`no handler for engine kind 'picky' and task 'unknown-task' on agent '${agent.name}' (it handles: picky{known})`);
  });
});

describe("cancel directive", () => {
  it("cancelling a dispatched item aborts its handler's signal and reports nothing for it", async () => {
    const calls = callLog();
    const started = deferred();
    let reason: unknown;
    const agent = testAgent(daemon.address, {
      engineKinds: ["cancellable"],
      interceptors: [calls.interceptor],
      handlers: {
        cancellable: async (_item, ctx) => {
          started.resolve();
          await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
          reason = ctx.signal.reason;
          return "too late";
        },
      },
    });
    await agent.start();
    const [id] = await producer.enqueue([{ engineKind: "cancellable" }]);
    await started.promise;
    const outcome = finished(agent, id!);
    await producer.queue.cancel({ tenantKey: "t1", ids: [id!], reason: "user changed their mind" });
    expect((await outcome).outcome).toEqual({ kind: "cancelled", reason: "user changed their mind" });
    expect(reason).toMatchObject({ name: "WorkAbortedError", kind: "cancelled", message: "user changed their mind" });
    expect(await producer.get(id!)).toMatchObject({ status: WorkItemStatus.CANCELLED, resultJson: "" });
    // The handler returned after the abort: nothing about the item went out.
    await until("the handler returned", () => agent.inFlight === 0);
    const reported = calls.calls
      .filter((c) => ["Complete", "Fail"].includes(c.method))
      .flatMap((c) => (c.message as { items: { workItemId: string }[] }).items);
    expect(reported.map((r) => r.workItemId)).not.toContain(id);
  });
});

describe("refusal", () => {
  it("a token the daemon refuses fails the agent: start() and run() reject with an AgentFailedError", async () => {
    const agent = testAgent(daemon.address, { token: "not-a-token", engineKinds: ["refused"], handlers: { refused: () => "never" } });
    await expect(agent.start()).rejects.toBeInstanceOf(AgentFailedError);
    expect(agent.state).toBe("failed");
    expect(agent.error?.message).toMatch(new RegExp(`the daemon at ${daemon.address} refused to register agent '${agent.name}': \\[unauthenticated\\]`));
    await expect(agent.run()).rejects.toBe(agent.error);
  });
});
