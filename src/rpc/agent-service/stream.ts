/**
 * AgentService.Connect: one long-lived stream per agent (see the proto for the contract). The agent
 * grants credits; the daemon pushes items under leases within them — from its claim statement, or
 * from an Enqueue insert on this daemon that hands its rows to the stream's open slot
 * (../../queue/waiting-claims.ts) — and answers every report on the same stream.
 *
 * What must stay true:
 * - Never more items pushed than credits granted: a push uses credits; the slot an insert may fill
 *   is sized to the credits left, and what a claim and a hand-off bring together past them goes back.
 * - One statement at a time per stream, in arrival order: a session applies its messages serially,
 *   so its reports and claims never race each other, and it holds at most one pool connection.
 * - Bounded memory: the session stops reading requests while its outgoing queue or its inbox is
 *   long (HTTP/2 flow control then holds the agent's writes back), and items are bounded by credits.
 * - A parked stream costs nothing per unit of time: no timer, no statement, no signal listener per
 *   wait; it is woken by a ring for its keys, an insert's offer, its own next message, a directive,
 *   or the daemon's fallback re-check (which rings keys with due work).
 * - The database away does not end a session: a statement that fails for it is tried again, in
 *   order, after a backoff, while the session keeps its stream, its credits and what it holds
 *   (pushes simply pause). Ending it would cost the agent a reconnect and a fresh stream at the
 *   worst moment, and every agent would come back at once when the database does.
 * - The end decides the fate of the unreported items it pushed: the agent's goodbye releases them
 *   at once, spending nothing; a broken stream (reset, cancelled, half-closed without a goodbye)
 *   requeues them at once, one redelivery spent; a daemon shutting down, or ending the stream with
 *   an error of its own (a bug, a message it refused), leaves them leased, to be reported through
 *   any daemon.
 */
