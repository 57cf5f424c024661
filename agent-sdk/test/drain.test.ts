/**
 * Shutdown: whatever starts it (agent.drain(), the daemon's drain directive), the order is the
 * same — stop claiming, let in-flight items finish within the deadline (then abort and give back
 * what still runs), report, deregister. The call log shows the order on the wire.
 */
import type { Client } from "@connectrpc/connect";
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../../src/daemon.js";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { agentRow } from "../../test/support/agents.js";
import { bearer, TOKENS } from "../../test/support/daemon.js";
import type { TestDb } from "../../test/support/db.js";
import { useTestDaemon } from "../../test/support/kit.js";
import type { Agent, AgentOptions, AgentState } from "../src/index.js";
import { callLog, deferred, finished, Producer, testAgent, until, WorkItemStatus } from "./support.js";

const fx = useTestDaemon({ label: "sdkdrain", config: { heartbeatInterval: 300, heartbeatFlush: 50, sweepInterval: 50 } });
let db: TestDb;
let daemon: Daemon;
let producer: Producer;

beforeAll(() => {
  ({ db, daemon } = fx);
  producer = fx.closers.add(new Producer(daemon.address, "t1"));
});

function recordStates(agent: Agent): AgentState[] {
  const states: AgentState[] = [agent.state];
  agent.on("state", (s) => states.push(s));
  return states;
}

/** Index of the first call of `method` at or after `from`; -1 when none. */
const indexOf = (calls: { method: string }[], method: string, from = 0) => calls.findIndex((c, i) => i >= from && c.method === method);
const lastIndexOf = (calls: { method: string }[], method: string) => calls.map((c) => c.method).lastIndexOf(method);

/** Whether a Connect message the agent sent carries entries in `field`. */
const carries = (field: string) => (m: Record<string, unknown>) => ((m[field] as unknown[] | undefined)?.length ?? 0) > 0;

