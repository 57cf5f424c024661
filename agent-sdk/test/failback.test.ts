/**
 * Failback: an agent given several addresses starts on its home daemon (its name hashed over them),
 * fails over when that one goes, and goes back once it answers again, so a restarted daemon gets
 * its share of the fleet back instead of idling. On the stream it moves only at a moment it holds
 * nothing: an item in flight then is neither released nor run twice.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { useTestDb } from "../../test/support/kit.js";
import type { TestDb } from "../../test/support/db.js";
import { homeIndex } from "../src/link.js";
import { deferred, homedName, Producer, testAgent, until, WorkItemStatus } from "./support.js";

const fx = useTestDb("sdkfailback");
let db: TestDb;
beforeAll(() => {
  db = fx.db;
});

const start = (instanceId: string, port = 0) =>
  fx.startDaemon({ config: { instanceId, listen: { host: "127.0.0.1", port }, heartbeatInterval: 2_000, heartbeatFlush: 50, sweepInterval: 50 } });

/** Open agent streams on a daemon now (aiflow_agent_streams). */
const streams = async (d: Awaited<ReturnType<typeof start>>) =>
  Number((await d.metrics.registry.getSingleMetric("aiflow_agent_streams")?.get())?.values[0]?.value ?? 0);

describe("home daemon and failback", () => {
  it("names spread over the addresses by their hash", () => {
    const counts = [0, 0, 0];
    for (let i = 0; i < 3_000; i++) counts[homeIndex(`worker-${i}`, 3)]!++;
    for (const c of counts) expect(c).toBeGreaterThan(900);
  });

  it.each([true, false])("goes back to its home daemon once it is back, without disturbing an item in flight (stream %s)", async (stream) => {
    const home = await start(`failback-home-${stream}`);
    const other = await start(`failback-other-${stream}`);
    const producer = new Producer(other.address, "t1");
    const kind = `failback-${stream}`;
    const running = deferred();
    const gate = deferred();
    let heldRuns = 0;
    const agent = testAgent([home.address, other.address], {
      name: homedName("sdk", 0, 2),
      stream,
      failbackMs: 100,
      engineKinds: [kind],
      handlers: {
        [kind]: async (item) => {
          if ((item.payload as { hold?: boolean } | null)?.hold) {
            heldRuns++;
            running.resolve();
            await gate.promise;
          }
          return "done";
        },
      },
    });
    await agent.start();
    expect(agent.registration?.address).toBe(home.address);

    await home.stop();
    await until("the agent failed over", () => agent.registration?.address === other.address);
    // An item in flight on the other daemon while the home one comes back.
    const [held] = await producer.enqueue([{ engineKind: kind, payloadJson: JSON.stringify({ hold: true }) }]);
    await running.promise;
    const back = await start(`failback-home2-${stream}`, home.port);
    gate.resolve();
    await until("the agent went back home", () => agent.registration?.address === back.address, 15_000);
    const [done] = await producer.waitDone([held!]);
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, redeliveryCount: 0, retryCount: 0, resultJson: JSON.stringify("done") });
    // The move left the item in flight alone: it ran once (a goodbye while it was held would have released it to run again).
    expect(heldRuns).toBe(1);
    if (stream) {
      await until("its stream is on the home daemon", async () => (await streams(back)) === 1 && (await streams(other)) === 0);
    }
    // And it works there.
    const [next] = await producer.enqueue([{ engineKind: kind }]);
    expect((await producer.waitDone([next!]))[0]?.status).toBe(WorkItemStatus.COMPLETED);
    expect(await db.raw(`SELECT count(*)::int AS n FROM "${db.schema}".aiflow_work_item WHERE engine_kind = $1 AND redelivery_count > 0`, [kind])).toEqual([
      { n: 0 },
    ]);
    producer.close();
  });
});
