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
import { homeIndex } from "../src/link.js";

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
      if (Date.now() >= deadline)
        throw new Error(`items not finished within ${timeoutMs}ms: ${res.items.map((i) => `${i.id}=${WorkItemStatus[i.status]}`).join(", ")}`);
    }
  }

  close(): void {
    this.#conn.close();
  }
}

/** One call the agent made: its method, its request (unary calls), and how it ended once it has. */
export interface LoggedCall {
  method: string;
  /** Place in the log's one order of calls begun and stream messages. */
  seq: number;
  message: unknown;
  /** "ok", or the code it failed with; undefined while the call is out. */
  ended?: "ok" | Code;
}

/** A message on a streaming call, in the order sent and received across every stream of the log. */
export interface StreamEvent {
  method: string;
  seq: number;
  dir: "sent" | "received";
  message: Record<string, unknown>;
}

type Listed = Record<string, unknown[] | undefined>;

export interface CallLog {
  interceptor: Interceptor;
  calls: LoggedCall[];
  /** Every message of every streaming call (Connect, WatchDirectives), in order. */
  stream: StreamEvent[];
  count(method: string): number;
  /** Calls of `method` still out (a stream counts as ended once its response began). */
  out(method: string): number;
  /** The entries of `field` in every Connect message the agent sent (completions, failures, releases, ...). */
  streamed(field: string): unknown[];
  /** Stream messages the agent sent that carry entries in `field`. */
  streamMessages(field: string): StreamEvent[];
  /** The most credits the agent had granted on one Connect call and not seen used by a push. */
  maxOutstanding(): number;
  /** Credits granted on the current Connect call less the items pushed since. */
  outstanding(): number;
  /** The seq of the last Connect message the agent sent that passes `pass` (-1 when none). */
  lastSent(pass: (m: Record<string, unknown>) => boolean): number;
  /** The seq of the first call of `method` (-1 when none). */
  firstCall(method: string): number;
}

/** Logs the agent's calls by method name (Claim, Complete, Connect, ...), with the request of each, how it ended, and stream messages both ways. */
export function callLog(): CallLog {
  const calls: LoggedCall[] = [];
  const stream: StreamEvent[] = [];
  let seq = 0;
  async function* tap<T>(messages: AsyncIterable<T>, method: string, dir: StreamEvent["dir"]): AsyncIterable<T> {
    for await (const m of messages) {
      stream.push({ method, seq: seq++, dir, message: m as Record<string, unknown> });
      yield m;
    }
  }
  const connects = () => stream.filter((e) => e.method === "Connect");
  const balance = () => {
    let now = 0;
    let max = 0;
    for (const e of connects()) {
      // A new call's first message names the agent: nothing is outstanding on it yet.
      if (e.dir === "sent" && e.message.name) now = 0;
      now += e.dir === "sent" ? Number(e.message.credits ?? 0) : -(e.message.items as unknown[]).length;
      if (e.dir === "sent" && e.message.withdrawCredits) now = Number(e.message.credits ?? 0);
      max = Math.max(max, now);
    }
    return { now, max };
  };
  return {
    interceptor: (next) => async (req) => {
      const method = req.method.name;
      const call: LoggedCall = { method, seq: seq++, message: req.stream ? undefined : req.message };
      calls.push(call);
      try {
        if (!req.stream) {
          const res = await next(req);
          call.ended = "ok";
          return res;
        }
        const res = await next({ ...req, message: tap(req.message, method, "sent") });
        call.ended = "ok";
        return res.stream ? { ...res, message: tap(res.message, method, "received") } : res;
      } catch (err) {
        call.ended = ConnectError.from(err).code;
        throw err;
      }
    },
    calls,
    stream,
    count: (method) => calls.filter((c) => c.method === method).length,
    out: (method) => calls.filter((c) => c.method === method && c.ended === undefined).length,
    streamed: (field) => connects().flatMap((e) => (e.dir === "sent" ? ((e.message as Listed)[field] ?? []) : [])),
    streamMessages: (field) => connects().filter((e) => e.dir === "sent" && ((e.message as Listed)[field]?.length ?? 0) > 0),
    maxOutstanding: () => balance().max,
    outstanding: () => balance().now,
    lastSent: (pass) =>
      connects()
        .filter((e) => e.dir === "sent" && pass(e.message))
        .at(-1)?.seq ?? -1,
    firstCall: (method) => calls.find((c) => c.method === method)?.seq ?? -1,
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

/** A unique agent name whose home daemon (link.ts homeIndex) is the `index`-th of `n` addresses. */
export function homedName(label: string, index: number, n: number): string {
  for (;;) {
    const name = agentName(label);
    if (homeIndex(name, n) === index) return name;
  }
}

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
