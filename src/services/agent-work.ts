/**
 * AgentService's work RPCs (role `agent`): long-poll claims, lease extension, fenced completion,
 * failure and release. Every batch answers per item; a stale lease token refuses that item with
 * FAILED_PRECONDITION and changes nothing about it.
 */
import { durationMs } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { newId } from "../util/ids.js";
import { invalidArgument } from "../domain/errors.js";
import type { AgentService } from "../gen/aiflow/cluster/v1/agent_pb.js";
import type { KnownAgent } from "./directives.js";
import { agentStatusToWire } from "./convert.js";
import { workKey, type QueueCore } from "./queue-core.js";
import type { ClaimedRow, Completion } from "../store/work-items.js";
import type { Handed } from "./handoff.js";
import { agentName, identifier, jsonOrNull, optionalText, withinBytes } from "./validate.js";
import { claimedItemToWire, fencedOutcomes, newDispatch } from "./work-item-wire.js";

export interface AgentWorkDeps {
  core: QueueCore;
  /** The tenants and engine kinds an agent serves, so its claims wait only for work it can take. */
  scope(name: string): Promise<{ tenants: string[]; kinds: string[] } | null>;
  /** The agent's cached status (from the directive hub), loading it when unknown. */
  known(name: string): Promise<KnownAgent>;
  draining: AbortSignal;
}

/** A claim that finds nothing re-checks this often even without a wake-up (a lost NOTIFY). */
const FALLBACK_POLL_MS = 5_000;
const MAX_BATCH = 10_000;
const SCOPE_TTL_MS = 5_000;

