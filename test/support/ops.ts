/**
 * Fixture for the ops tests: an OpsService session (kit.ts), an agent that registers with a version
 * and tags and then claims, completes, fails and extends, and a WatchDirectives stream read by
 * awaiting the directive a test expects. Their producer is queue.ts's Producer.
 */
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { ConnectError } from "@connectrpc/connect";
import { AgentService, type Directive } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import type { ItemOutcome, WorkItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { TOKENS } from "./daemon.js";
import { Session } from "./kit.js";

export type { WorkItem };

export const opsSession = (address: string) => new Session(address, OpsService, TOKENS.ops);

export interface AgentOptions {
  tenants: string[];
  engineKinds: string[];
  version?: string;
  tags?: Record<string, string>;
  slots?: number;
}

/** An agent on a connection of its own. */
export class OpsTestAgent {
  readonly s: Session<typeof AgentService>;

  constructor(
    address: string,
    readonly name: string,
    readonly opts: AgentOptions,
  ) {
    this.s = new Session(address, AgentService, TOKENS.agent);
  }

  static async register(address: string, name: string, opts: AgentOptions): Promise<OpsTestAgent> {
    const a = new OpsTestAgent(address, name, opts);
    try {
      await a.register();
    } catch (err) {
      a.close();
      throw err;
    }
    return a;
  }

  register() {
    const o = this.opts;
    return this.s.client.register(
      {
        name: this.name,
        agentVersion: o.version ?? "",
        metadata: { tenants: o.tenants, engineKinds: o.engineKinds, tags: o.tags ?? {}, slots: o.slots ?? 4 },
      },
      this.s.call,
    );
  }

  claimResponse(max = 10) {
    return this.s.client.claim({ name: this.name, maxItems: max }, this.s.call);
  }

  /** A claim carrying completions. */
  claimCompleting(max: number, done: readonly { id: string; leaseToken: string }[]) {
    return this.s.client.claim(
      { name: this.name, maxItems: max, completions: done.map((i) => ({ workItemId: i.id, leaseToken: i.leaseToken, resultJson: "" })) },
      this.s.call,
    );
  }

  async claim(max = 10): Promise<WorkItem[]> {
    return (await this.claimResponse(max)).items;
  }

  async complete(items: readonly { id: string; leaseToken: string }[], result?: unknown): Promise<ItemOutcome[]> {
    const res = await this.s.client.complete(
      {
        name: this.name,
        items: items.map((i) => ({ workItemId: i.id, leaseToken: i.leaseToken, resultJson: result === undefined ? "" : JSON.stringify(result) })),
      },
      this.s.call,
    );
    return res.outcomes;
  }

  /** Fails items; a retryable failure comes back due at once (retry delay zero). */
  async fail(items: readonly { id: string; leaseToken: string }[], retryable: boolean, error = "boom"): Promise<ItemOutcome[]> {
    const res = await this.s.client.fail(
      { name: this.name, items: items.map((i) => ({ workItemId: i.id, leaseToken: i.leaseToken, error, retryable, retryDelay: durationFromMs(0) })) },
      this.s.call,
    );
    return res.outcomes;
  }

  async extend(items: readonly { id: string; leaseToken: string }[]): Promise<ItemOutcome[]> {
    const res = await this.s.client.extendLease({ name: this.name, leases: items.map((i) => ({ workItemId: i.id, leaseToken: i.leaseToken })) }, this.s.call);
    return res.outcomes;
  }

  /** Gives items back; `drainDeadline` says a drain deadline made the agent stop them. */
  async release(items: readonly { id: string; leaseToken: string }[], drainDeadline = false): Promise<ItemOutcome[]> {
    const res = await this.s.client.release(
      { name: this.name, leases: items.map((i) => ({ workItemId: i.id, leaseToken: i.leaseToken, drainDeadline })) },
      this.s.call,
    );
    return res.outcomes;
  }

  heartbeat() {
    return this.s.client.heartbeat({ name: this.name }, this.s.call);
  }

  /** Opens a WatchDirectives stream and waits for its first message (the current status). */
  async watch(): Promise<DirectiveWatch> {
    const w = new DirectiveWatch(this.s, this.name);
    await w.next();
    return w;
  }

  close(): void {
    this.s.close();
  }
}

/**
 * A WatchDirectives stream, read in the background. `next()` resolves with the next directive not yet
 * taken; `until()` takes directives until one matches, failing with what arrived when the stream ends
 * or a generous timeout (only a broken daemon hits it) passes.
 */
export class DirectiveWatch {
  readonly received: Directive[] = [];
  #taken = 0;
  #ended: Error | undefined;
  #wake: (() => void) | undefined;
  readonly #abort = new AbortController();

  constructor(s: Session<typeof AgentService>, name: string) {
    void (async () => {
      try {
        for await (const m of s.client.watchDirectives({ name }, { ...s.call, signal: this.#abort.signal })) {
          if (m.directive) this.received.push(m.directive);
          this.#wake?.();
        }
        this.#ended = new Error("stream ended");
      } catch (err) {
        this.#ended = ConnectError.from(err);
      }
      this.#wake?.();
    })();
  }

  async next(timeoutMs = 10_000): Promise<Directive> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const d = this.received[this.#taken];
      if (d) {
        this.#taken++;
        return d;
      }
      if (this.#ended) throw this.#ended;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no directive within ${timeoutMs}ms; received: ${show(this.received)}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.#wake = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.#wake = undefined;
    }
  }

  /** Takes directives until one satisfies `match`; returns it. */
  async until(match: (d: Directive) => boolean, timeoutMs = 10_000): Promise<Directive> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const d = await this.next(Math.max(1, deadline - Date.now()));
      if (match(d)) return d;
    }
  }

  close(): void {
    this.#abort.abort();
  }
}

// The ops tests' producer is the queue tests' (queue.ts).
export type { ItemInit } from "./queue.js";

/** JSON for messages in failure text (int64 fields are bigint). */
export const show = (x: unknown) => JSON.stringify(x, (_, v: unknown) => (typeof v === "bigint" ? String(v) : v));

/** Ids sorted, for order-free comparison. */
export const sorted = (ids: Iterable<string>) => [...ids].sort();
