/**
 * Claiming ahead (the `prefetch` option) against a real daemon: an agent with quick handlers claims
 * more than its free slots, never runs more handlers than it has slots, gives back what waits when a
 * drain begins, and drops a waiting item that is cancelled.
 */
import type { Interceptor } from "@connectrpc/connect";
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../../src/daemon.js";
import { useTestDaemon } from "../../test/support/kit.js";
import type { Agent, ItemOutcome } from "../src/index.js";
import { callLog, type CallLog, deferred, finished, Producer, testAgent, until, WorkItemStatus } from "./support.js";

const fx = useTestDaemon({ label: "sdkprefetch", config: { heartbeatInterval: 500, heartbeatFlush: 50, sweepInterval: 50 } });
let daemon: Daemon;
let producer: Producer;

beforeAll(() => {
  daemon = fx.daemon;
  producer = fx.closers.add(new Producer(daemon.address, "t1"));
});

/** Records how many items each claim reply brought. */
function replySizes(): { interceptor: Interceptor; sizes: number[] } {
  const sizes: number[] = [];
  return {
    interceptor: (next) => async (req) => {
      const res = await next(req);
      if (req.method.name === "Claim" && !res.stream) sizes.push((res.message as unknown as { items: unknown[] }).items.length);
      return res;
    },
    sizes,
  };
}

const maxItemsAsked = (calls: ReturnType<typeof callLog>) =>
  calls.calls.filter((c) => c.method === "Claim").map((c) => (c.message as { maxItems: number }).maxItems);
/** The most items asked for at once: by one claim, or as credits outstanding on the stream. */
const mostAsked = (calls: CallLog, stream: boolean) => (stream ? calls.maxOutstanding() : Math.max(...maxItemsAsked(calls)));
/** The most items one claim reply or one push brought. */
const mostBrought = (calls: CallLog, replies: number[]) =>
  Math.max(...replies, ...calls.stream.filter((e) => e.method === "Connect" && e.dir === "received").map((e) => (e.message.items as unknown[]).length));

describe.each([
  ["over the stream", true],
  ["by unary claims", false],
])("quick handlers (%s)", (_how, stream) => {
  it("claim beyond the free slots, yet never run more handlers at once than there are slots, and each item completes once", async () => {
    const calls = callLog();
    const replies = replySizes();
    let running = 0;
    let peak = 0;
    const ran = new Map<string, number>();
    const agent = testAgent(daemon.address, {
      engineKinds: ["quick"],
      slots: 4,
      prefetch: 12,
      stream,
      interceptors: [calls.interceptor, replies.interceptor],
      handlers: {
        quick: async (item) => {
          ran.set(item.id, (ran.get(item.id) ?? 0) + 1);
          peak = Math.max(peak, ++running);
          await new Promise((r) => setImmediate(r));
          running--;
          return null;
        },
      },
    });
    await agent.start();
    const ids = await producer.enqueue(Array.from({ length: 400 }, () => ({ engineKind: "quick" })));
    const items = await producer.waitDone(ids);
    expect(items.filter((i) => i.status !== WorkItemStatus.COMPLETED)).toEqual([]);
    expect([...ran.values()].every((n) => n === 1) && ran.size === 400).toBe(true);
    expect(peak).toBe(4);
    // Some claim asked beyond the 4 slots, none beyond the slots and the 12 ahead.
    expect(mostAsked(calls, stream)).toBeGreaterThan(4);
    expect(mostAsked(calls, stream)).toBeLessThanOrEqual(16);
    expect(mostBrought(calls, replies.sizes)).toBeGreaterThan(4);
  });

  it("with prefetch 0, claim no more than the free slots", async () => {
    const calls = callLog();
    const agent = testAgent(daemon.address, {
      engineKinds: ["unbuffered"],
      slots: 2,
      prefetch: 0,
      stream,
      interceptors: [calls.interceptor],
      handlers: { unbuffered: async () => null },
    });
    await agent.start();
    const ids = await producer.enqueue(Array.from({ length: 60 }, () => ({ engineKind: "unbuffered" })));
    await producer.waitDone(ids);
    expect(stream ? calls.stream.filter((e) => e.dir === "sent" && Number(e.message.credits ?? 0) > 0).length : calls.count("Claim")).toBeGreaterThan(0);
    expect(mostAsked(calls, stream)).toBeLessThanOrEqual(2);
  });
});