export function agentWorkImpl(d: AgentWorkDeps): Pick<ServiceImpl<typeof AgentService>, "claim" | "extendLease" | "complete" | "fail" | "release"> {
  const { core } = d;
  const { config, clock, store } = core;

  /** Beacon keys of an agent's claims, cached briefly (a re-registration may change its scope). */
  const scopes = new Map<string, { keys: ReadonlySet<string> | null; at: number }>();
  const claimKeys = async (name: string): Promise<ReadonlySet<string> | null> => {
    const hit = scopes.get(name);
    if (hit && Date.now() - hit.at < SCOPE_TTL_MS) return hit.keys;
    const scope = await d.scope(name);
    const keys = scope ? new Set(scope.tenants.flatMap((t) => scope.kinds.map((k) => workKey(t, k)))) : null;
    if (scopes.size > 10_000) scopes.clear();
    scopes.set(name, { keys, at: Date.now() });
    return keys;
  };

  const atMost = <T>(items: readonly T[], field: string) => {
    if (items.length > MAX_BATCH) throw invalidArgument(field, `has ${items.length} items; the limit is ${MAX_BATCH}`);
    return items;
  };
  const batch = <T>(items: readonly T[], field: string) => {
    if (items.length === 0) throw invalidArgument(field, "needs at least one item");
    return atMost(items, field);
  };
  /** Completions as the store takes them; field names the list in errors (items, completions). */
  const completionsOf = (items: readonly { workItemId: string; leaseToken: string; resultJson: string }[], field: string): Completion[] =>
    items.map((c, i) => {
      const resultJson = jsonOrNull(c.resultJson, `${field}[${i}].result_json`);
      if (resultJson) withinBytes(resultJson, `${field}[${i}].result_json`, config.payloadMaxBytes);
      return { id: identifier(c.workItemId, `${field}[${i}].work_item_id`), token: identifier(c.leaseToken, `${field}[${i}].lease_token`), resultJson };
    });
  const completed = (items: readonly Completion[], done: readonly string[]) => {
    if (done.length > 0) core.done.ring(["*"]);
    return fencedOutcomes(items.map((i) => i.id), done);
  };
  const leaseRefs = (refs: readonly { workItemId: string; leaseToken: string }[], field: string) =>
    batch(refs, field).map((r, i) => ({ id: identifier(r.workItemId, `${field}[${i}].work_item_id`), token: identifier(r.leaseToken, `${field}[${i}].lease_token`) }));

  /** Fenced items back to the queue without spending an attempt, waking claims for them; answers the ids released. */
  const release = async (name: string, leases: readonly { id: string; token: string }[]) => {
    const released = await store.release(name, leases, clock.nowMs());
    if (released.length > 0) core.work.ring(["*"]);
    return released;
  };

  /** Gives items back to the queue at once (their claim's call is gone, or they were more than it asked for). */
  const giveBack = async (name: string, parts: readonly Handed[]) => {
    const leases = parts.flatMap((p) => p.rows.map((r) => ({ id: r.id, token: p.dispatch.leaseToken })));
    if (leases.length > 0) await release(name, leases);
  };

  /**
   * A claim's reply: the items its statement took and those handed to it, at most `max`. When the
   * call is gone by now (the client cancelled, its deadline passed, the server stops), nobody will
   * read it: the items go back to the queue at once, not when their leases run out.
   */
  const answer = async (name: string, max: number, parts: Handed[], status: KnownAgent["status"], completionOutcomes: ReturnType<typeof completed>, signal: AbortSignal) => {
    if (signal.aborted) {
      await giveBack(name, parts);
      parts = [];
    }
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
    const items = parts.flatMap((p) => p.rows.map((r) => claimedItemToWire(r, p.dispatch)));
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
      // Applied once, by the first statement this call runs. A claim carrying them does not wait
      // unless it asks to (its outcomes then come back with whatever ends the wait).
      let completions = completionsOf(atMost(req.completions, "completions"), "completions");
      let completionOutcomes: ReturnType<typeof completed> = [];
      const max = Math.min(Math.max(req.maxItems, 1), config.claimMaxItems);
      const waitMs = completions.length > 0 && !req.waitWithCompletions ? 0 : Math.min(req.wait ? durationMs(req.wait) : 0, config.claimMaxWait);
      const deadline = Date.now() + waitMs;
      for (;;) {
        const state = await d.known(name);
        if (state.status !== "active") {
          // A draining agent still reports what it finished; it just gets nothing new.
          if (completions.length > 0) completionOutcomes = completed(completions, await store.complete(name, completions, clock.nowMs()));
          return { items: [], status: agentStatusToWire(state.status), completionOutcomes };
        }
        // Armed before the query, so an enqueue landing between the query and the wait still wakes
        // us; and its slot is open from here on, so the inserts meanwhile may hand it their items
        // (./handoff.ts) while its statement runs and while it waits.
        const keys = await claimKeys(name);
        const armed = core.work.arm(keys, max);
        const slot = core.handoff.open(name, keys, max, armed);
        const parts: Handed[] = [];
        let remaining = 0;
        try {
          const now = clock.nowMs();
          const dispatch = newDispatch(name, config.instanceId, now, config.leaseTtl);
          const { claimed: rows, completed: done } = await store.claim({
            agent: name,
            instance: config.instanceId,
            max,
            nowMs: now,
            leaseTtlMs: config.leaseTtl,
            affinity: { policy: config.affinityPolicy === "hold" ? "hold" : "rebind", graceMs: config.affinityGrace },
            bindingSeed: newId(now),
            leaseToken: dispatch.leaseToken,
            completions,
          });
          if (completions.length > 0) {
            completionOutcomes = completed(completions, done);
            completions = [];
          }
          if (rows.length > 0) parts.push({ rows: [...rows], dispatch });
          remaining = deadline - Date.now();
          if (rows.length === 0 && remaining > 0 && !ctx.signal.aborted && !d.draining.aborted) await armed.wait(Math.min(remaining, FALLBACK_POLL_MS), [ctx.signal, d.draining]);
        } catch (err) {
          // Items handed over meanwhile would otherwise wait for their leases to run out.
          const handed = await core.handoff.close(slot);
          if (handed)
            await giveBack(name, [handed]).catch((e: unknown) =>
              core.log.warn({ err: e instanceof Error ? e.message : String(e), agent: name, items: handed.rows.length }, "could not give back items handed to a failed claim; they return when their leases expire"),
            );
          throw err;
        } finally {
          armed.disarm();
        }
        const handed = await core.handoff.close(slot);
        if (handed) parts.push(handed);
        if (parts.length > 0 || remaining <= 0 || ctx.signal.aborted || d.draining.aborted) return await answer(name, max, parts, state.status, completionOutcomes, ctx.signal);
      }
    },

    async extendLease(req, ctx) {
      const name = agentName(req.name, ctx);
      const leases = leaseRefs(req.leases, "leases");
      const now = clock.nowMs();
      const held = await store.extend(name, leases, now, config.leaseTtl);
      return { outcomes: fencedOutcomes(leases.map((l) => l.id), held), leaseExpiresAtNs: BigInt(now + config.leaseTtl) * 1_000_000n };
    },

    async complete(req, ctx) {
      const name = agentName(req.name, ctx);
      const items = completionsOf(batch(req.items, "items"), "items");
      return { outcomes: completed(items, await store.complete(name, items, clock.nowMs())) };
    },

    async fail(req, ctx) {
      const name = agentName(req.name, ctx);
      const items = batch(req.items, "items").map((f, i) => ({
        id: identifier(f.workItemId, `items[${i}].work_item_id`),
        token: identifier(f.leaseToken, `items[${i}].lease_token`),
        error: optionalText(f.error, `items[${i}].error`, 8192) ?? "failed without a message",
        retryable: f.retryable,
        delayMs: f.retryDelay ? Math.max(0, durationMs(f.retryDelay)) : null,
      }));
      const rows = await store.fail(name, items, clock.nowMs());
      if (rows.some((r) => r.status === "failed")) core.done.ring(["*"]);
      return { outcomes: fencedOutcomes(items.map((i) => i.id), rows.map((r) => r.id)) };
    },

    async release(req, ctx) {
      const name = agentName(req.name, ctx);
      const leases = leaseRefs(req.leases, "leases");
      return { outcomes: fencedOutcomes(leases.map((l) => l.id), await release(name, leases)) };
    },
  };
}
