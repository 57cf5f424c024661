/**
 * What the SDK tests share besides the kit (../../test/support/kit.ts, whose `until` is re-exported
 * here): a producer (QueueService over a connection of its own, engine token), agents built with
 * test-friendly timings that are stopped after each test, an interceptor that logs the agent's calls
 * and how each ended, a logger that keeps its lines, and waits on the agent's events.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { ConnectError, type Client, type Code, type Interceptor } from "@connectrpc/connect";
import { pino, type Logger } from "pino";
import { afterEach } from "vitest";
import { TOKENS } from "../../test/support/daemon.js";
import { Connection } from "../../test/support/kit.js";
import { createAgent, type Agent, type AgentOptions, type ItemOutcome, type WorkItem } from "../src/index.js";
import { QueueService, type EnqueueItemSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { WorkItemStatus, type WorkItem as WireItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";

export { WorkItemStatus, type WireItem };
export { until } from "../../test/support/kit.js";

/** A producer: QueueService with the engine token, on a connection of its own. */
export class Producer {
  readonly #conn: Connection;
  readonly queue: Client<typeof QueueService>;

  constructor(
    address: string,
    readonly tenant: string,
  ) {
    this.#conn = new Connection(address, { token: TOKENS.engine });
    this.queue = this.#conn.client(QueueService);
  }

  async enqueue(items: MessageInitShape<typeof EnqueueItemSchema>[]): Promise<string[]> {
    const res = await this.queue.enqueue({ tenantKey: this.tenant, items });
    return res.results.map((r) => r.id);
  }

  async get(id: string): Promise<WireItem> {
    const res = await this.queue.getItem({ tenantKey: this.tenant, id });
    return res.item!;
  }

  /** Waits (QueueService.Wait long-polls) until every item is finished; fails after `timeoutMs`. */
  async waitDone(ids: string[], timeoutMs = 15_000): Promise<WireItem[]> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const remaining = deadline - Date.now();
      const res = await this.queue.wait({ tenantKey: this.tenant, ids, timeout: durationFromMs(Math.max(1, Math.min(remaining, 5_000))) });
      if (res.done) return res.items;
      if (Date.now() >= deadline) throw new Error(`items not finished within ${timeoutMs}ms: ${res.items.map((i) => `${i.id}=${WorkItemStatus[i.status]}`).join(", ")}`);
    }
  }

  close(): void {
    this.#conn.close();
  }
}

/** One call the agent made: its method, its request (unary calls), and how it ended once it has. */
export interface LoggedCall {
  method: string;
  message: unknown;
  /** "ok", or the code it failed with; undefined while the call is out. */
  ended?: "ok" | Code;
}

/** Logs the agent's calls by method name (Claim, Complete, Fail, ...), with the request of each and how it ended. */
export function callLog(): { interceptor: Interceptor; calls: LoggedCall[]; count(method: string): number; out(method: string): number } {
  const calls: LoggedCall[] = [];
  return {
    interceptor: (next) => async (req) => {
      const call: LoggedCall = { method: req.method.name, message: req.stream ? undefined : req.message };
      calls.push(call);
      try {
        const res = await next(req);
        call.ended = "ok";
        return res;
      } catch (err) {
        call.ended = ConnectError.from(err).code;
        throw err;
      }
    },
    calls,
    count: (method) => calls.filter((c) => c.method === method).length,
    /** Calls of `method` still out (a stream counts as ended once its response began). */
    out: (method) => calls.filter((c) => c.method === method && c.ended === undefined).length,
  };
}

/** The agents' logger: silent unless TEST_LOG_LEVEL asks for lines (on stderr), to look at when a test fails. */
export function testLogger(): Logger {
  const level = process.env.TEST_LOG_LEVEL ?? "silent";
  return pino({ level }, pino.destination(2));
}

const started: Agent[] = [];
afterEach(async () => {
  await Promise.all(started.splice(0).map((a) => a.stop()));
});

let seq = 0;
/** A unique agent name for this test file. */
export const agentName = (label: string) => `${label}-${process.pid}-${++seq}`;

/** An agent against `address` with short timings; stopped after the test. */
export function testAgent(address: string | string[], options: Partial<AgentOptions> & Pick<AgentOptions, "handlers">): Agent {
  const agent = createAgent({
    ...(Array.isArray(address) ? { addresses: address } : { address }),
    token: TOKENS.agent,
    name: agentName("sdk"),
    tenants: ["t1"],
    logger: testLogger(),
    claimWaitMs: 2_000,
    rpcTimeoutMs: 3_000,
    gracefulShutdownMs: 2_000,
    reconnect: { initialDelayMs: 20, maxDelayMs: 200 },
    mounts: ["/"],
    ...options,
  });
  started.push(agent);
  return agent;
}

/** Resolves with the outcome when the item with `id` finishes on `agent`. */
export function finished(agent: Agent, id: string | ((item: WorkItem) => boolean), timeoutMs = 15_000): Promise<{ item: WorkItem; outcome: ItemOutcome }> {
  const match = typeof id === "string" ? (item: WorkItem) => item.id === id : id;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      agent.off("itemFinished", on);
      reject(new Error(`no item finished on ${agent.name} within ${timeoutMs}ms`));
    }, timeoutMs);
    const on = (item: WorkItem, outcome: ItemOutcome) => {
      if (!match(item)) return;
      clearTimeout(timer);
      agent.off("itemFinished", on);
      resolve({ item, outcome });
    };
    agent.on("itemFinished", on);
  });
}

/** A promise with its resolve function outside, for handlers that wait on the test. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (v: T) => void } {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}
