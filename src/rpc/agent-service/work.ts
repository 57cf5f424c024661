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
import type { WorkKit } from "./work-kit.js";
import type { AgentScope, KnownAgent } from "../../fleet/directives.js";
import { agentStatusToWire } from "./messages.js";
import type { WorkQueue } from "../../queue/work-queue.js";
import type { Handed } from "../../queue/waiting-claims.js";
import { agentName } from "../input/validate.js";
import { claimedItemToWire, fencedOutcomes } from "../work-item-messages.js";
import { newDispatch } from "../../queue/dispatch.js";
import { dispatchTracer } from "../../observability/dispatch-spans.js";
import { callSpanKey } from "../../observability/rpc-spans.js";

export interface AgentWorkDeps {
  queue: WorkQueue;
  /** The rules the unary path shares with the stream (./work-kit.ts). */
  kit: WorkKit;
  /** The agent's cached status (from the directive hub), loading it when unknown. */
  known(name: string): Promise<KnownAgent>;
  draining: AbortSignal;
}

/** Times in a row a claim that lost a race looks again at once before it waits as any other. */
const RACE_RETRIES = 3;

export function agentWorkImpl(d: AgentWorkDeps): Pick<ServiceImpl<typeof AgentService>, "claim" | "extendLease" | "complete" | "fail" | "release"> {
  const { queue } = d;
  const { config, clock, store } = queue;
  /** A span per dispatched item in its own trace; undefined while the daemon does not trace. */
  const traceDispatches = dispatchTracer();

  const { kit } = d;
  const { scopeOf, limitOf, giveBack, completed } = kit;
  const claimKeys = kit.claimKeys;

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
    const { within, outside } = kit.splitOutside(parts, caller);
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
      let completions = kit.completionsOf(kit.atMost(req.completions, "completions"), "completions");
      let completionOutcomes: ReturnType<typeof completed> = [];
      const max = Math.min(Math.max(req.maxItems, 1), config.claimMaxItems);
      const waitMs = completions.length > 0 && !req.waitWithCompletions ? 0 : Math.min(req.wait ? durationMs(req.wait) : 0, config.claimMaxWait);
      const deadline = Date.now() + waitMs;
      // Checked before anything is written: a caller limited to some tenants may not act as an agent
      // that serves others (its claim would take their items).
      assertScopeWithin(caller, name, await scopeOf(name));
      const unhold = waitMs > 0 ? holdWaiting(name, caller) : () => {};
      let raced = 0;
      let retryNow = false;
      // Items of earlier rounds of this call (see `more`), and how many the next round may take.
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
          // Armed before the query, so an enqueue landing between the query and the wait still wakes
          // us; and its slot is open from here on, so the inserts meanwhile may hand it their items
          // (../../queue/waiting-claims.ts) while its statement runs and while it waits.
          const scope = await scopeOf(name);
          assertScopeWithin(caller, name, scope);
          const keys = claimKeys(scope);
          const armed = queue.work.arm(keys, max);
          const slot = queue.waitingClaims.open(name, keys, max, armed);
          const parts: Handed[] = [];
          let remaining = 0;
          let more = false;
          try {
            const now = clock.nowMs();
            const dispatch = newDispatch(name, config.instanceId, now, config.leaseTtl);
            const { claimed: rows, completed: done, contended, heldBack, nextSlotMs } = await store.claim(kit.claimInput(name, want, now, dispatch, completions, scope));
            if (completions.length > 0) {
              completionOutcomes = completed(completions, done);
              completions = [];
            }
            if (rows.length > 0) parts.push({ rows: [...rows], dispatch });
            remaining = deadline - Date.now();
            // No timer of its own: a lost NOTIFY is covered by the daemon's one fallback re-check
            // (WorkQueue.dueTask), which rings the keys that have due items.
            // A claim that lost a race for a key's slots or the agent's resources looks again at once
            // (a few times): what it lost may be there now, and no wake-up would say so.
            retryNow = rows.length === 0 && contended && raced++ < RACE_RETRIES;
            // Rows a rate limit held back took places in the claim's batch; their key is closed now, so
            // another round at once fills those places with other work (a few rounds at most).
            more = heldBack && rows.length > 0 && rows.length < want && raced++ < RACE_RETRIES;
            if (heldBack) queue.events.rateHeld();
            // Work held back by a rate limit is pending all along, so nothing rings when its key's
            // next slot comes: a claim that found nothing looks again then (by the clock), if sooner.
            const wait = nextSlotMs === null ? remaining : Math.min(remaining, Math.max(1, nextSlotMs - clock.nowMs()));
            if (rows.length === 0 && !retryNow && remaining > 0 && !ctx.signal.aborted && !d.draining.aborted) await armed.wait(wait, [ctx.signal, d.draining]);
          } catch (err) {
            // Items handed over meanwhile (and those of earlier rounds) would otherwise wait for their leases to run out.
            const handed = await queue.waitingClaims.close(slot);
            const back = handed ? [...carried, handed] : carried;
            if (back.length > 0)
              await giveBack(name, back).catch((e: unknown) =>
                queue.log.warn({ err: e instanceof Error ? e.message : String(e), agent: name, items: back.reduce((n, h) => n + h.rows.length, 0) }, "could not give back items handed to a failed claim; they return when their leases expire"),
              );
            throw err;
          } finally {
            armed.disarm();
          }
          const handed = await queue.waitingClaims.close(slot);
          if (handed) {
            parts.push(handed);
            queue.events.handedDirect(handed.rows.length);
          }
          if (retryNow && parts.length === 0 && !ctx.signal.aborted && !d.draining.aborted) continue;
          if (more && !ctx.signal.aborted && !d.draining.aborted) {
            carried.push(...parts);
            want -= parts.reduce((n, h) => n + h.rows.length, 0);
            if (want > 0) continue;
          }
          const all = [...carried, ...parts];
          if (all.length > 0 || remaining <= 0 || ctx.signal.aborted || d.draining.aborted) return await answer(name, max, all, state.status, completionOutcomes, ctx, caller);
        }
      } finally {
        unhold();
      }
    },

    async extendLease(req, ctx) {
      const name = agentName(req.name, ctx);
      const caller = callerOf(ctx);
      const leases = kit.leasesOf(kit.batch(req.leases, "leases"), "leases");
      await assertAgentWithin(caller, name, scopeOf);
      return kit.extend(name, leases, limitOf(caller));
    },

    async complete(req, ctx) {
      const name = agentName(req.name, ctx);
      const caller = callerOf(ctx);
      const items = kit.completionsOf(kit.batch(req.items, "items"), "items");
      await assertAgentWithin(caller, name, scopeOf);
      return { outcomes: completed(items, await store.complete(name, items, clock.nowMs(), limitOf(caller))) };
    },

    async fail(req, ctx) {
      const name = agentName(req.name, ctx);
      const caller = callerOf(ctx);
      const items = kit.failuresOf(kit.batch(req.items, "items"), "items");
      await assertAgentWithin(caller, name, scopeOf);
      return { outcomes: await kit.fail(name, items, limitOf(caller)) };
    },

    async release(req, ctx) {
      const name = agentName(req.name, ctx);
      const caller = callerOf(ctx);
      const leases = kit.leasesOf(kit.batch(req.leases, "leases"), "leases");
      await assertAgentWithin(caller, name, scopeOf);
      return { outcomes: fencedOutcomes(leases.map((l) => l.id), await kit.release(name, leases, limitOf(caller))) };
    },
  };
}
