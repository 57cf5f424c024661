/**
 * AgentService's work RPCs (role `agent`): long-poll claims, lease extension, fenced completion,
 * failure and release. Every batch answers per item; a stale lease token refuses that item with
 * FAILED_PRECONDITION and changes nothing about it.
 *
 * A token limited to some tenants acts only as agents all of whose registered tenants it holds:
 * checked on every call against the agent's cached scope (no statement of its own), and again on
 * what a claim returns, since a registration elsewhere may change the scope before this daemon
 * hears of it; its fenced writes match only items of its tenants.
 */
import { durationMs } from "@bufbuild/protobuf/wkt";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { resourceExhausted } from "../../domain/errors.js";
import type { AgentService } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { callerOf, type Identity } from "../caller.js";
import { assertAgentWithin, assertScopeWithin } from "./registration.js";
import type { AgentReports } from "./reports.js";
import type { KnownAgent } from "../../fleet/directives.js";
import { agentStatusToWire } from "./messages.js";
import type { WorkQueue } from "../../queue/work-queue.js";
import type { Handed } from "../../queue/waiting-claims.js";
import { agentName } from "../input/validate.js";
import { claimedItemToWire, fencedOutcomes } from "../work-item-messages.js";
import type { Look } from "../../queue/claim-round.js";
import { dispatchTracer } from "../../observability/dispatch-spans.js";
import { callSpanKey } from "../../observability/rpc-spans.js";

export interface AgentWorkDeps {
  queue: WorkQueue;
  /** The rules the unary path shares with the stream (./reports.ts). */
  reports: AgentReports;
  /** The agent's cached status (from the directive hub), loading it when unknown. */
  known(name: string): Promise<KnownAgent>;
  draining: AbortSignal;
}

