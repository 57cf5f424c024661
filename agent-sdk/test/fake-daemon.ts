/**
 * A fake daemon for the SDK's tests of a daemon that misbehaves in ways a real one cannot be made
 * to on demand: a real HTTP/2 gRPC server (connect-node's handler) serving AgentService from memory.
 * Unary calls answer at once (every report accepted); each Connect stream is served as the test's
 * `stream` policy says for its number: `stuck` answers the first message with the agent's status
 * (and the items the test queued) and then nothing, not a withdrawal, not a report, not a goodbye,
 * and never ends on its own; `withdraws` is as stuck but answers withdrawals (so only the goodbye
 * goes unanswered); `unavailable` refuses the call.
 * It records what the agent sent, and `on` waits for a sent thing to arrive (no polling).
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type ConnectRouter, type HandlerContext } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { AgentService, type ConnectRequest, type ConnectResponseSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { WorkItemSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";

type Response = MessageInitShape<typeof ConnectResponseSchema>;
export type StreamPolicy = "stuck" | "withdraws" | "unavailable";

/** What the agent sent, in order: unary calls by method, and every Connect message with its stream's number. */
export type Sent = { method: string; message: unknown } | { method: "Connect"; stream: number; message: ConnectRequest };

export class FakeDaemon {
  readonly #server = http2.createServer();
  readonly #sessions = new Set<http2.ServerHttp2Session>();
  readonly #waiters = new Set<{ pass: (s: Sent) => boolean; resolve: (s: Sent) => void }>();
  /** The Connect responses the test still wants sent, per open stream. */
  readonly #outbox = new Map<number, { queue: Response[]; wake?: () => void }>();
  readonly sent: Sent[] = [];
  address = "";
  /** What registration, heartbeats and a stream's first answer say the agent is. */
  status = AgentStatus.ACTIVE;
  /** How the n-th Connect (from 1) is served. */
  stream: (n: number) => StreamPolicy = () => "stuck";
  /** While set, unary Complete calls answer only once it resolves (the agent's deadline may pass first). */
  completeGate: Promise<void> | undefined;
  /** Items for the first stream message that grants credits. */
  items: MessageInitShape<typeof WorkItemSchema>[] = [];
  #streams = 0;

  async start(): Promise<this> {
    this.#server.on("request", connectNodeAdapter({ routes: (r) => this.#routes(r), grpc: true, connect: false, grpcWeb: false }));
    this.#server.on("session", (s) => this.#sessions.add(s.once("close", () => this.#sessions.delete(s))));
    await new Promise<void>((resolve) => this.#server.listen(0, "127.0.0.1", resolve));
    this.address = `127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
    return this;
  }

  /** Resolves with the first thing sent (already, or from now on) that passes `pass`. */
  on(pass: (s: Sent) => boolean): Promise<Sent> {
    const seen = this.sent.find(pass);
    if (seen) return Promise.resolve(seen);
    return new Promise((resolve) => this.#waiters.add({ pass, resolve }));
  }

  /** Sends `res` on the open stream number `n`. */
  push(n: number, res: Response): void {
    const box = this.#outbox.get(n);
    if (!box) throw new Error(`stream ${n} is not open`);
    box.queue.push(res);
    box.wake?.();
  }

  async close(): Promise<void> {
    for (const s of this.#sessions) s.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }

  #record(s: Sent): void {
    this.sent.push(s);
    for (const w of this.#waiters)
      if (w.pass(s)) {
        this.#waiters.delete(w);
        w.resolve(s);
      }
  }

  #routes(router: ConnectRouter): void {
    const unary =
      <T>(method: string, answer: (req: never) => T) =>
      (req: unknown) => {
        this.#record({ method, message: req });
        return answer(req as never);
      };
    const ok = (id: string) => ({ workItemId: id, ok: true, code: 0, message: "" });
    router.service(AgentService, {
      register: unary("Register", () => ({
        id: "fake-agent",
        status: this.status,
        heartbeatInterval: durationFromMs(1_000),
        leaseTtl: durationFromMs(60_000),
        created: true,
      })),
      heartbeat: unary("Heartbeat", () => ({ status: this.status })),
      deregister: unary("Deregister", () => ({})),
      claim: unary("Claim", () => ({ status: this.status })),
      extendLease: unary("ExtendLease", (req: { leases: { workItemId: string }[] }) => ({ outcomes: req.leases.map((l) => ok(l.workItemId)) })),
      complete: unary("Complete", async (req: { items: { workItemId: string }[] }) => {
        await this.completeGate;
        return { outcomes: req.items.map((i) => ok(i.workItemId)) };
      }),
      fail: unary("Fail", (req: { items: { workItemId: string }[] }) => ({ outcomes: req.items.map((i) => ok(i.workItemId)) })),
      release: unary("Release", (req: { leases: { workItemId: string }[] }) => ({ outcomes: req.leases.map((l) => ok(l.workItemId)) })),
      watchDirectives: (_req, ctx) => this.#silence(ctx),
      connect: (requests, ctx) => this.#connect(requests, ctx),
    });
  }

  async *#silence(ctx: HandlerContext): AsyncGenerator<never> {
    await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
  }

  async *#connect(requests: AsyncIterable<ConnectRequest>, ctx: HandlerContext): AsyncGenerator<Response> {
    const n = ++this.#streams;
    const policy = this.stream(n);
    if (policy === "unavailable") throw new ConnectError("the fake daemon refuses this stream", Code.Unavailable);
    const box: { queue: Response[]; wake?: () => void } = { queue: [] };
    this.#outbox.set(n, box);
    let answered = false;
    let pushed = false;
    // Reads (and records) what the agent sends; the only answers are the first, the test's items
    // and (`withdraws`) withdrawals.
    void (async () => {
      try {
        for await (const message of requests) {
          this.#record({ method: "Connect", stream: n, message });
          const first: Response = {};
          if (!answered) first.status = this.status;
          if (!pushed && message.credits > 0 && this.items.length > 0) {
            first.items = this.items;
            pushed = true;
          }
          if (message.withdrawCredits && policy === "withdraws") first.creditsWithdrawn = true;
          answered = true;
          if (Object.keys(first).length > 0) this.push(n, first);
        }
      } catch {
        // The agent reset the stream: ctx.signal ends the responses.
      }
    })();
    const aborted = new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve(), { once: true }));
    try {
      for (;;) {
        while (box.queue.length > 0) yield box.queue.shift()!;
        if (ctx.signal.aborted) return;
        await Promise.race([aborted, new Promise<void>((resolve) => (box.wake = resolve))]);
        box.wake = undefined;
      }
    } finally {
      this.#outbox.delete(n);
    }
  }
}
