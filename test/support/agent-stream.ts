/**
 * An agent's Connect stream as a test drives it: messages sent when the test says, every response
 * kept in order, waits on what arrived (never on time), and the three ways a stream ends: a goodbye
 * (half-close), a break (the call cancelled) and the daemon's end.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import type { AgentService, ConnectRequestSchema, ConnectResponse } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import type { WorkItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { bearer, TOKENS } from "./daemon.js";
import { until } from "./kit.js";

type Request = MessageInitShape<typeof ConnectRequestSchema>;

export class AgentStream {
  readonly responses: ConnectResponse[] = [];
  readonly #queue: Request[] = [];
  #wake: (() => void) | undefined;
  #closed = false;
  readonly #abort = new AbortController();
  /** Settles when the daemon ends the stream: undefined when it ended cleanly, else the error. */
  readonly ended: Promise<unknown>;
  /** Called with each response as it arrives (after it is kept). */
  onResponse: ((r: ConnectResponse) => void) | undefined;

  constructor(
    client: Client<typeof AgentService>,
    readonly name: string,
    first: { credits?: number } = {},
  ) {
    this.#queue.push({ name, ...first });
    this.ended = this.#run(client);
  }

  async #run(client: Client<typeof AgentService>): Promise<unknown> {
    try {
      for await (const res of client.connect(this.#requests(), { headers: bearer(TOKENS.agent), signal: this.#abort.signal })) {
        this.responses.push(res);
        this.onResponse?.(res);
      }
      return undefined;
    } catch (err) {
      return err;
    }
  }

  async *#requests(): AsyncGenerator<Request> {
    for (;;) {
      while (this.#queue.length > 0) yield this.#queue.shift()!;
      if (this.#closed) return;
      await new Promise<void>((r) => (this.#wake = r));
    }
  }

  send(req: Request): void {
    this.#queue.push(req);
    this.#wake?.();
  }

  credit(n: number): void {
    this.send({ credits: n });
  }

  complete(items: readonly { id: string; leaseToken: string }[], resultJson = ""): void {
    this.send({ completions: items.map((i) => ({ workItemId: i.id, leaseToken: i.leaseToken, resultJson })) });
  }

  /** The agent's goodbye, then a half-close. */
  goodbye(): void {
    this.#queue.push({ goodbye: true });
    this.#closed = true;
    this.#wake?.();
  }

  /** Half-closes without a goodbye. */
  hangUp(): void {
    this.#closed = true;
    this.#wake?.();
  }

  /** Cancels the call: the stream breaks. */
  break(): void {
    this.#abort.abort();
  }

  get items(): WorkItem[] {
    return this.responses.flatMap((r) => r.items);
  }

  /** Resolves with the first response (from `from` on) that passes, waiting for it to arrive. */
  async next(what: string, pass: (r: ConnectResponse) => boolean, from = 0): Promise<ConnectResponse> {
    let found: ConnectResponse | undefined;
    await until(what, () => (found = this.responses.slice(from).find(pass)) !== undefined);
    return found!;
  }

  async itemsAtLeast(n: number): Promise<WorkItem[]> {
    await until(`${n} items pushed to ${this.name}`, () => this.items.length >= n);
    return this.items;
  }

  /**
   * A marker: sends a release of an item nobody holds and waits for its outcome. The daemon applies
   * a stream's messages in order, so everything sent before it has been applied when it returns.
   */
  async settled(): Promise<void> {
    const marker = `marker-${Math.random().toString(36).slice(2)}`;
    this.send({ releases: [{ workItemId: marker, leaseToken: "none" }] });
    await this.next("the marker's outcome", (r) => r.releaseOutcomes.some((o) => o.workItemId === marker));
  }
}
