/**
 * While Postgres is away (restarting, starting up, or its connections cut), every call that needs it
 * answers UNAVAILABLE — the retryable code — with a sentence, never INTERNAL; the daemon logs it as
 * one warning line without a stack, and serves again once the database is back. The daemon reaches
 * Postgres through a loopback proxy that can cut its connections and fail new ones as a server that
 * is down ("Connection terminated unexpectedly") or starting up (FATAL 57P03) fails them. Its
 * sweeps run every 50 ms, so the calls compete with them for the two connections of its pool.
 */
import { Code } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AgentService } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import type { Daemon } from "../src/daemon.js";
import { captureLog } from "./support/agents.js";
import { TOKENS } from "./support/daemon.js";
import { codeOf, refusal, until, useTestDb } from "./support/kit.js";
import { startTcpProxy, type TcpProxy } from "./support/tcp-proxy.js";

const f = useTestDb("dboutage");
const captured = captureLog("info");
let proxy: TcpProxy;
let daemon: Daemon;

beforeAll(async () => {
  proxy = await startTcpProxy(f.db.url);
  f.closers.defer(() => proxy.close());
  daemon = await f.startDaemon({
    log: captured.log,
    config: { databaseUrl: proxy.url, dbPoolSize: 2, heartbeatInterval: 60_000, sweepInterval: 50, heartbeatFlush: 50 },
  });
});

const queue = () => f.clientAt(daemon.address, QueueService, TOKENS.engine);
const ops = () => f.clientAt(daemon.address, OpsService, TOKENS.ops);
const agents = () => f.clientAt(daemon.address, AgentService, TOKENS.agent);

/** One call of each kind: a group-committed insert, the prepared-statement pool's claim, a read through slonik. */
const calls = {
  enqueue: () => queue().enqueue({ tenantKey: "t1", items: [{ engineKind: "k", payloadJson: "{}" }] }),
  claim: () => agents().claim({ name: "outage-agent", maxItems: 1 }),
  listAgents: () => ops().listAgents({}),
};

const unexpected = () => captured.lines().filter((l) => (l.level as number) >= 50);

describe("the database away", () => {
  beforeAll(async () => {
    await agents().register({ name: "outage-agent", metadata: { tenants: ["t1"], engineKinds: ["k"], slots: 1 } });
    for (const [name, call] of Object.entries(calls)) expect({ name, code: await codeOf(call()) }).toEqual({ name, code: "ok" });
  });
  afterAll(() => proxy.refuse(null));

  for (const how of ["close", "starting-up"] as const) {
    it(`answers UNAVAILABLE with a sentence, never INTERNAL, when new connections ${how === "close" ? "are closed at once" : "meet a server starting up (57P03)"} and the open ones are cut`, async () => {
      proxy.refuse(how);
      proxy.cut();
      for (const [name, call] of Object.entries(calls)) {
        const err = await refusal(call());
        expect({ name, code: err.code }).toEqual({ name, code: Code.Unavailable });
        expect(err.rawMessage).toMatch(/database/);
      }
      expect(unexpected()).toEqual([]);
      const warns = captured.lines().filter((l) => l.level === 40 && String(l.msg).includes("database unavailable"));
      expect(warns.length).toBeGreaterThan(0);
      // One line, no stack: the cause is a short sentence.
      for (const w of warns) expect(JSON.stringify(w)).not.toMatch(/\\n\s+at /);

      proxy.refuse(null);
      await until("the daemon serves again", async () => (await codeOf(calls.enqueue())) === "ok");
      for (const call of Object.values(calls)) expect(await codeOf(call())).toBe("ok");
    });
  }
});
