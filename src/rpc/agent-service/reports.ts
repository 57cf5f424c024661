/**
 * What the agent's two work paths share — the unary RPCs (./work.ts) and the Connect stream
 * (./stream.ts): validating reports, applying them with their events and wake-ups, giving items
 * back. One place for each, so a rule of the unary path (a report's events, a tenant-limited
 * caller's fence) is the stream's rule too. The claim itself is the queue's (../../queue/claim-round.ts).
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { AppError, invalidArgument } from "../../domain/errors.js";
import type { Identity } from "../caller.js";
import type { AgentScope } from "../../fleet/directives.js";
import type { WorkQueue } from "../../queue/work-queue.js";
import type { Handed } from "../../queue/waiting-claims.js";
import type { Completed, Completion } from "../../store/work-items.js";
import type { Release } from "../../store/work-items/fenced-writes.js";
import { delayMs, identifier, jsonOrNull, optionalText } from "../../domain/input.js";
import { fencedOutcomes } from "../work-item-messages.js";
import { agentScopeLoader } from "./registration.js";

/** Items in one report at most (a call's list, a stream message's list). */
export const MAX_BATCH = 10_000;

export type Outcomes = ReturnType<typeof fencedOutcomes>;

/** A failure as the store takes it. */
export interface FailureInput {
  id: string;
  token: string;
  error: string;
  retryable: boolean;
  delayMs: number | null;
}

type WireCompletion = { workItemId: string; leaseToken: string; resultJson: string };
type WireFailure = { workItemId: string; leaseToken: string; error: string; retryable: boolean; retryDelay?: Parameters<typeof delayMs>[0] };
type WireLease = { workItemId: string; leaseToken: string; drainDeadline?: boolean };

export type AgentReports = ReturnType<typeof agentReports>;

const isInvalidArgument = (err: unknown) =>
  (err instanceof AppError && err.kind === "invalid_argument") || (err instanceof ConnectError && err.code === Code.InvalidArgument);

/**
 * A stream message's list, validated: the items that parse, and an INVALID_ARGUMENT outcome for each
 * that does not (a unary call refuses the whole call instead; a stream carries other work and must
 * not end for one bad item). A list over MAX_BATCH is refused whole.
 */
export function perItem<W extends { workItemId: string }, T>(
  items: readonly W[],
  field: string,
  parse: (items: readonly W[], field: string, first: number) => T[],
): { valid: T[]; refused: Outcomes } {
  if (items.length > MAX_BATCH) throw invalidArgument(field, `has ${items.length} items; the limit is ${MAX_BATCH}`);
  try {
    return { valid: parse(items, field, 0), refused: [] };
  } catch (err) {
    if (!isInvalidArgument(err)) throw err;
  }
  const valid: T[] = [];
  const refused: Outcomes = [];
  items.forEach((x, i) => {
    try {
      valid.push(...parse([x], field, i));
    } catch (err) {
      if (!isInvalidArgument(err)) throw err;
      refused.push({ workItemId: x.workItemId, ok: false, code: Code.InvalidArgument, message: (err as Error).message });
    }
  });
  return { valid, refused };
}