describe.each([
  ["over the stream", true],
  ["by unary claims", false],
])("agent.drain() (%s)", (_how, stream) => {
  it("stops claiming, lets in-flight items finish and reports them, then deregisters", async () => {
    const calls = callLog();
    const gate = deferred();
    let started = 0;
    const agent = testAgent(daemon.address, {
      engineKinds: [`gated-${stream}`],
      slots: 2,
      stream,
      interceptors: [calls.interceptor],
      handlers: {
        [`gated-${stream}`]: async (item) => {
          started++;
          await gate.promise;
          return `finished ${item.id}`;
        },
      },
    });
    await agent.start();
    const states = recordStates(agent);
    const ids = await producer.enqueue([{ engineKind: `gated-${stream}` }, { engineKind: `gated-${stream}` }]);
    await until("both items run", () => started === 2);

    const drained = agent.drain({ deadline: 10_000 });
    await until("the agent is draining", () => agent.state === "draining");
    const claimsAtDrain = calls.count("Claim");
    if (stream) await until("the stream's credits are withdrawn", () => calls.lastSent((m) => m.withdrawCredits === true) >= 0);
    const [late] = await producer.enqueue([{ engineKind: `gated-${stream}` }]);
    gate.resolve();
    await drained;

    expect(states).toEqual(["running", "draining", "drained", "stopped"]);
    const items = await producer.waitDone(ids);
    expect(items.map((i) => [i.status, i.resultJson])).toEqual(ids.map((id) => [WorkItemStatus.COMPLETED, JSON.stringify(`finished ${id}`)]));
    expect(calls.count("Claim")).toBe(claimsAtDrain);
    expect(await producer.get(late!)).toMatchObject({ status: WorkItemStatus.PENDING, agentId: "" });
    // On the wire: the completions, then the deregistration, and nothing after it.
    if (stream) {
      const withdrawn = calls.lastSent((m) => m.withdrawCredits === true);
      expect(calls.lastSent((m) => Number(m.credits ?? 0) > 0)).toBeLessThan(withdrawn);
      expect((calls.streamed("completions") as { workItemId: string }[]).map((c) => c.workItemId).sort()).toEqual([...ids].sort());
      expect(calls.lastSent(carries("completions"))).toBeLessThan(calls.lastSent((m) => m.goodbye === true));
      expect(calls.lastSent((m) => m.goodbye === true)).toBeLessThan(calls.firstCall("Deregister"));
      expect(calls.count("Complete")).toBe(0);
    } else expect(lastIndexOf(calls.calls, "Complete")).toBeLessThan(indexOf(calls.calls, "Deregister"));
    expect(calls.calls.at(-1)?.method).toBe("Deregister");
    expect((await agentRow(db, agent.name))?.status).toBe("inactive");
    await producer.queue.cancel({ tenantKey: "t1", ids: [late!] });
  });

  it("at the deadline, what still runs is aborted and given back to the queue without spending an attempt", async () => {
    const calls = callLog();
    const started = deferred<AbortSignal>();
    const reason = deferred<unknown>();
    const agent = testAgent(daemon.address, {
      engineKinds: [`stubborn-${stream}`],
      // One slot stays free, so a claim is out (or a credit granted) waiting for work when the drain begins.
      slots: 2,
      prefetch: 0,
      stream,
      interceptors: [calls.interceptor],
      handlers: {
        [`stubborn-${stream}`]: async (_item, ctx) => {
          started.resolve(ctx.signal);
          await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
          reason.resolve(ctx.signal.reason);
          return "ignored";
        },
      },
    });
    await agent.start();
    const [id] = await producer.enqueue([{ engineKind: `stubborn-${stream}`, maxRetries: 2 }]);
    const signal = await started.promise;
    await until("a claim waits for more work", () => (stream ? calls.outstanding() === 1 : calls.out("Claim") === 1));
    const outcome = finished(agent, id!);

    // Before its deadline (an hour off) the drain stops claiming, its waiting claim cancelled, and
    // then only waits: the handler runs on.
    const drained = agent.drain({ deadline: 3_600_000 });
    const answered = () => calls.stream.some((e) => e.dir === "received" && e.message.creditsWithdrawn === true);
    await until("the drain has stopped claiming", () => agent.state === "draining" && (stream ? answered() : calls.out("Claim") === 0));
    expect(signal.aborted).toBe(false);
    expect(agent.inFlight).toBe(1);
    // The deadline comes: a drain asked for now moves it there (a deadline only ever moves earlier).
    void agent.drain({ deadline: 0 });
    await drained;

    expect(await reason.promise).toMatchObject({ name: "WorkAbortedError", kind: "drain-deadline" });
    expect((await outcome).outcome).toEqual({ kind: "released" });
    expect(agent.state).toBe("stopped");
    expect(await producer.get(id!)).toMatchObject({ status: WorkItemStatus.PENDING, retryCount: 0, agentId: "" });
    if (stream) {
      expect(calls.streamed("releases")).toEqual([expect.objectContaining({ workItemId: id })]);
      expect(calls.lastSent(carries("releases"))).toBeLessThan(calls.firstCall("Deregister"));
      expect(calls.streamed("completions").length + calls.streamed("failures").length).toBe(0);
    } else expect(indexOf(calls.calls, "Release")).toBeLessThan(indexOf(calls.calls, "Deregister"));
    expect(calls.count("Complete") + calls.count("Fail")).toBe(0);
    await producer.queue.cancel({ tenantKey: "t1", ids: [id!] });
  });

  it("stop() on an agent that never started just stops", async () => {
    const agent = testAgent(daemon.address, { engineKinds: ["idle"], handlers: { idle: () => undefined } });
    await agent.stop();
    expect(agent.state).toBe("stopped");
    await expect(agent.start()).rejects.toThrow(/cannot start: it is stopped/);
  });
});

