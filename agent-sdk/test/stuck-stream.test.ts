/**
 * Shutdown always finishes, against a daemon whose agent stream stops answering (fake-daemon.ts):
 * it never answers the credit withdrawal, a report or the goodbye, and never ends the stream.
 * Every wait of the shutdown and of the daemon's drain gives up after rpcTimeoutMs and says so at
 * warn; what the agent holds then goes the way it goes when a stream breaks: a running item runs
 * on and is reported by a unary call. Before these bounds, stop() and drain() waited forever for
 * the withdrawal's answer, and so did a daemon's drain before pausing.
 *
 * The waits here are on events (a log line, a call the fake received, a state); the tests' own
 * timeout is what fails them when the agent hangs.
 */
import { pino, type Logger } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { AgentState, ItemOutcome } from "../src/index.js";
import { FakeDaemon, type Sent } from "./fake-daemon.js";
import { deferred, finished, testAgent } from "./support.js";

const RPC_TIMEOUT_MS = 1_000;
/** Generous: a hang is what fails these, not a slow machine. */
const TEST_TIMEOUT_MS = 30_000;

interface Line {
  level: number;
  msg: string;
}

/** A logger that keeps its lines, and waits for one. */
function keptLogger(): { logger: Logger; lines: Line[]; line(match: RegExp): Promise<Line> } {
  const lines: Line[] = [];
  const waiters = new Set<{ match: RegExp; resolve: (l: Line) => void }>();
  const logger = pino(
    { level: "debug" },
    {
      write(s: string) {
        const l = JSON.parse(s) as Line;
        lines.push(l);
        for (const w of waiters)
          if (w.match.test(l.msg)) {
            waiters.delete(w);
            w.resolve(l);
          }
      },
    },
  );
  return {
    logger,
    lines,
    line: (match) => {
      const seen = lines.find((l) => match.test(l.msg));
      return seen ? Promise.resolve(seen) : new Promise((resolve) => waiters.add({ match, resolve }));
    },
  };
}

const WARN = 40;
const WITHDRAWAL = /did not answer the credit withdrawal within 1000 ms/;
const GOODBYE = /did not end the agent stream within 1000 ms of the goodbye/;
const connectSent = (stream: number, pass: (m: Extract<Sent, { stream: number }>["message"]) => boolean) => (s: Sent) =>
  s.method === "Connect" && "stream" in s && s.stream === stream && pass(s.message);

let fake: FakeDaemon;
beforeEach(async () => {
  fake = await new FakeDaemon().start();
});
afterEach(async () => {
  await fake.close();
});

