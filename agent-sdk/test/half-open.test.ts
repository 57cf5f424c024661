/**
 * A half-open path between an agent and its daemon: the connection stays open but carries nothing
 * (a dropped flow, a hung host; here a proxy that stops forwarding without closing). The agent's
 * HTTP/2 pings go unanswered, it takes the connection for dead within its keepalive timeout,
 * connects again (new connections pass) and registers again, and work it is given afterwards runs.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { captureLog } from "../../test/support/agents.js";
import { useTestDaemon } from "../../test/support/kit.js";
import { startTcpProxy, type TcpProxy } from "../../test/support/tcp-proxy.js";
import { finished, Producer, testAgent, until, WorkItemStatus } from "./support.js";

const fx = useTestDaemon({ label: "sdkhalfopen", config: { heartbeatInterval: 500, heartbeatFlush: 50, sweepInterval: 50 } });
let proxy: TcpProxy;

beforeAll(async () => {
  proxy = await startTcpProxy(`http://${fx.address}`);
  fx.closers.defer(() => proxy.close());
});

describe("a half-open path to the daemon", () => {
  it("is found by the agent's pings, and the agent reconnects, registers again and works", async () => {
    const captured = captureLog("debug");
    const producer = fx.closers.add(new Producer(fx.address, "t1"));
    const via = new URL(proxy.url);
    const agent = testAgent(`${via.hostname}:${via.port}`, {
      engineKinds: ["halfopen"],
      logger: captured.log,
      keepalive: { intervalMs: 100, timeoutMs: 300 },
      handlers: { halfopen: async () => ({ ok: true }) },
    });
    await agent.start();
    const before = proxy.opened;

    proxy.freeze();
    await until("the agent registered again", () => captured.lines().some((l) => l.msg === "registered again"), 20_000);
    expect(proxy.opened).toBeGreaterThan(before);

    const [id] = await producer.enqueue([{ engineKind: "halfopen", payloadJson: "{}" }]);
    expect((await finished(agent, id!)).outcome.kind).toBe("completed");
    expect((await producer.get(id!)).status).toBe(WorkItemStatus.COMPLETED);
  });
});