describe("the daemon's drain directive", () => {
  let opsClient: Client<typeof OpsService> | undefined;
  const ops = () => (opsClient ??= fx.client(OpsService));
  const opsCall = { headers: bearer(TOKENS.ops) };

  /**
   * A running agent of one engine kind whose handler holds the first item it runs until `gate`
   * opens (later items finish at once), its calls logged and its states recorded from `running` on.
   */
  async function gatedAgent(kind: string, extra: Partial<AgentOptions> = {}) {
    const calls = callLog();
    const gate = deferred();
    const running = deferred();
    let held = false;
    const agent = testAgent(daemon.address, {
      engineKinds: [kind],
      interceptors: [calls.interceptor],
      ...extra,
      handlers: {
        [kind]: async (item) => {
          if (!held) {
            held = true;
            running.resolve();
            await gate.promise;
          }
          return `ran ${item.id}`;
        },
      },
    });
    const ended = agent.run();
    await until("registered", () => agent.state === "running");
    return { agent, calls, gate, running: running.promise, ended, states: recordStates(agent) };
  }

  it("with onDaemonDrain 'exit', OpsService.DrainAgent: the agent stops claiming, finishes its item, reports it and deregisters", async () => {
    const { agent, calls, gate, running, ended, states } = await gatedAgent("ops-drained", { onDaemonDrain: "exit" });
    const [id] = await producer.enqueue([{ engineKind: "ops-drained" }]);
    await running;

    await ops().drainAgent({ name: agent.name, reason: "rolling deploy" }, opsCall);
    await until("the agent follows the directive", () => agent.state === "draining");
    const claimsAtDrain = calls.count("Claim");
    gate.resolve();
    await ended;

    expect(states).toEqual(["running", "draining", "drained", "stopped"]);
    expect(await producer.get(id!)).toMatchObject({ status: WorkItemStatus.COMPLETED, resultJson: JSON.stringify(`ran ${id}`) });
    expect(calls.count("Claim")).toBe(claimsAtDrain);
    expect(calls.calls.at(-1)?.method).toBe("Deregister");
    expect((await agentRow(db, agent.name))?.status).toBe("inactive");
  });

  it("by default the agent pauses once its work is done, stays registered and heartbeating, and an undrain makes it claim again", async () => {
    const { agent, calls, gate, running, states } = await gatedAgent("ops-paused");
    const [first] = await producer.enqueue([{ engineKind: "ops-paused" }]);
    await running;

    await ops().drainAgent({ name: agent.name, reason: "rolling deploy" }, opsCall);
    await until("the agent follows the directive", () => agent.state === "draining");
    gate.resolve();
    await until("the agent pauses once its item is reported", () => agent.state === "paused");
    expect(await producer.get(first!)).toMatchObject({ status: WorkItemStatus.COMPLETED });
    expect(calls.count("Deregister")).toBe(0);
    expect((await agentRow(db, agent.name))?.status).toBe("draining");
    // Work enqueued while it is paused waits for it (or another agent).
    const [second] = await producer.enqueue([{ engineKind: "ops-paused" }]);
    // Heartbeats come from their own thread: the daemon's record of them is what shows they go on.
    const seen = (await agentRow(db, agent.name))!.updatedon as Date;
    await until("it keeps heartbeating while paused", async () => ((await agentRow(db, agent.name))!.updatedon as Date) > seen);
    expect(await producer.get(second!)).toMatchObject({ status: WorkItemStatus.PENDING });

    await ops().undrainAgent({ name: agent.name }, opsCall);
    const done = await finished(agent, second!);
    expect(done.outcome.kind).toBe("completed");
    expect(agent.state).toBe("running");
    expect(states).toEqual(["running", "draining", "paused", "running"]);
    expect((await agentRow(db, agent.name))?.status).toBe("active");
  });

  it("an undrain while the drain is still finishing work resumes at once; the process's own drain from paused stops the agent", async () => {
    const { agent, calls, gate, running, ended, states } = await gatedAgent("ops-undrained");
    const [id] = await producer.enqueue([{ engineKind: "ops-undrained" }]);
    await running;
    await ops().drainAgent({ name: agent.name }, opsCall);
    await until("draining", () => agent.state === "draining");
    await ops().undrainAgent({ name: agent.name }, opsCall);
    await until("running again while its item still runs", () => agent.state === "running");
    expect(agent.inFlight).toBe(1);
    gate.resolve();
    await finished(agent, id!);
    // A new drain pauses it; then the process's own drain stops it from there.
    await ops().drainAgent({ name: agent.name }, opsCall);
    await until("paused", () => agent.state === "paused");
    await agent.drain();
    await ended;
    expect(states).toEqual(["running", "draining", "running", "draining", "paused", "drained", "stopped"]);
    expect(calls.calls.at(-1)?.method).toBe("Deregister");
    expect((await agentRow(db, agent.name))?.status).toBe("inactive");
  });
});