export function agentReports(queue: WorkQueue, loadScope: (name: string) => Promise<AgentScope | null>) {
  const { config, clock, store } = queue;
  /** The agent's scope, cached by the directive hub (a re-registration drops it on every daemon). */
  const scopeOf = agentScopeLoader(queue.hub, loadScope);
  /** The tenants a caller's fenced writes are limited to (null: any), for the store's own check. */
  const limitOf = (caller: Identity) => (caller.tenants ? [...caller.tenants] : null);

  const atMost = <T>(items: readonly T[], field: string) => {
    if (items.length > MAX_BATCH) throw invalidArgument(field, `has ${items.length} items; the limit is ${MAX_BATCH}`);
    return items;
  };

  /**
   * Fenced items back to the queue without spending an attempt, waking claims for them; answers the
   * ids released. A draining agent's releases at its deadline (or marked so) count in its drain's result.
   */
  const release = async (name: string, leases: readonly Release[], tenants: readonly string[] | null = null) => {
    const released = await store.release(name, leases, clock.nowMs(), tenants);
    if (released.length > 0) queue.ringWork(["*"]);
    return released;
  };

  return {
    scopeOf,
    limitOf,
    atMost,
    release,

    batch<T>(items: readonly T[], field: string) {
      if (items.length === 0) throw invalidArgument(field, "needs at least one item");
      return atMost(items, field);
    },

    /** Completions as the store takes them; field names the list in errors (items, completions). */
    completionsOf(items: readonly WireCompletion[], field: string, first = 0): Completion[] {
      return items.map((c, j) => {
        const i = first + j;
        const resultJson = jsonOrNull(c.resultJson, `${field}[${i}].result_json`, config.payloadMaxBytes);
        return { id: identifier(c.workItemId, `${field}[${i}].work_item_id`), token: identifier(c.leaseToken, `${field}[${i}].lease_token`), resultJson };
      });
    },

    failuresOf(items: readonly WireFailure[], field: string, first = 0): FailureInput[] {
      return items.map((f, j, _, i = first + j) => ({
        id: identifier(f.workItemId, `${field}[${i}].work_item_id`),
        token: identifier(f.leaseToken, `${field}[${i}].lease_token`),
        error: optionalText(f.error, `${field}[${i}].error`, 8192) ?? "failed without a message",
        retryable: f.retryable,
        delayMs: f.retryDelay ? delayMs(f.retryDelay, `${field}[${i}].retry_delay`) : null,
      }));
    },

    /** Leases as the store takes them; drain_deadline is kept for releases (extensions ignore it). */
    leasesOf(refs: readonly WireLease[], field: string, first = 0): Release[] {
      return refs.map((r, j, _, i = first + j) => ({
        id: identifier(r.workItemId, `${field}[${i}].work_item_id`),
        token: identifier(r.leaseToken, `${field}[${i}].lease_token`),
        atDrainDeadline: r.drainDeadline === true,
      }));
    },

    /** What completing `items` did (`done` matched their leases): events, wake-ups, and one outcome per item. */
    completed(items: readonly Completion[], done: readonly Completed[]): Outcomes {
      queue.events.completed(done, items.length - done.length);
      if (done.length > 0) queue.done.ring(["*"]);
      queue.freed(done);
      return fencedOutcomes(
        items.map((i) => i.id),
        done.map((d) => d.id),
      );
    },

    async fail(name: string, items: readonly FailureInput[], tenants: readonly string[] | null): Promise<Outcomes> {
      const rows = await store.fail(name, items, clock.nowMs(), tenants);
      queue.events.failed(rows, items.length - rows.length);
      queue.freed(rows);
      if (rows.some((r) => r.status === "failed")) queue.done.ring(["*"]);
      return fencedOutcomes(
        items.map((i) => i.id),
        rows.map((r) => r.id),
      );
    },

    async extend(name: string, leases: readonly { id: string; token: string }[], tenants: readonly string[] | null) {
      const now = clock.nowMs();
      const held = await store.extend(name, leases, now, config.leaseTtl, tenants);
      return {
        outcomes: fencedOutcomes(
          leases.map((l) => l.id),
          held,
        ),
        leaseExpiresAtNs: BigInt(now + config.leaseTtl) * 1_000_000n,
      };
    },

    /** Gives items back to the queue at once (their claim's call is gone, or they were more than it asked for). */
    async giveBack(name: string, parts: readonly Handed[]): Promise<void> {
      const leases = parts.flatMap((p) => p.rows.map((r) => ({ id: r.id, token: p.dispatch.leaseToken })));
      if (leases.length > 0) await release(name, leases);
    },

    /**
     * The parts a tenant-limited caller may not have, and the rest. The caller was checked against
     * the agent's scope, but a registration on another daemon may have changed the scope since: such
     * a caller never gets an item outside its tenants.
     */
    splitOutside(parts: readonly Handed[], caller: Identity): { within: Handed[]; outside: Handed[] } {
      if (!caller.tenants) return { within: [...parts], outside: [] };
      const limit = caller.tenants;
      const outside = parts.map((p) => ({ rows: p.rows.filter((r) => !limit.has(r.tenant_key)), dispatch: p.dispatch })).filter((p) => p.rows.length > 0);
      if (outside.length === 0) return { within: [...parts], outside };
      return { within: parts.map((p) => ({ rows: p.rows.filter((r) => limit.has(r.tenant_key)), dispatch: p.dispatch })), outside };
    },
  };
}