import { Code, ConnectError, type HandlerContext } from "@connectrpc/connect";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { ConnectRequest, ConnectResponseSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { AppError } from "../../domain/errors.js";
import { databaseAway } from "../../db/errors.js";
import { OutageLog } from "../../db/outage-log.js";
import { callerOf, type Identity } from "../caller.js";
import type { DirectiveMessage, KnownAgent } from "../../fleet/directives.js";
import type { HeartbeatBuffer } from "../../fleet/heartbeat-buffer.js";
import type { WorkQueue } from "../../queue/work-queue.js";
import type { Handed } from "../../queue/waiting-claims.js";
import type { Completion } from "../../store/work-items.js";
import { dispatchTracer } from "../../observability/dispatch-spans.js";
import { callSpanKey } from "../../observability/rpc-spans.js";
import type { StreamEnding } from "../../observability/metrics.js";
import { onAbort } from "../../util/on-abort.js";
import { agentName } from "../input/validate.js";
import { claimedItemToWire } from "../work-item-messages.js";
import { agentStatusToWire, directiveToWire } from "./messages.js";
import { assertScopeWithin, metricsJson } from "./registration.js";
import { perItem, type WorkKit } from "./work-kit.js";

type Response = MessageInitShape<typeof ConnectResponseSchema>;

export interface AgentStreamDeps {
  queue: WorkQueue;
  kit: WorkKit;
  known(name: string): Promise<KnownAgent>;
  heartbeats: HeartbeatBuffer;
  draining: AbortSignal;
}

/** Items a stream may hold granted and unreported at once (credits beyond it are not granted). */
export const MAX_OUTSTANDING = 10_000;

/**
 * Items an agent of `slots` registered slots may hold granted and unreported at once: its slots and
 * a claim-ahead allowance of 3 × slots, and never less than 256 in all (slots 0, an agent that
 * registered none, gets 256). The SDKs ask for at most slots + prefetch, and their default
 * prefetch is 3 × slots at most 256 − slots (agent-sdk/src/options.ts, and the Python agent's), so
 * an agent on the defaults never meets this; an agent that grants itself more is refused the rest.
 */
export const creditCap = (slots: number) => Math.min(MAX_OUTSTANDING, Math.max(4 * slots, slots + 256));
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

/**
 * How the stream ended: the agent half-closed (goodbye), the call broke on the agent's side
 * (broken), the daemon is shutting down (shutdown), or the daemon ended it with an error — the
 * database away, a message it refused (failed). Only `broken` says the agent may be gone.
 */
type Ending = StreamEnding;

export function agentStreamImpl(d: AgentStreamDeps) {
  const traceDispatches = dispatchTracer();
  const outage = new OutageLog(d.queue.log, "database unavailable: agent streams keep their sessions and try again");
  return {
    async *connect(requests: AsyncIterable<ConnectRequest>, ctx: HandlerContext): AsyncGenerator<Response> {
      const caller = callerOf(ctx);
      const reader = requests[Symbol.asyncIterator]();
      const first = await reader.next();
      if (first.done) return;
      const name = agentName(first.value.name, ctx);
      assertScopeWithin(caller, name, await d.kit.scopeOf(name));
      const state = await d.known(name);
      // Dispatch spans link to this call's span, as a Claim's do to the Claim's.
      const trace = traceDispatches && ((parts: Handed[]) => traceDispatches(ctx.values.get(callSpanKey), parts));
      yield* new Session(d, name, caller, state, trace, outage).run(first.value, reader, ctx.signal);
    },
  };
}

class Session {
  readonly #out: Response[] = [];
  readonly #inbox: ConnectRequest[] = [];
  /** Pushed under a lease and not yet reported through this stream: id → token. */
  readonly #held = new Map<string, string>();
  #credit = 0;
  /** Completions waiting to ride the next claim statement (or be applied alone). */
  #completions: Completion[] = [];
  #ending: Ending | undefined;
  #error: unknown;
  #status: KnownAgent["status"];
  #poke: (() => void) | undefined;
  #outWake: (() => void) | undefined;
  #roomWake: (() => void) | undefined;
  /** Cuts short a wait for the database: the session ended, or its call is gone. */
  #endWake: (() => void) | undefined;
  /** The call is gone or the daemon is shutting down: whatever the first word was, nothing waits for the database any more. */
  #gone = false;

  constructor(
    private readonly d: AgentStreamDeps,
    private readonly name: string,
    private readonly caller: Identity,
    state: KnownAgent,
    private readonly trace: ((parts: Handed[]) => void) | undefined,
    private readonly outage: OutageLog,
  ) {
    this.#status = state.status;
  }

  async *run(first: ConnectRequest, reader: AsyncIterator<ConnectRequest>, signal: AbortSignal): AsyncGenerator<Response> {
    const { d, name } = this;
    const gone = () => {
      this.#gone = true;
      this.#endWake?.();
    };
    const off = [onAbort(signal, () => (this.#end("broken"), gone())), onAbort(d.draining, () => (this.#end("shutdown", shuttingDown()), gone()))];
    // Subscribed before the first response, so a directive issued meanwhile follows the status.
    const unsubscribe = d.queue.hub.subscribe(name, (m) => this.#directive(m));
    d.queue.events.streamOpened();
    this.#send({ status: agentStatusToWire(this.#status) });
    this.#inbox.push(first);
    const reading = this.#read(reader);
    const working = this.#work();
    try {
      for (;;) {
        while (this.#out.length > 0) {
          yield this.#out.shift()!;
          this.#roomWake?.();
        }
        if (this.#finished) break;
        await new Promise<void>((r) => (this.#outWake = r));
        this.#outWake = undefined;
      }
    } finally {
      // The generator also ends when connect-node stops reading it (the call is gone).
      if (!this.#ending) this.#end("broken");
      unsubscribe();
      for (const o of off) o();
      await working;
      void reading;
      d.queue.events.streamEnded(this.#ending ?? "broken");
      await this.#settleHeld();
    }
    if (this.#error) throw this.#error;
  }

  /** Every response the stream owes was queued and the work loop has stopped. */
  #finished = false;

  #end(how: Ending, error?: unknown): void {
    // The first word stands: a goodbye followed by the call closing is still a goodbye.
    if (this.#ending) return;
    this.#ending = how;
    this.#error ??= error;
    this.#wake();
    this.#endWake?.();
  }

  /**
   * Runs one statement, again after a backoff for as long as the database is away and the session
   * lives. The statements tried again are each one transaction that either applied or did not (a
   * report applied whose answer was lost is refused when tried again, by its lease token, never
   * applied twice). When the session ends meanwhile, the last failure is thrown.
   */
  async #db<T>(statement: () => Promise<T>): Promise<T> {
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

  #wake(): void {
    this.#poke?.();
    this.#poke = undefined;
  }

  #send(res: Response): void {
    this.#out.push(res);
    if (this.#out.length >= OUT_HARD) this.#end("broken", new ConnectError("the agent stopped reading its stream; it was cut off", Code.ResourceExhausted));
    this.#outWake?.();
  }

  #directive(m: DirectiveMessage): void {
    if (m.kind === "status") {
      this.#status = m.status;
      this.#send({ status: agentStatusToWire(m.status), directives: [directiveToWire(m)] });
      this.#wake();
    } else this.#send({ directives: [directiveToWire(m)] });
  }

  /** Reads requests into the inbox, holding back while the session is behind. */
  async #read(reader: AsyncIterator<ConnectRequest>): Promise<void> {
    try {
      for (;;) {
        while (!this.#ending && (this.#inbox.length >= INBOX_MAX || this.#out.length >= OUT_SOFT)) await new Promise<void>((r) => (this.#roomWake = r));
        if (this.#ending) return;
        const next = await reader.next();
        // A half-close without a goodbye is no goodbye: a client cancelling its call may end its
        // request side first (connect-es does), and the reset follows.
        if (next.done) return this.#end("broken");
        this.#inbox.push(next.value);
        this.#wake();
        // Read no further: the agent has nothing more to say, and what it said is applied first.
        if (next.value.goodbye) return this.#end("goodbye");
      }
    } catch (err) {
      this.#end("broken", err);
    }
  }

  /** Waits for the next poke: a message, a ring or offer, a directive, the end. */
  #parked(): Promise<void> {
    return new Promise<void>((r) => (this.#poke = r));
  }

  async #work(): Promise<void> {
    try {
      // After a goodbye the inbox is still applied: every report the agent sent is answered.
      while (this.#ending === undefined || (this.#ending === "goodbye" && (this.#inbox.length > 0 || this.#completions.length > 0))) {
        if (this.#inbox.length > 0) await this.#apply(this.#inbox.shift()!);
        else if (this.#claimable) await this.#claim();
        else if (this.#completions.length > 0) await this.#completeAlone();
        else await this.#parked();
      }
    } catch (err) {
      if (!(err instanceof ConnectError || err instanceof AppError)) this.d.queue.log.warn({ err, agent: this.name }, "agent stream failed");
      this.#end("failed", err);
    } finally {
      this.#finished = true;
      this.#outWake?.();
    }
  }

  get #claimable(): boolean {
    return this.#credit > 0 && this.#status === "active" && this.#ending === undefined;
  }

  /** One message's parts, in the proto's order; an invalid item is answered INVALID_ARGUMENT, the rest applied. */
  async #apply(req: ConnectRequest): Promise<void> {
    this.#roomWake?.();
    const { d, name, caller } = this;
    const { kit } = d;
    const tenants = kit.limitOf(caller);
    if (req.name && req.name !== name) throw new ConnectError(`this stream is agent '${name}''s; a message named '${req.name}' (open a stream per agent)`, Code.InvalidArgument);
    const res: Response = {};
    if (req.heartbeat) {
      const at = d.queue.clock.nowMs();
      try {
        d.heartbeats.add({ name, metrics: metricsJson(req.heartbeat.metrics, req.heartbeat.inFlight, at), at });
      } catch (err) {
        if (!(err instanceof AppError)) throw err;
        res.refused = `heartbeat: ${err.message}`;
      }
    }
    if (req.releases.length > 0) {
      const { valid, refused } = perItem(req.releases, "releases", (xs, f) => kit.leasesOf(xs, f));
      const ok = valid.length > 0 ? await this.#db(() => kit.release(name, valid, tenants)) : [];
      res.releaseOutcomes = [...this.#reported(valid, ok), ...refused];
    }
    if (req.failures.length > 0) {
      const { valid, refused } = perItem(req.failures, "failures", (xs, f) => kit.failuresOf(xs, f));
      const outcomes = valid.length > 0 ? await this.#db(() => kit.fail(name, valid, tenants)) : [];
      for (const f of valid) this.#held.delete(f.id);
      res.failureOutcomes = [...outcomes, ...refused];
    }
    if (req.extensions.length > 0) {
      const { valid, refused } = perItem(req.extensions, "extensions", (xs, f) => kit.leasesOf(xs, f));
      if (valid.length > 0) {
        const e = await this.#db(() => kit.extend(name, valid, tenants));
        res.extendOutcomes = [...e.outcomes, ...refused];
        res.leaseExpiresAtNs = e.leaseExpiresAtNs;
      } else res.extendOutcomes = refused;
    }
    if (req.completions.length > 0) {
      const { valid, refused } = perItem(req.completions, "completions", (xs, f) => kit.completionsOf(xs, f));
      this.#completions.push(...valid);
      if (refused.length > 0) res.completionOutcomes = refused;
    }
    if (req.withdrawCredits) {
      // Pushes so far went out before this answer; a parked claim sees no credit and closes its
      // slot, and what an insert handed it meanwhile goes back (#push has no room for it).
      this.#credit = 0;
      res.creditsWithdrawn = true;
    }
    if (req.credits > 0) {
      // Held and not reported: completions already applied from this or an earlier message are
      // reported, though #held lets them go only once their statement runs.
      let reported = 0;
      for (const c of this.#completions) if (this.#held.has(c.id)) reported++;
      const { slots } = await this.#db(() => kit.scopeOf(name));
      const cap = creditCap(slots);
      const granted = Math.min(req.credits, Math.max(0, cap - (this.#held.size - reported) - this.#credit));
      this.#credit += granted;
      if (granted < req.credits)
        res.refused = `credits: ${req.credits - granted} of ${req.credits} not granted (agent '${name}' registered ${slots} slots: at most ${cap} items granted and unreported at once)`;
    }
    if (Object.keys(res).length > 0) this.#send(res);
  }

  /** Outcomes of releases; a released item is no longer held. */
  #reported(leases: readonly { id: string }[], ok: readonly string[]) {
    const done = new Set(ok);
    for (const l of leases) if (done.has(l.id)) this.#held.delete(l.id);
    return leases.map((l) => ({ workItemId: l.id, ok: done.has(l.id), code: done.has(l.id) ? 0 : Code.FailedPrecondition, message: done.has(l.id) ? "" : "lease lost" }));
  }

  #takeCompletions(): Completion[] {
    const taken = this.#completions;
    this.#completions = [];
    for (const c of taken) this.#held.delete(c.id);
    return taken;
  }

  async #completeAlone(): Promise<void> {
    const { d, name } = this;
    const items = this.#takeCompletions();
    const done = await this.#db(() => d.queue.store.complete(name, items, d.queue.clock.nowMs(), d.kit.limitOf(this.caller))).catch((err: unknown) => {
      this.#completions.unshift(...items);
      throw err;
    });
    this.#send({ completionOutcomes: d.kit.completed(items, done) });
  }

  /**
   * Claims for the credits, carrying the completions queued; parks with its slot open when the
   * queue had less than asked, applying messages meanwhile without leaving the slot (their credits
   * grow it; their completions are applied alone), until a ring, an offer or the clock says look again.
   */
  async #claim(): Promise<void> {
    const { d, name } = this;
    const { queue, kit } = d;
    const scope = await this.#db(() => kit.scopeOf(name));
    assertScopeWithin(this.caller, name, scope);
    let woken = false;
    // One round (../../queue/claim-round.ts): its looks push what they take; it parks when it says wait.
    const round = queue.claimRound(name);
    round.open(scope, this.#credit, () => {
      woken = true;
      this.#wake();
    });
    let handed: Handed | undefined;
    try {
      for (;;) {
        const want = Math.min(this.#credit, queue.config.claimMaxItems);
        const completions = this.#takeCompletions();
        const look = await round.look(want, completions, scope, (s) => this.#db(s)).catch((err: unknown) => {
          // Nothing was applied: the completions are still the agent's to hear about.
          this.#completions.unshift(...completions);
          throw err;
        });
        if (completions.length > 0) this.#send({ completionOutcomes: kit.completed(completions, look.completed) });
        if (look.claimed) {
          await this.#push([look.claimed]);
          if (!this.#claimable) return;
        }
        round.grow(this.#credit);
        if (look.next === "wait") break;
      }
      // Parked: the queue had nothing more for this agent when the statement ran.
      while (!woken && this.#claimable) {
        if (this.#inbox.length > 0) {
          await this.#apply(this.#inbox.shift()!);
          round.grow(this.#credit);
        } else if (this.#completions.length > 0) await this.#completeAlone();
        else await this.#parked();
      }
    } finally {
      handed = await round.close();
      if (handed) await this.#push([handed]);
    }
  }

  /**
   * Pushes claimed or handed items within the credits: what exceeds them, what a tenant-limited
   * caller may not have, and anything arriving after the stream ended go back to the queue at once.
   */
  async #push(parts: Handed[]): Promise<void> {
    const { d, name } = this;
    const { kit, queue } = d;
    const { within, outside } = kit.splitOutside(parts, this.caller);
    const back: Handed[] = [...outside];
    // An ended stream takes nothing more (after a goodbye the agent runs nothing new).
    let room = this.#ending === undefined ? this.#credit : 0;
    const send: Handed[] = [];
    for (const p of within) {
      const keep = p.rows.slice(0, Math.max(0, room));
      room -= keep.length;
      if (keep.length < p.rows.length) back.push({ rows: p.rows.slice(keep.length), dispatch: p.dispatch });
      if (keep.length > 0) send.push({ rows: keep, dispatch: p.dispatch });
    }
    if (back.length > 0) await this.#db(() => kit.giveBack(name, back));
    if (send.length === 0) return;
    this.trace?.(send);
    const items = [];
    for (const p of send) {
      queue.events.dispatched(p.rows, Number(p.dispatch.dispatchedAtNs / 1_000_000n));
      for (const r of p.rows) {
        this.#held.set(r.id, p.dispatch.leaseToken);
        items.push(claimedItemToWire(r, p.dispatch));
      }
    }
    this.#credit -= items.length;
    queue.events.claimAnswered(items.length);
    this.#send({ items, affinityKeys: [...new Set(send.flatMap((p) => p.rows.flatMap((r) => (r.affinity_key ? [r.affinity_key] : []))))] });
  }

  /** What becomes of the items the stream pushed and that were not reported (see the file's comment). */
  async #settleHeld(): Promise<void> {
    const leases = [...this.#held].map(([id, token]) => ({ id, token }));
    this.#held.clear();
    if (leases.length === 0 || this.#ending === "shutdown" || this.#ending === "failed") return;
    const { queue, kit } = this.d;
    try {
      if (this.#ending === "goodbye") await kit.release(this.name, leases);
      else await queue.streamBroke(this.name, leases);
    } catch (err) {
      queue.log.warn({ err: err instanceof Error ? err.message : String(err), agent: this.name, items: leases.length }, "could not return the items of an ended stream; they return when their leases expire");
    }
  }
}