/**
 * An agent with one slot and four ahead: one item runs (its handler waits for `gate`), the other
 * four of the batch wait on the agent, dispatched to it.
 */
async function oneRunningFourWaiting(
  kind: string,
  stream: boolean,
): Promise<{ agent: Agent; running: string; waiting: string[]; started: string[]; outcomes: Map<string, ItemOutcome>; gate: () => void }> {
  const calls = callLog();
  const gate = deferred();
  const started: string[] = [];
  const outcomes = new Map<string, ItemOutcome>();
  let blocked = false;
  const agent = testAgent(daemon.address, {
    engineKinds: [kind],
    slots: 1,
    prefetch: 4,
    stream,
    interceptors: [calls.interceptor],
    handlers: {
      [kind]: async (item) => {
        started.push(item.id);
        if ((item.payload as { batch?: boolean } | null)?.batch && !blocked) {
          blocked = true;
          await gate.promise;
        }
        return null;
      },
    },
  });
  agent.on("itemFinished", (item, outcome) => outcomes.set(item.id, outcome));
  await agent.start();
  // Quick items first, so the agent has timed a handler and a claim answered at once.
  await producer.waitDone(await producer.enqueue([{ engineKind: kind }, { engineKind: kind }]));
  await until("the agent asks for the slot and four ahead", () => (stream ? calls.outstanding() === 5 : maxItemsAsked(calls).includes(5)));
  const ids = await producer.enqueue(Array.from({ length: 5 }, () => ({ engineKind: kind, payloadJson: JSON.stringify({ batch: true }) })));
  await until("the batch is dispatched to the agent", async () =>
    (await Promise.all(ids.map((id) => producer.get(id)))).every((i) => i.status === WorkItemStatus.DISPATCHED && i.agentId === agent.name),
  );
  const running = ids.filter((id) => started.includes(id));
  expect(running).toHaveLength(1);
  return { agent, running: running[0]!, waiting: ids.filter((id) => id !== running[0]), started, outcomes, gate: gate.resolve };
}

describe.each([
  ["over the stream", true],
  ["by unary claims", false],
])("items waiting for a slot (%s)", (_how, stream) => {
  it("are given back when a drain begins, without spending an attempt, while the running item finishes", async () => {
    const { agent, running, waiting, started, outcomes, gate } = await oneRunningFourWaiting(`drained-ahead-${stream}`, stream);
    const drained = agent.drain({ deadline: 10_000 });
    await until("the waiting items are back in the queue", async () =>
      (await Promise.all(waiting.map((id) => producer.get(id)))).every((i) => i.status === WorkItemStatus.PENDING),
    );
    for (const id of waiting) expect(await producer.get(id)).toMatchObject({ status: WorkItemStatus.PENDING, retryCount: 0, agentId: "" });
    expect(waiting.map((id) => outcomes.get(id))).toEqual(waiting.map(() => ({ kind: "released" })));
    // The running item was not touched: its handler still runs.
    expect(agent.inFlight).toBe(1);
    expect((await producer.get(running)).status).toBe(WorkItemStatus.DISPATCHED);
    gate();
    await drained;
    expect((await producer.get(running)).status).toBe(WorkItemStatus.COMPLETED);
    expect(started.filter((id) => waiting.includes(id))).toEqual([]);
  });

  it("is dropped when cancelled, without starting, and the others run in turn", async () => {
    const { agent, waiting, started, gate } = await oneRunningFourWaiting(`cancelled-ahead-${stream}`, stream);
    const [cancelled, ...rest] = waiting;
    const outcome = finished(agent, cancelled!);
    await producer.queue.cancel({ tenantKey: "t1", ids: [cancelled!], reason: "not needed" });
    expect((await outcome).outcome).toEqual({ kind: "cancelled", reason: "not needed" });
    gate();
    expect((await producer.waitDone(rest)).map((i) => i.status)).toEqual(rest.map(() => WorkItemStatus.COMPLETED));
    expect(started).not.toContain(cancelled);
    expect((await producer.get(cancelled!)).status).toBe(WorkItemStatus.CANCELLED);
  });
});
