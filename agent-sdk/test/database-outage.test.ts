/**
 * A daemon that answers while its database is away is not a daemon that cannot be reached. The
 * daemon answers UNAVAILABLE with gRPC's retry pushback (`grpc-retry-pushback-ms`); the agent then
 * retries on that short schedule instead of its growing reconnect backoff, says in its log what is
 * true (a daemon is reachable, its database is not), and is back at work once the database is.
 * The daemon reaches Postgres through a proxy that cuts its connections and closes new ones.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { beforeAll, describe, expect, it } from "vitest";
import { AgentService } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { captureLog } from "../../test/support/agents.js";
import { TOKENS } from "../../test/support/daemon.js";
import { refusal, useTestDb } from "../../test/support/kit.js";
import { startTcpProxy, type TcpProxy } from "../../test/support/tcp-proxy.js";
import type { Daemon } from "../../src/daemon.js";
import { RETRY_PUSHBACK_MS } from "../../src/server/errors.js";
import { pushbackMs, retryDelay } from "../src/backoff.js";
import { finished, Producer, testAgent, until, WorkItemStatus } from "./support.js";

const fx = useTestDb("sdkdbout");
let proxy: TcpProxy;
let daemon: Daemon;

beforeAll(async () => {
  proxy = await startTcpProxy(fx.db.url);
  fx.closers.defer(() => proxy.close());
  daemon = await fx.startDaemon({ config: { databaseUrl: proxy.url, dbPoolSize: 2, heartbeatInterval: 500, heartbeatFlush: 50, sweepInterval: 50 } });
});

/** A reconnect backoff whose first delay (at least half of 5 s) no pushback-paced retry comes near. */
const SLOW_BACKOFF = { initialDelayMs: 5_000, maxDelayMs: 30_000 };

describe("the daemon's database away", () => {
  it("the daemon's UNAVAILABLE carries a retry pushback, which the SDK follows instead of its backoff", async () => {
    proxy.refuse("close");
    proxy.cut();
    try {
      const err = await refusal(
        fx.clientAt(daemon.address, AgentService, TOKENS.agent).register({ name: "pushback-probe", metadata: { tenants: ["t1"], slots: 1 } }),
      );
      expect(err.code).toBe(Code.Unavailable);
      expect(pushbackMs(err)).toBe(RETRY_PUSHBACK_MS);
      for (const attempt of [0, 5, 30]) {
        const delay = retryDelay(err, attempt, SLOW_BACKOFF);
        expect(delay).toBeGreaterThanOrEqual(RETRY_PUSHBACK_MS);
        expect(delay).toBeLessThanOrEqual(RETRY_PUSHBACK_MS * 1.25);
      }
      // A call that never reached a daemon has no pushback: the backoff applies.
      const unreachable = new ConnectError("connect ECONNREFUSED", Code.Unavailable);
      expect(pushbackMs(unreachable)).toBeUndefined();
      expect(retryDelay(unreachable, 0, SLOW_BACKOFF)).toBeGreaterThanOrEqual(2_500);
    } finally {
      proxy.refuse(null);
    }
  });

  it("an agent re-registering through the outage retries on the pushback, logs that a daemon is reachable, and works again after it", async () => {
    const captured = captureLog("debug");
    const producer = new Producer(daemon.address, "t1");
    fx.closers.add(producer);
    const agent = testAgent(daemon.address, {
      engineKinds: ["after"],
      logger: captured.log,
      reconnect: SLOW_BACKOFF,
      handlers: { after: async () => ({ ok: true }) },
    });
    await agent.start();

    proxy.refuse("close");
    proxy.cut();
    const retries = () =>
      captured.lines().filter((l) => typeof l.msg === "string" && l.msg.startsWith("a daemon is reachable but cannot register this agent now"));
    // The agent's calls fail, it sets out to register again, and the daemon answers each try.
    await until("the agent retried registering at least three times on the pushback", () => retries().length >= 3, 20_000);
    proxy.refuse(null);
    await until("the agent is registered again", () => captured.lines().some((l) => l.msg === "registered again"), 20_000);

    for (const r of retries()) expect(r.retryInMs as number).toBeLessThanOrEqual(RETRY_PUSHBACK_MS * 1.25);
    expect(captured.lines().filter((l) => l.msg === "no daemon reachable: retrying")).toEqual([]);

    const [id] = await producer.enqueue([{ engineKind: "after", payloadJson: "{}" }]);
    const done = finished(agent, id!);
    expect((await done).outcome.kind).toBe("completed");
    expect((await producer.get(id!)).status).toBe(WorkItemStatus.COMPLETED);
  });
});