describe.each([true, false])("a daemon whose agent stream stops answering (fastTransport: %s)", (fastTransport) => {
  const agentOn = (logger: Logger, extra: Parameters<typeof testAgent>[1]) =>
    testAgent(fake.address, { logger, fastTransport, rpcTimeoutMs: RPC_TIMEOUT_MS, capacity: false, ...extra });

  it(
    "stop() finishes: the withdrawal is given up on after rpcTimeoutMs, with a warning, and the agent deregisters",
    async () => {
      const log = keptLogger();
      const agent = agentOn(log.logger, { engineKinds: ["k"], handlers: { k: async () => null } });
      await agent.start();
      await fake.on(connectSent(1, (m) => m.credits > 0));
      await agent.stop();
      expect(agent.state).toBe("stopped");
      // The warning is about what happened: a withdrawal the fake received and never answered.
      await fake.on(connectSent(1, (m) => m.withdrawCredits));
      expect(log.lines.filter((l) => WITHDRAWAL.test(l.msg)).map((l) => l.level)).toEqual([WARN]);
      expect(fake.sent.some((s) => s.method === "Deregister")).toBe(true);
    },
    TEST_TIMEOUT_MS,
  );

  it(
    "stop() finishes when only the goodbye goes unanswered: the stream is closed after rpcTimeoutMs, with a warning",
    async () => {
      const log = keptLogger();
      fake.stream = () => "withdraws";
      const agent = agentOn(log.logger, { engineKinds: ["k"], handlers: { k: async () => null } });
      await agent.start();
      await fake.on(connectSent(1, (m) => m.credits > 0));
      await agent.stop();
      expect(agent.state).toBe("stopped");
      await fake.on(connectSent(1, (m) => m.goodbye));
      expect(log.lines.filter((l) => WITHDRAWAL.test(l.msg))).toEqual([]);
      expect(log.lines.filter((l) => GOODBYE.test(l.msg)).map((l) => l.level)).toEqual([WARN]);
      expect(fake.sent.some((s) => s.method === "Deregister")).toBe(true);
    },
    TEST_TIMEOUT_MS,
  );

  it(
    "drain(): an item running when the withdrawal is given up on runs on and is reported by a unary Complete",
    async () => {
      const log = keptLogger();
      fake.items = [{ id: "w1", leaseToken: "lease-1", engineKind: "k", tenantKey: "t1", payloadJson: "{}" }];
      // The stuck stream is given up on; the next ones are refused, so the report cannot take a stream.
      fake.stream = (n) => (n === 1 ? "stuck" : "unavailable");
      const gate = deferred();
      const agent = agentOn(log.logger, { engineKinds: ["k"], gracefulShutdownMs: 60_000, handlers: { k: () => gate.promise.then(() => ({ done: true })) } });
      const started = new Promise((resolve) => agent.once("itemStarted", resolve));
      const outcome = finished(agent, "w1", TEST_TIMEOUT_MS);
      await agent.start();
      await started;
      const drained = agent.drain();
      // Finishes only once the agent gave up on the withdrawal: its report then cannot take the stream.
      await log.line(WITHDRAWAL);
      gate.resolve();
      expect((await outcome).outcome).toEqual<ItemOutcome>({ kind: "completed" });
      await drained;
      expect(agent.state).toBe("stopped");
      const completes = fake.sent.filter((s) => s.method === "Complete").map((s) => s.message);
      expect(completes).toEqual([
        expect.objectContaining({ items: [expect.objectContaining({ workItemId: "w1", leaseToken: "lease-1", resultJson: '{"done":true}' })] }),
      ]);
    },
    TEST_TIMEOUT_MS,
  );

  it(
    "the daemon's drain pauses the agent with a report unanswered, and the report still goes through afterwards",
    async () => {
      const log = keptLogger();
      fake.items = [{ id: "w2", leaseToken: "lease-2", engineKind: "k", tenantKey: "t1", payloadJson: "{}" }];
      fake.stream = (n) => (n === 1 ? "stuck" : "unavailable");
      const gate = deferred();
      fake.completeGate = gate.promise;
      const agent = agentOn(log.logger, { engineKinds: ["k"], handlers: { k: async () => ({ done: true }) } });
      const outcome = finished(agent, "w2", TEST_TIMEOUT_MS);
      const paused = new Promise<void>((resolve) => agent.on("state", (s) => s === "paused" && resolve()));
      await agent.start();
      await fake.on(connectSent(1, (m) => m.completions.length > 0));
      fake.status = AgentStatus.DRAINING;
      fake.push(1, { directives: [{ kind: { case: "status", value: { status: AgentStatus.DRAINING, reason: "test" } } }] });
      // The report cannot be answered in time: the agent pauses with it still on its way.
      await paused;
      expect(log.lines.filter((l) => /pausing for the daemon's drain with reports unanswered/.test(l.msg)).map((l) => l.level)).toEqual([WARN]);
      gate.resolve();
      expect((await outcome).outcome).toEqual<ItemOutcome>({ kind: "completed" });
      await agent.stop();
    },
    TEST_TIMEOUT_MS,
  );

  it(
    "the daemon's drain pauses the agent although the withdrawal is never answered, and stop() still finishes from there",
    async () => {
      const log = keptLogger();
      const agent = agentOn(log.logger, { engineKinds: ["k"], handlers: { k: async () => null } });
      await agent.start();
      await fake.on(connectSent(1, (m) => m.credits > 0));
      const states: AgentState[] = [];
      const paused = new Promise<void>((resolve) =>
        agent.on("state", (s) => {
          states.push(s);
          if (s === "paused") resolve();
        }),
      );
      // The daemon drains the agent (and says so from now on: registrations and heartbeats too).
      fake.status = AgentStatus.DRAINING;
      fake.push(1, { directives: [{ kind: { case: "status", value: { status: AgentStatus.DRAINING, reason: "test" } } }] });
      await paused;
      expect(states).toEqual(["draining", "paused"]);
      expect(log.lines.filter((l) => WITHDRAWAL.test(l.msg)).map((l) => l.level)).toEqual([WARN]);
      await agent.stop();
      expect(agent.state).toBe("stopped");
    },
    TEST_TIMEOUT_MS,
  );
});
