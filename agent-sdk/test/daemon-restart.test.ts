/**
 * What an operator's restart of the only daemon (Ctrl-C, then start it again) costs an agent on its
 * default path, the agent stream, on both client transports: nothing but the wait.
 * - The graceful stop lets the agent's stream go at once instead of holding it for the grace
 *   period (here a minute: the test's own timeout is shorter).
 * - The restarted daemon, down for longer than the liveness window, does not judge the agent by
 *   the heartbeats it could not receive: the item in flight keeps its lease, its result is accepted,
 *   and it is neither redelivered nor retried.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { agentRow, captureLog } from "../../test/support/agents.js";
import type { TestDb } from "../../test/support/db.js";
import { useTestDb } from "../../test/support/kit.js";
import { deferred, finished, Producer, testAgent, until, WorkItemStatus } from "./support.js";

const fx = useTestDb("sdkrestart");
let db: TestDb;
beforeAll(() => {
  db = fx.db;
});

/** A liveness window of 3 × 300 ms; a grace period no stop should wait out. */
const HEARTBEAT_MS = 300;
const WINDOW_MS = 3 * HEARTBEAT_MS;

const start = (instanceId: string, log: ReturnType<typeof captureLog>["log"], port = 0) =>
  fx.startDaemon({
    log,
    config: {
      instanceId,
      listen: { host: "127.0.0.1", port },
      heartbeatInterval: HEARTBEAT_MS,
      livenessIntervals: 3,
      heartbeatFlush: 50,
      sweepInterval: 50,
      leaseTtl: 60_000,
      shutdownGrace: 60_000,
    },
  });

describe.each([false, true])("restart of the only daemon, agent stream, fastTransport %s", (fastTransport) => {
  it("the stop does not hold the stream; after a downtime past the liveness window the item in flight completes, not redelivered", async () => {
    const captured = captureLog("info");
    const first = await start(`restart-a-${fastTransport}`, captured.log);
    const producer = new Producer(first.address, "t1");
    const running = deferred();
    const gate = deferred();
    const kind = `restart-${fastTransport}`;
    const agent = testAgent(first.address, {
      engineKinds: [kind],
      fastTransport,
      handlers: {
        [kind]: async (_item, ctx) => {
          running.resolve();
          await gate.promise;
          return { aborted: ctx.signal.aborted };
        },
      },
    });
    await agent.start();
    const [id] = await producer.enqueue([{ engineKind: kind }]);
    const outcome = finished(agent, id!, 30_000);
    await running.promise;
    producer.close();

    await first.stop();
    expect(captured.lines().filter((l) => String(l.msg).startsWith("grace period over"))).toEqual([]);

    // Down for longer than the liveness window: the agent's last written beat is older than it.
    await until("the agent's last heartbeat is older than the liveness window", async () => {
      const row = await agentRow(db, agent.name);
      return row?.updatedon !== null && row?.updatedon !== undefined && Date.now() - row.updatedon.getTime() > WINDOW_MS * 2;
    });
    const second = await start(`restart-b-${fastTransport}`, captured.log, first.port);
    gate.resolve();
    expect((await outcome).outcome.kind).toBe("completed");
    const producer2 = new Producer(second.address, "t1");
    const [done] = await producer2.waitDone([id!]);
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, retryCount: 0, redeliveryCount: 0 });
    expect(JSON.parse(done!.resultJson)).toEqual({ aborted: false });
    expect(captured.lines().filter((l) => l.msg === "agents missed their heartbeats: marked inactive")).toEqual([]);
    producer2.close();
    await agent.stop();
    await second.stop();
  });
});
