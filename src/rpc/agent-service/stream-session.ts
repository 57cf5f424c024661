/**
 * One agent stream's session (./stream.ts has the contract): it applies the agent's messages in
 * arrival order, one statement at a time, claims for the credits and pushes what it takes, parks
 * while the queue has nothing for it, and settles what it still holds when the stream ends. Its
 * flow (responses, reading, waits, the database away) is ./stream-flow.ts; what it holds (credits,
 * items pushed, completions queued) is ./stream-ledger.ts.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { ConnectRequest } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { AppError } from "../../domain/errors.js";
import type { OutageLog } from "../../db/outage-log.js";
import type { Identity } from "../caller.js";
import type { DirectiveMessage, KnownAgent } from "../../fleet/directives.js";
import type { HeartbeatBuffer } from "../../fleet/heartbeat-buffer.js";
import type { WorkQueue } from "../../queue/work-queue.js";
import type { Handed } from "../../queue/waiting-claims.js";
import { claimedItemToWire } from "../work-item-messages.js";
import { agentStatusToWire, directiveToWire } from "./messages.js";
import { assertScopeWithin, metricsJson } from "./registration.js";
import { StreamFlow, type Response } from "./stream-flow.js";
import { Ledger } from "./stream-ledger.js";
import { perItem, type AgentReports } from "./reports.js";

export interface AgentStreamDeps {
  queue: WorkQueue;
  reports: AgentReports;
  known(name: string): Promise<KnownAgent>;
  heartbeats: HeartbeatBuffer;
  draining: AbortSignal;
}

export class Session {
  readonly #flow: StreamFlow;
  readonly #ledger = new Ledger();
  #status: KnownAgent["status"];

  constructor(
    private readonly d: AgentStreamDeps,
    private readonly name: string,
    private readonly caller: Identity,
    state: KnownAgent,
    private readonly trace: ((parts: Handed[]) => void) | undefined,
    outage: OutageLog,
  ) {
    this.#status = state.status;
    this.#flow = new StreamFlow(name, outage);
  }

  async *run(first: ConnectRequest, reader: AsyncIterator<ConnectRequest>, signal: AbortSignal): AsyncGenerator<Response> {
    const { d, name } = this;
    const flow = this.#flow;
    const off = flow.watch(signal, d.draining);
    // Subscribed before the first response, so a directive issued meanwhile follows the status.
    const unsubscribe = d.queue.hub.subscribe(name, (m) => this.#directive(m));
    d.queue.events.streamOpened();
    flow.send({ status: agentStatusToWire(this.#status) });
    flow.inbox.push(first);
    const reading = flow.read(reader);
    const working = this.#work();
    try {
      yield* flow.responses();
    } finally {
      // The generator also ends when connect-node stops reading it (the call is gone).
      if (!flow.ending) flow.end("broken");
      unsubscribe();
      off();
      await working;
      void reading;
      d.queue.events.streamEnded(flow.ending ?? "broken");
      await this.#settleHeld();
    }
    if (flow.error) throw flow.error;
  }

  #directive(m: DirectiveMessage): void {
    if (m.kind === "status") {
      this.#status = m.status;
      this.#flow.send({ status: agentStatusToWire(m.status), directives: [directiveToWire(m)] });
      this.#flow.wake();
    } else this.#flow.send({ directives: [directiveToWire(m)] });
  }

  async #work(): Promise<void> {
    const flow = this.#flow;
    const ledger = this.#ledger;
    try {
      // After a goodbye the inbox is still applied: every report the agent sent is answered.
      while (flow.ending === undefined || (flow.ending === "goodbye" && (flow.inbox.length > 0 || ledger.completions.length > 0))) {
        if (flow.inbox.length > 0) await this.#apply(flow.take());
        else if (this.#claimable) await this.#claim();
        else if (ledger.completions.length > 0) await this.#completeAlone();
        else await flow.parked();
      }
    } catch (err) {
      if (!(err instanceof ConnectError || err instanceof AppError)) this.d.queue.log.warn({ err, agent: this.name }, "agent stream failed");
      flow.end("failed", err);
    } finally {
      flow.finish();
    }
  }

  get #claimable(): boolean {
    return this.#ledger.credit > 0 && this.#status === "active" && this.#flow.ending === undefined;
  }

  /** One message's parts, in the proto's order; an invalid item is answered INVALID_ARGUMENT, the rest applied. */
  async #apply(req: ConnectRequest): Promise<void> {
    const { d, name, caller } = this;
    const { reports } = d;
    const flow = this.#flow;
    const ledger = this.#ledger;
    const tenants = reports.limitOf(caller);
    if (req.name && req.name !== name)
      throw new ConnectError(`this stream is agent '${name}''s; a message named '${req.name}' (open a stream per agent)`, Code.InvalidArgument);
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
      const { valid, refused } = perItem(req.releases, "releases", (xs, f) => reports.leasesOf(xs, f));
      const ok = valid.length > 0 ? await flow.db(() => reports.release(name, valid, tenants)) : [];
      res.releaseOutcomes = [...ledger.released(valid, ok), ...refused];
    }
    if (req.failures.length > 0) {
      const { valid, refused } = perItem(req.failures, "failures", (xs, f) => reports.failuresOf(xs, f));
      const outcomes = valid.length > 0 ? await flow.db(() => reports.fail(name, valid, tenants)) : [];
      for (const f of valid) ledger.held.delete(f.id);
      res.failureOutcomes = [...outcomes, ...refused];
    }
    if (req.extensions.length > 0) {
      const { valid, refused } = perItem(req.extensions, "extensions", (xs, f) => reports.leasesOf(xs, f));
      if (valid.length > 0) {
        const e = await flow.db(() => reports.extend(name, valid, tenants));
        res.extendOutcomes = [...e.outcomes, ...refused];
        res.leaseExpiresAtNs = e.leaseExpiresAtNs;
      } else res.extendOutcomes = refused;
    }
    if (req.completions.length > 0) {
      const { valid, refused } = perItem(req.completions, "completions", (xs, f) => reports.completionsOf(xs, f));
      ledger.completions.push(...valid);
      if (refused.length > 0) res.completionOutcomes = refused;
    }
    if (req.withdrawCredits) {
      // Pushes so far went out before this answer; a parked claim sees no credit and closes its
      // slot, and what an insert handed it meanwhile goes back (#push has no room for it).
      ledger.credit = 0;
      res.creditsWithdrawn = true;
    }
    if (req.credits > 0) {
      const { slots } = await flow.db(() => reports.scopeOf(name));
      const { granted, cap } = ledger.grant(req.credits, slots);
      if (granted < req.credits)
        res.refused = `credits: ${req.credits - granted} of ${req.credits} not granted (agent '${name}' registered ${slots} slots: at most ${cap} items granted and unreported at once)`;
    }
    if (Object.keys(res).length > 0) flow.send(res);
  }

  async #completeAlone(): Promise<void> {
    const { d, name } = this;
    const items = this.#ledger.takeCompletions();
    const done = await this.#flow
      .db(() => d.queue.store.complete(name, items, d.queue.clock.nowMs(), d.reports.limitOf(this.caller)))
      .catch((err: unknown) => {
        this.#ledger.putBack(items);
        throw err;
      });
    this.#flow.send({ completionOutcomes: d.reports.completed(items, done) });
  }

  /**
   * Claims for the credits, carrying the completions queued; parks with its slot open when the
   * queue had less than asked, applying messages meanwhile without leaving the slot (their credits
   * grow it; their completions are applied alone), until a ring, an offer or the clock says look again.
   */
  async #claim(): Promise<void> {
    const { d, name } = this;
    const { queue, reports } = d;
    const flow = this.#flow;
    const ledger = this.#ledger;
    const scope = await flow.db(() => reports.scopeOf(name));
    assertScopeWithin(this.caller, name, scope);
    let woken = false;
    // One round (../../queue/claim-round.ts): its looks push what they take; it parks when it says wait.
    const round = queue.claimRound(name);
    round.open(scope, ledger.credit, () => {
      woken = true;
      flow.wake();
    });
    let handed: Handed | undefined;
    try {
      for (;;) {
        const want = Math.min(ledger.credit, queue.config.claimMaxItems);
        const completions = ledger.takeCompletions();
        const look = await round
          .look(want, completions, scope, (s) => flow.db(s))
          .catch((err: unknown) => {
            // Nothing was applied: the completions are still the agent's to hear about.
            ledger.putBack(completions);
            throw err;
          });
        if (completions.length > 0) flow.send({ completionOutcomes: reports.completed(completions, look.completed) });
        if (look.claimed) {
          await this.#push([look.claimed]);
          if (!this.#claimable) return;
        }
        round.grow(ledger.credit);
        if (look.next === "wait") break;
      }
      // Parked: the queue had nothing more for this agent when the statement ran.
      while (!woken && this.#claimable) {
        if (flow.inbox.length > 0) {
          await this.#apply(flow.take());
          round.grow(ledger.credit);
        } else if (ledger.completions.length > 0) await this.#completeAlone();
        else await flow.parked();
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
    const { reports, queue } = d;
    const ledger = this.#ledger;
    const { within, outside } = reports.splitOutside(parts, this.caller);
    const back: Handed[] = [...outside];
    // An ended stream takes nothing more (after a goodbye the agent runs nothing new).
    let room = this.#flow.ending === undefined ? ledger.credit : 0;
    const send: Handed[] = [];
    for (const p of within) {
      const keep = p.rows.slice(0, Math.max(0, room));
      room -= keep.length;
      if (keep.length < p.rows.length) back.push({ rows: p.rows.slice(keep.length), dispatch: p.dispatch });
      if (keep.length > 0) send.push({ rows: keep, dispatch: p.dispatch });
    }
    if (back.length > 0) await this.#flow.db(() => reports.giveBack(name, back));
    if (send.length === 0) return;
    this.trace?.(send);
    const items = [];
    for (const p of send) {
      queue.events.dispatched(p.rows, Number(p.dispatch.dispatchedAtNs / 1_000_000n));
      for (const r of p.rows) {
        ledger.held.set(r.id, p.dispatch.leaseToken);
        items.push(claimedItemToWire(r, p.dispatch));
      }
    }
    ledger.credit -= items.length;
    queue.events.claimAnswered(items.length);
    this.#flow.send({ items, affinityKeys: [...new Set(send.flatMap((p) => p.rows.flatMap((r) => (r.affinity_key ? [r.affinity_key] : []))))] });
  }

  /** What becomes of the items the stream pushed and that were not reported (see ./stream.ts's comment). */
  async #settleHeld(): Promise<void> {
    const leases = this.#ledger.settle();
    const ending = this.#flow.ending;
    if (leases.length === 0 || ending === "shutdown" || ending === "failed") return;
    const { queue, reports } = this.d;
    try {
      if (ending === "goodbye") await reports.release(this.name, leases);
      else await queue.streamBroke(this.name, leases);
    } catch (err) {
      queue.log.warn(
        { err: err instanceof Error ? err.message : String(err), agent: this.name, items: leases.length },
        "could not return the items of an ended stream; they return when their leases expire",
      );
    }
  }
}
