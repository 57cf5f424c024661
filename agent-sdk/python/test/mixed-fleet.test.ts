/**
 * A mixed fleet: TypeScript agents (the SDK) and Python agents (this library) on one queue, served
 * by two daemons of one database, drain a batch. Every item is completed exactly once: one start
 * per item across both languages, none retried or redelivered.
 */
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../../../src/daemon.js";
import { useTestCluster } from "../../../test/support/kit.js";
import { Producer, testAgent, until, WorkItemStatus } from "../../test/support.js";
import { PythonAgent } from "./python-agent.js";

const fx = useTestCluster("pymixed", { instances: ["mixed-a", "mixed-b"], config: { heartbeatInterval: 500, heartbeatFlush: 50, sweepInterval: 50 } });
let a: Daemon;
let b: Daemon;
beforeAll(() => {
  [a, b] = fx.daemons;
});

const N = 400;

describe("a fleet of TypeScript and Python agents", () => {
  it(`drains ${N} items on one queue, each completed exactly once, by agents of both languages`, async () => {
    const pys = [0, 1].map((i) => PythonAgent.start(i === 0 ? a.address : b.address, { name: `py-mixed-${i}`, slots: 4, engine_kinds: ["mixed"] }));
    await Promise.all(pys.map((p) => p.state("running")));
    const pyStarted = () => pys.reduce((n, p) => n + p.count("started"), 0);
    const tsStarts: string[] = [];
    const tss = [0, 1].map((i) =>
      testAgent(i === 0 ? b.address : a.address, {
        name: `ts-mixed-${i}`,
        slots: 4,
        engineKinds: ["mixed"],
        handlers: {
          mixed: async (item, ctx) => {
            tsStarts.push(item.id);
            // Both languages take part: the TypeScript agents wait until the Python ones have items.
            await until("the Python agents took work", () => pyStarted() > 0 || ctx.signal.aborted);
            return { by: ctx.agent, echo: item.payload };
          },
        },
      }),
    );
    await Promise.all(tss.map((t) => t.start()));

    const producer = new Producer(a.address, "t1");
    const ids: string[] = [];
    for (let i = 0; i < N; i += 100)
      ids.push(...(await producer.enqueue(Array.from({ length: 100 }, (_, j) => ({ engineKind: "mixed", payloadJson: JSON.stringify({ n: i + j }) })))));
    const done = await producer.waitDone(ids, 60_000);
    producer.close();

    expect(done.every((d) => d.status === WorkItemStatus.COMPLETED && d.retryCount === 0 && d.redeliveryCount === 0)).toBe(true);
    for (const d of done) expect(JSON.parse(d.resultJson)).toMatchObject({ by: d.agentId, echo: { n: ids.indexOf(d.id) } });
    const pyStarts = pys.flatMap((p) => p.events.filter((e) => e.event === "started").map((e) => e.id as string));
    const starts = [...tsStarts, ...pyStarts];
    expect(starts.length).toBe(N);
    expect(new Set(starts).size).toBe(N);
    expect(pyStarts.length).toBeGreaterThan(0);
    expect(tsStarts.length).toBeGreaterThan(0);
    const holders = new Set(done.map((d) => d.agentId));
    expect([...holders].every((n) => /^(py|ts)-mixed-[01]$/.test(n))).toBe(true);
  });
});