export function agentWorkImpl(d: AgentWorkDeps): Pick<ServiceImpl<typeof AgentService>, "claim" | "extendLease" | "complete" | "fail" | "release"> {
  const { queue } = d;
  const { config, clock, store } = queue;
  /** A span per dispatched item in its own trace; undefined while the daemon does not trace. */
  const traceDispatches = dispatchTracer();

  const { reports } = d;
  const { scopeOf, limitOf, giveBack, completed } = reports;

  /**
   * Waiting claims held now, per agent name and per token: each holds a call, a waiter and a
   * statement per wake-up, so a client that sends claims without waiting for their answers must be
   * stopped before it costs the daemon its memory and the database its connections.
   */
  const waitingByAgent = new Map<string, number>();
  const waitingByToken = new Map<Identity, number>();
  const holdWaiting = (name: string, caller: Identity): (() => void) => {
    const perAgent = waitingByAgent.get(name) ?? 0;
    if (perAgent >= config.claimMaxWaitingPerAgent)
      throw resourceExhausted(
        `agent '${name}' already has ${perAgent} waiting claims on this daemon (the limit, --claim-max-waiting-per-agent): wait for one to answer before sending another, or claim more items per call (max_items)`,
      );
    const perToken = waitingByToken.get(caller) ?? 0;
    if (perToken >= config.claimMaxWaitingPerToken)
      throw resourceExhausted(
        `this token's agents already have ${perToken} waiting claims on this daemon (the limit, --claim-max-waiting-per-token): give each agent host a token of its own, or raise the limit`,
      );
    waitingByAgent.set(name, perAgent + 1);
    waitingByToken.set(caller, perToken + 1);
    return () => {
      const a = (waitingByAgent.get(name) ?? 1) - 1;
      if (a > 0) waitingByAgent.set(name, a);
      else waitingByAgent.delete(name);
      const t = (waitingByToken.get(caller) ?? 1) - 1;
      if (t > 0) waitingByToken.set(caller, t);
      else waitingByToken.delete(caller);
    };
  };

  /**
   * A claim's reply: the items its statement took and those handed to it, at most `max`. When the
   * call is gone by now (the client cancelled, its deadline passed, the server stops), nobody will
   * read it: the items go back to the queue at once, not when their leases run out.
   */
  const answer = async (
    name: string,
    max: number,
    parts: Handed[],
    status: KnownAgent["status"],
    completionOutcomes: ReturnType<typeof completed>,
    ctx: Pick<HandlerContext, "signal" | "values">,
    caller: Identity,
  ) => {
    const { signal } = ctx;
    if (signal.aborted) {
      await giveBack(name, parts);
      parts = [];
    }
    const { within, outside } = reports.splitOutside(parts, caller);
    await giveBack(name, outside);
    parts = within;
    // A slot is open while the claim's statement runs, so the two together may exceed what it asked
    // for: the handed items past max go back (they are plain items, so that undoes nothing else).
    let room = max;
    const over: Handed[] = [];
    parts = parts.map((p) => {
      const keep = p.rows.slice(0, Math.max(0, room));
      room -= keep.length;
      if (keep.length < p.rows.length) over.push({ rows: p.rows.slice(keep.length), dispatch: p.dispatch });
      return { rows: keep, dispatch: p.dispatch };
    });
    await giveBack(name, over);
    traceDispatches?.(ctx.values.get(callSpanKey), parts);
    for (const p of parts) queue.events.dispatched(p.rows, Number(p.dispatch.dispatchedAtNs / 1_000_000n));
    const items = parts.flatMap((p) => p.rows.map((r) => claimedItemToWire(r, p.dispatch)));
    queue.events.claimAnswered(items.length);
    return {
      items,
      status: agentStatusToWire(status),
      affinityKeys: [...new Set(parts.flatMap((p) => p.rows.flatMap((r) => (r.affinity_key ? [r.affinity_key] : []))))],
      completionOutcomes,
    };
  };

  return {
    async claim(req, ctx) {
      const name = agentName(req.name, ctx);
      const caller = callerOf(ctx);
      const tenants = limitOf(caller);
      // Applied once, by the first statement this call runs. A claim carrying them does not wait
      // unless it asks to (its outcomes then come back with whatever ends the wait).
      let completions = reports.completionsOf(reports.atMost(req.completions, "completions"), "completions");
      let completionOutcomes: ReturnType<typeof completed> = [];
      const max = Math.min(Math.max(req.maxItems, 1), config.claimMaxItems);
      const waitMs = completions.length > 0 && !req.waitWithCompletions ? 0 : Math.min(req.wait ? durationMs(req.wait) : 0, config.claimMaxWait);
      const deadline = Date.now() + waitMs;
      // Checked before anything is written: a caller limited to some tenants may not act as an agent
      // that serves others (its claim would take their items).
      assertScopeWithin(caller, name, await scopeOf(name));
      const unhold = waitMs > 0 ? holdWaiting(name, caller) : () => {};
      // One round for the call (its looks, at once or after waits, share the round's retry policy:
      // ../../queue/claim-round.ts); its slot is opened before each look and closed after each wait.
      const round = queue.claimRound(name);
      const live = () => !ctx.signal.aborted && !d.draining.aborted;
      // Items of earlier looks of this call (a "more"), and how many the next look may take.
      const carried: Handed[] = [];
      let want = max;
      try {
        for (;;) {
          const state = await d.known(name);
          if (state.status !== "active") {
            // A draining agent still reports what it finished; it just gets nothing new.
            if (completions.length > 0) completionOutcomes = completed(completions, await store.complete(name, completions, clock.nowMs(), tenants));
            queue.events.claimAnswered(0);
            return { items: [], status: agentStatusToWire(state.status), completionOutcomes };
          }
          const scope = await scopeOf(name);
          assertScopeWithin(caller, name, scope);
          round.open(scope, max);
          const parts: Handed[] = [];
          let remaining = 0;
          let next: Look["next"];
          try {
            const look = await round.look(want, completions, scope);
            if (completions.length > 0) {
              completionOutcomes = completed(completions, look.completed);
              completions = [];
            }
            if (look.claimed) parts.push(look.claimed);
            next = look.next;
            remaining = deadline - Date.now();
            if (!look.claimed && next === "wait" && remaining > 0 && live()) await round.wait(remaining, [ctx.signal, d.draining]);
          } catch (err) {
            // Items handed over meanwhile (and those of earlier looks) would otherwise wait for their leases to run out.
            const handed = await round.close();
            const back = handed ? [...carried, handed] : carried;
            if (back.length > 0)
              await giveBack(name, back).catch((e: unknown) =>
                queue.log.warn(
                  { err: e instanceof Error ? e.message : String(e), agent: name, items: back.reduce((n, h) => n + h.rows.length, 0) },
                  "could not give back items handed to a failed claim; they return when their leases expire",
                ),
              );
            throw err;
          }
          const handed = await round.close();
          if (handed) parts.push(handed);
          if (next === "again" && parts.length === 0 && live()) continue;
          if (next === "more" && live()) {
            want -= parts.reduce((n, h) => n + h.rows.length, 0);
            carried.push(...parts.splice(0));
            if (want > 0) continue;
          }
          const all = [...carried, ...parts];
          if (all.length > 0 || remaining <= 0 || !live()) return await answer(name, max, all, state.status, completionOutcomes, ctx, caller);
        }
      } finally {
        unhold();
      }
    },

    async extendLease(req, ctx) {
      const name = agentName(req.name, ctx);
      const caller = callerOf(ctx);
      const leases = reports.leasesOf(reports.batch(req.leases, "leases"), "leases");
      await assertAgentWithin(caller, name, scopeOf);
      return reports.extend(name, leases, limitOf(caller));
    },

    async complete(req, ctx) {
      const name = agentName(req.name, ctx);
      const caller = callerOf(ctx);
      const items = reports.completionsOf(reports.batch(req.items, "items"), "items");
      await assertAgentWithin(caller, name, scopeOf);
      return { outcomes: completed(items, await store.complete(name, items, clock.nowMs(), limitOf(caller))) };
    },

    async fail(req, ctx) {
      const name = agentName(req.name, ctx);
      const caller = callerOf(ctx);
      const items = reports.failuresOf(reports.batch(req.items, "items"), "items");
      await assertAgentWithin(caller, name, scopeOf);
      return { outcomes: await reports.fail(name, items, limitOf(caller)) };
    },

    async release(req, ctx) {
      const name = agentName(req.name, ctx);
      const caller = callerOf(ctx);
      const leases = reports.leasesOf(reports.batch(req.leases, "leases"), "leases");
      await assertAgentWithin(caller, name, scopeOf);
      return {
        outcomes: fencedOutcomes(
          leases.map((l) => l.id),
          await reports.release(name, leases, limitOf(caller)),
        ),
      };
    },
  };
}
