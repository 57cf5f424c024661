/**
 * One agent stream's flow: the responses it owes, the requests read ahead of the one being applied,
 * how it ends and why, the parked session's waits, and the statements tried again while the
 * database is away. It keeps three of the stream's rules (./stream.ts says them all): bounded
 * memory (reading stops while the outgoing queue or the inbox is long), a parked stream costs
 * nothing per unit of time (a wait is one promise, woken by a poke), and the database away does not
 * end a session (db() tries a statement again, after a backoff, while the session lives).
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ConnectRequest, ConnectResponseSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { databaseAway } from "../../db/errors.js";
import type { OutageLog } from "../../db/outage-log.js";
import type { StreamEnding } from "../../observability/metrics.js";
import { onAbort } from "../../util/on-abort.js";

export type Response = MessageInitShape<typeof ConnectResponseSchema>;

/**
 * How the stream ended: the agent half-closed (goodbye), the call broke on the agent's side
 * (broken), the daemon is shutting down (shutdown), or the daemon ended it with an error — the
 * database away, a message it refused (failed). Only `broken` says the agent may be gone.
 */
export type Ending = StreamEnding;

/** Responses queued before the session stops reading requests (the agent's writes then wait). */
const OUT_SOFT = 64;
/** Responses queued at which the agent is cut off: it stopped reading while directives kept coming. */
const OUT_HARD = 10_000;
/** Requests read ahead of the one being applied. */
const INBOX_MAX = 16;
/**
 * How a graceful stop ends every agent stream, at once: UNAVAILABLE, which every gRPC client takes
 * for "try again", and the agent does elsewhere (its items stay leased, to be reported there).
 */
const shuttingDown = () => new ConnectError("the daemon is shutting down: connect to another daemon (or to this one once it is back)", Code.Unavailable);
/** Backoff of a statement the database was away for: from the first to the most, doubling, with jitter. */
const AWAY_FIRST_MS = 50;
const AWAY_MOST_MS = 2_000;

export class StreamFlow {
  readonly #out: Response[] = [];
  /** Requests read and not yet applied, in arrival order. */
  readonly inbox: ConnectRequest[] = [];
  #ending: Ending | undefined;
  #error: unknown;
  #poke: (() => void) | undefined;
  #outWake: (() => void) | undefined;
  #roomWake: (() => void) | undefined;
  /** Cuts short a wait for the database: the session ended, or its call is gone. */
  #endWake: (() => void) | undefined;
  /** The call is gone or the daemon is shutting down: whatever the first word was, nothing waits for the database any more. */
  #gone = false;
  /** Every response the stream owes was queued and the work loop has stopped. */
  #finished = false;

  constructor(
    private readonly name: string,
    private readonly outage: OutageLog,
  ) {}

  /** How the stream ended; undefined while it lives. */
  get ending(): Ending | undefined {
    return this.#ending;
  }

  /** The error the stream ends with, if any. */
  get error(): unknown {
    return this.#error;
  }

  /** Ends the stream when its call is gone (`signal`) or the daemon shuts down (`draining`); returns what stops watching. */
  watch(signal: AbortSignal, draining: AbortSignal): () => void {
    const gone = () => {
      this.#gone = true;
      this.#endWake?.();
    };
    const off = [onAbort(signal, () => (this.end("broken"), gone())), onAbort(draining, () => (this.end("shutdown", shuttingDown()), gone()))];
    return () => {
      for (const o of off) o();
    };
  }

  /** The responses, in order, until the work loop has stopped and every one owed is out. */
  async *responses(): AsyncGenerator<Response> {
    for (;;) {
      while (this.#out.length > 0) {
        yield this.#out.shift()!;
        this.#roomWake?.();
      }
      if (this.#finished) break;
      await new Promise<void>((r) => (this.#outWake = r));
      this.#outWake = undefined;
    }
  }

  /** The work loop has stopped: the responses end once those queued are out. */
  finish(): void {
    this.#finished = true;
    this.#outWake?.();
  }

  end(how: Ending, error?: unknown): void {
    // The first word stands: a goodbye followed by the call closing is still a goodbye.
    if (this.#ending) return;
    this.#ending = how;
    this.#error ??= error;
    this.wake();
    this.#endWake?.();
  }

  /**
   * Runs one statement, again after a backoff for as long as the database is away and the session
   * lives. The statements tried again are each one transaction that either applied or did not (a
   * report applied whose answer was lost is refused when tried again, by its lease token, never
   * applied twice). When the session ends meanwhile, the last failure is thrown.
   */
  async db<T>(statement: () => Promise<T>): Promise<T> {
    // After a goodbye the agent still waits for the answers to what it reported, so those wait too.
    const over = () => this.#gone || (this.#ending !== undefined && this.#ending !== "goodbye");
    for (let attempt = 0; ; attempt++) {
      try {
        return await statement();
      } catch (err) {
        if (over() || !databaseAway(err)) throw err;
        this.outage.note(err, { agent: this.name });
        const most = Math.min(AWAY_MOST_MS, AWAY_FIRST_MS * 2 ** attempt);
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, most / 2 + Math.random() * (most / 2));
          this.#endWake = () => (clearTimeout(timer), resolve());
        });
        this.#endWake = undefined;
        if (over()) throw err;
      }
    }
  }

  /** Pokes the parked session. */
  wake(): void {
    this.#poke?.();
    this.#poke = undefined;
  }

  /** Waits for the next poke: a message, a ring or offer, a directive, the end. */
  parked(): Promise<void> {
    return new Promise<void>((r) => (this.#poke = r));
  }

  send(res: Response): void {
    this.#out.push(res);
    if (this.#out.length >= OUT_HARD) this.end("broken", new ConnectError("the agent stopped reading its stream; it was cut off", Code.ResourceExhausted));
    this.#outWake?.();
  }

  /** The next request to apply (there is one), making room for the reader. */
  take(): ConnectRequest {
    const req = this.inbox.shift()!;
    this.#roomWake?.();
    return req;
  }

  /** Reads requests into the inbox, holding back while the session is behind. */
  async read(reader: AsyncIterator<ConnectRequest>): Promise<void> {
    try {
      for (;;) {
        while (!this.#ending && (this.inbox.length >= INBOX_MAX || this.#out.length >= OUT_SOFT)) await new Promise<void>((r) => (this.#roomWake = r));
        if (this.#ending) return;
        const next = await reader.next();
        // A half-close without a goodbye is no goodbye: a client cancelling its call may end its
        // request side first (connect-es does), and the reset follows.
        if (next.done) return this.end("broken");
        this.inbox.push(next.value);
        this.wake();
        // Read no further: the agent has nothing more to say, and what it said is applied first.
        if (next.value.goodbye) return this.end("goodbye");
      }
    } catch (err) {
      this.end("broken", err);
    }
  }
}
