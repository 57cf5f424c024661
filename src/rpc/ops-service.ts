/**
 * OpsService (role `ops`): the fleet, drains for rolling deploys, queue visibility and dead-letter
 * redrive. A drain is state on the agent row (status + metadata.drain), so every daemon enforces
 * it: claims need ACTIVE, and the drain-deadline task on any daemon gives back what is left.
 *
 * An ops token limited to some tenants sees and acts on their rows only: items and queue stats of
 * those tenants, and agents all of whose tenants are among them (an agent serving any other tenant
 * is PERMISSION_DENIED; an item of another tenant is NOT_FOUND, so ids do not reveal other tenants'
 * work). Affinity bindings carry no tenant and may route any tenant's work, so they are fleet-wide:
 * a limited token is refused them. Concurrency keys do carry one (./concurrency-ops.ts), and so do
 * tenants' fair-share weights and rate limits (./fair-share-ops.ts).
 */
import { durationFromMs, timestampFromMs } from "@bufbuild/protobuf/wkt";
import { z } from "zod";
import { decodeCursor, encodeCursor } from "./input/page-tokens.js";
import type { ServiceImpl } from "@connectrpc/connect";
import type { AuditLog } from "../audit.js";
import { failedPrecondition, invalidArgument, notFound } from "../domain/errors.js";
import type { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { assertAgentTenants, assertTenant, callerOf, tenantLimit, tenantsOutside, type Identity } from "./caller.js";
import type { AffinityBindingStore, BindingRow } from "../store/affinity-bindings.js";
import type { ConcurrencyKeyStore } from "../store/concurrency-keys.js";
import type { RateLimitStore } from "../store/rate-limits.js";
import type { TenantShareStore } from "../store/tenant-shares.js";
import type { AgentOpsStore, AgentStatus, AgentStore, AgentWithLoad } from "../store/agents.js";
import type { WorkItemStatsStore } from "../store/work-item-stats.js";
import type { WorkItemStore } from "../store/work-items.js";
import { compareVersions, notAVersion, parseVersion, type Version } from "../util/semver.js";
import { agentStatusFromWire } from "./agent-service/messages.js";
import { agentSummary } from "./ops-messages.js";
import type { MaintenanceTask } from "../maintenance.js";
import type { WorkQueue } from "../queue/work-queue.js";
import { listItemsPage } from "./queue-service.js";
import type { Requirements } from "../domain/resources.js";
import { concurrencyOpsImpl } from "./concurrency-ops.js";
import { fairShareOpsImpl } from "./fair-share-ops.js";
import { delayMs, identifier, optionalText } from "../domain/input.js";
import { itemStatusToWire, itemsToWire, requirementsToWire, workItemToWire } from "./work-item-messages.js";
import { FleetCapacity } from "../fleet/unplaceable-work-sweep.js";
import { MAX_KEY_CHARS } from "../domain/names.js";

export interface OpsDeps {
  queue: WorkQueue;
  agentOps: AgentOpsStore;
  stats: WorkItemStatsStore;
  audit: AuditLog;
  bindings: AffinityBindingStore;
  concurrencyKeys: ConcurrencyKeyStore;
  tenantShares: TenantShareStore;
  rateLimits: RateLimitStore;
  /** The registry, read for what agents could ever run (unplaceable items). */
  agents: AgentStore;
}

const tenantsOfRow = (r: AgentWithLoad): string[] => {
  const t = (r.metadata as { tenants?: unknown } | null)?.tenants;
  return Array.isArray(t) ? t.filter((x): x is string => typeof x === "string") : [];
};
const withinLimit = (caller: Identity, r: AgentWithLoad) => tenantsOutside(caller, tenantsOfRow(r)).length === 0;

/** The tenants a tenant-scoped ops read covers: the named one (within the limit), else the limit's (undefined: every tenant). */
function tenantScope(caller: Identity, raw: string): string[] | undefined {
  if (raw) {
    const tenant = identifier(raw, "tenant_key");
    assertTenant(caller, tenant);
    return [tenant];
  }
  return tenantLimit(caller);
}

const tagsOf = (tags: Record<string, string>, field: string) => {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(tags)) out[identifier(k, `${field} key`)] = v;
  return out;
};

/** The selector's version_below, refused unless it is a version (../util/semver.ts): a guess drains the wrong agents. */
function selectorVersion(text: string): Version {
  const v = parseVersion(text);
  if (!v) throw invalidArgument("selector.version_below", notAVersion(text));
  return v;
}

export function opsServiceImpl(d: OpsDeps): ServiceImpl<typeof OpsService> {
  const { queue, agentOps } = d;
  const { clock, hub, store } = queue;

  const summaries = async (names: readonly string[]) => {
    const rows = await agentOps.list({ statuses: [], tags: {}, names: [...names], includeRemoved: false });
    const now = clock.nowMs();
    return rows.map((r) => agentSummary(r, now));
  };

  /** The agent's row, refused (PERMISSION_DENIED) to a token limited to other tenants; NOT_FOUND when there is none. */
  const agentFor = async (caller: Identity, name: string) => {
    const [row] = await agentOps.list({ statuses: [], tags: {}, names: [name], includeRemoved: false });
    if (!row) throw notFound(`agent '${name}' not found`);
    assertAgentTenants(caller, row.name, tenantsOfRow(row));
    return row;
  };

  /** Groups of pending items no agent could ever run, at most 100, each with why (../fleet/unplaceable-work-sweep.ts). */
  const unplaceableGroups = async (scope: string[] | null, now: number) => {
    const groups = await d.stats.requirementGroups(scope, 1000);
    if (groups.length === 0) return [];
    const fleet = await FleetCapacity.read(d.agents);
    return groups
      .flatMap((g) => {
        const reason = fleet.reason(g);
        return reason === null
          ? []
          : [
              {
                tenantKey: g.tenant_key,
                engineKind: g.engine_kind,
                requirements: requirementsToWire(g.requirements as Requirements),
                count: BigInt(g.n),
                reason,
                oldestAge: durationFromMs(Math.max(0, now - g.oldest)),
              },
            ];
      })
      .slice(0, 100);
  };

  const statusDirective = (status: AgentStatus, reason: string, deadline: number | null) => ({
    kind: "status" as const,
    status,
    reason,
    drainDeadline: deadline,
  });

  return {
    ...concurrencyOpsImpl({ queue, keys: d.concurrencyKeys }),
    ...fairShareOpsImpl({ queue, tenants: d.tenantShares, limits: d.rateLimits }),

    async listAgents(req, ctx) {
      const caller = callerOf(ctx);
      const statuses = req.statuses.map((s, i) => {
        const v = agentStatusFromWire(s);
        if (!v) throw invalidArgument(`statuses[${i}]`, `unknown status ${s}`);
        return v;
      });
      const rows = await agentOps.list({
        statuses,
        tags: tagsOf(req.tags, "tags"),
        version: optionalText(req.version, "version", 128) ?? undefined,
        includeRemoved: req.includeRemoved,
      });
      const now = clock.nowMs();
      return { agents: rows.filter((r) => withinLimit(caller, r)).map((r) => agentSummary(r, now)) };
    },

    async getAgent(req, ctx) {
      const name = identifier(req.name, "name");
      const agent = agentSummary(await agentFor(callerOf(ctx), name), clock.nowMs());
      const dispatched = await d.stats.dispatchedTo(name);
      return { agent, dispatched: dispatched.map((r) => workItemToWire(r)), affinityKeys: [...(await d.bindings.keysOf(name))] };
    },

    async drainAgent(req, ctx) {
      const caller = callerOf(ctx);
      const reason = optionalText(req.reason, "reason", 1024) ?? "drained by an operator";
      const now = clock.nowMs();
      const deadline = req.deadline ? now + delayMs(req.deadline, "deadline") : null;
      let names: string[];
      const notComparable: string[] = [];
      if (req.name) {
        names = [(await agentFor(caller, identifier(req.name, "name"))).name];
      } else {
        const tags = tagsOf(req.selector?.tags ?? {}, "selector.tags");
        const belowText = optionalText(req.selector?.versionBelow ?? "", "selector.version_below", 128);
        if (Object.keys(tags).length === 0 && !belowText) throw invalidArgument("name", "give an agent name or a selector (tags or version_below)");
        const below = belowText ? selectorVersion(belowText) : null;
        const candidates = await agentOps.list({ statuses: ["active", "draining"], tags, includeRemoved: false });
        names = [];
        // A limited token's selector drains only the agents within its tenants.
        for (const c of candidates.filter((c) => withinLimit(caller, c))) {
          if (below) {
            // An agent whose version is not a version is never "below" anything: left out, and named.
            const v = c.agentversion === null ? null : parseVersion(c.agentversion);
            if (!v) {
              notComparable.push(c.name);
              continue;
            }
            if (compareVersions(v, below) >= 0) continue;
          }
          names.push(c.name);
        }
      }
      // A dry run stops here: the same checks and refusals, nothing written or told.
      if (req.dryRun) return { agents: await summaries(names), versionNotComparable: notComparable };
      const drained = names.length === 0 ? [] : await agentOps.startDrain(names, { reason, deadline, by: caller.principal }, now);
      if (req.name && drained.length === 0) throw notFound(`agent '${names[0]}' not found`);
      for (const a of drained) {
        d.audit.record({ table: "agent", action: "update", ids: [a.id], fields: ["status", "metadata"], by: caller.principal, at: now });
        // An inactive agent stays inactive (it comes back draining when it registers): telling it
        // DRAINING would make this daemon's cache answer its heartbeats DRAINING, not "register again".
        await hub.publish(a.name, a.status === "draining" ? statusDirective("draining", reason, deadline) : statusDirective(a.status, reason, null));
      }
      return { agents: await summaries(drained.map((a) => a.name)), versionNotComparable: notComparable };
    },

    async undrainAgent(req, ctx) {
      const caller = callerOf(ctx);
      const name = identifier(req.name, "name");
      await agentFor(caller, name);
      const now = clock.nowMs();
      const row = await agentOps.undrain(name);
      if (!row) throw notFound(`agent '${name}' not found`);
      d.audit.record({ table: "agent", action: "update", ids: [row.id], fields: ["status", "metadata"], by: caller.principal, at: now });
      await hub.publish(name, statusDirective(row.status, "undrained", null));
      const [agent] = await summaries([name]);
      return { agent };
    },

    async removeAgent(req, ctx) {
      const caller = callerOf(ctx);
      const name = identifier(req.name, "name");
      const agent = await agentFor(caller, name);
      if (agent.in_flight && !req.force)
        throw failedPrecondition(`agent '${name}' holds ${agent.in_flight} item(s); drain it first, or remove with force to give them back`);
      const now = clock.nowMs();
      // Removed first, so the agent cannot claim between the release and the removal.
      const row = await agentOps.remove(name, now, caller.principal);
      const released = await store.releaseAgent(name, now, caller.principal, `agent '${name}' removed`);
      queue.events.requeued(released, "released");
      queue.freed(released);
      await queue.revoke(released, "agent removed");
      if (released.length > 0) queue.ringWork(["*"]);
      if (row)
        d.audit.record({
          table: "agent",
          action: "delete",
          ids: [row.id],
          fields: ["status", "deletedby", "deletedon", "updatedby", "updatedon"],
          by: caller.principal,
          at: now,
        });
      hub.forget(name);
      await hub.publish(name, statusDirective("inactive", "removed", null));
      return { released: released.length };
    },

    async queueStats(req, ctx) {
      const caller = callerOf(ctx);
      const tenant = req.tenantKey ? identifier(req.tenantKey, "tenant_key") : null;
      if (tenant) assertTenant(caller, tenant);
      const now = clock.nowMs();
      const scope = tenant ? [tenant] : caller.tenants ? [...caller.tenants] : null;
      const s = await d.stats.stats(scope, now);
      const unplaceable = await unplaceableGroups(scope, now);
      const unserved = await d.stats.unservedGroups(scope, now, 100);
      const total = (status: string) => s.depth.filter((r) => r.status === status).reduce((n, r) => n + r.n, 0n);
      return {
        depth: s.depth.map((r) => ({ tenantKey: r.tenant_key, engineKind: r.engine_kind, status: itemStatusToWire(r.status), count: r.n })),
        oldestPendingAge: durationFromMs(s.oldestPendingMs === null ? 0 : Math.max(0, now - s.oldestPendingMs)),
        dispatchedPerSecond: s.dispatchedLastMinute / 60,
        completedPerSecond: s.completedLastMinute / 60,
        deadLetters: total("failed"),
        pending: total("pending"),
        dispatched: total("dispatched"),
        unplaceable,
        unserved: unserved.map((g) => ({
          tenantKey: g.tenant_key,
          engineKind: g.engine_kind,
          count: BigInt(g.n),
          oldestAge: durationFromMs(Math.max(0, now - g.oldest)),
          agentsNotActive: g.not_active,
        })),
        dispatchWaitP50: s.waitP50Ms === null ? undefined : microsDuration(s.waitP50Ms),
        dispatchWaitP99: s.waitP99Ms === null ? undefined : microsDuration(s.waitP99Ms),
      };
    },

    async listItems(req, ctx) {
      return listItemsPage(store, d.agents, tenantScope(callerOf(ctx), req.tenantKey), req);
    },

    async getItem(req, ctx) {
      const caller = callerOf(ctx);
      const id = identifier(req.id, "id");
      const row = await store.get(null, id);
      // Another tenant's item answers as a missing one: its id tells a limited token nothing.
      if (!row || (caller.tenants && !caller.tenants.has(row.tenant_key))) throw notFound(`no work item '${id}'`);
      const counts = await store.childCounts(row.tenant_key, id);
      return { item: (await itemsToWire(d.agents, [row]))[0], children: Object.values(counts).some((n) => n > 0) ? counts : undefined };
    },

    async cancelItems(req, ctx) {
      const caller = callerOf(ctx);
      const tenant = identifier(req.tenantKey, "tenant_key");
      assertTenant(caller, tenant);
      return { cancelledIds: await queue.cancel(tenant, req, caller.principal) };
    },

    async listBindings(req, ctx) {
      const limit = Math.min(req.pageSize || 100, 1000);
      const rows = await d.bindings.list({
        tenants: tenantScope(callerOf(ctx), req.tenantKey),
        keyPrefix: optionalText(req.keyPrefix, "key_prefix", MAX_KEY_CHARS) ?? undefined,
        agent: req.agentId ? identifier(req.agentId, "agent_id") : undefined,
        after: req.pageToken ? decodeCursor(req.pageToken, bindingCursor) : undefined,
        limit: limit + 1,
      });
      const page = rows.slice(0, limit);
      const last = page.at(-1);
      return { bindings: page.map(bindingToWire), nextPageToken: rows.length > limit && last ? encodeCursor({ createdon: last.createdon, id: last.id }) : "" };
    },

    async unbind(req, ctx) {
      const key = affinityKey(req.affinityKey);
      await d.bindings.unbind(await bindingTenant(d.bindings, callerOf(ctx), req.tenantKey, key), key);
      return {};
    },

    async rebind(req, ctx) {
      const caller = callerOf(ctx);
      const key = affinityKey(req.affinityKey);
      const tenant = await bindingTenant(d.bindings, caller, req.tenantKey, key);
      const row = await d.bindings.rebind(tenant, key, identifier(req.agentId, "agent_id"), clock.nowMs(), caller.principal);
      queue.ringWork(["*"]);
      return { binding: bindingToWire(row) };
    },

    async redriveItems(req, ctx) {
      const caller = callerOf(ctx);
      const tenant = req.tenantKey ? identifier(req.tenantKey, "tenant_key") : null;
      if (tenant) assertTenant(caller, tenant);
      const target = { ids: req.ids.map((id, i) => identifier(id, `ids[${i}]`)), runId: req.runId ? identifier(req.runId, "run_id") : null, all: req.all };
      if (!target.all && target.ids.length === 0 && !target.runId) throw invalidArgument("ids", "name dead letters, a run_id, or all");
      // Without a tenant, a limited token redrives its own tenants' dead letters, one statement each.
      const scopes: (string | null)[] = tenant ? [tenant] : caller.tenants ? [...caller.tenants] : [null];
      const ids: string[] = [];
      for (const t of scopes) ids.push(...(await store.redrive(t, target, clock.nowMs(), caller.principal)));
      if (ids.length > 0) queue.ringWork(["*"]);
      return { redrivenIds: [...ids] };
    },
  };
}

/** Runs work on one transaction with queue and registry stores bound to it. */
export type ReleaseTransaction = <T>(fn: (store: WorkItemStore, ops: AgentOpsStore) => Promise<T>) => Promise<T>;

const bindingCursor = z.object({ createdon: z.number(), id: z.string() });

const affinityKey = (raw: string) => {
  const key = optionalText(raw, "affinity_key", MAX_KEY_CHARS);
  if (!key) throw invalidArgument("affinity_key", "is required");
  return key;
};

/**
 * The tenant of the binding an Unbind or Rebind names: the one it names (within the token's limit),
 * else the one tenant (of the token's) in which the key is bound, so that a request from before
 * bindings had tenants still works where it can only mean one binding. A key bound in several is
 * refused rather than guessed at; one bound in none is NOT_FOUND.
 */
async function bindingTenant(bindings: AffinityBindingStore, caller: Identity, raw: string, key: string): Promise<string> {
  if (raw) {
    const tenant = identifier(raw, "tenant_key");
    assertTenant(caller, tenant);
    return tenant;
  }
  const tenants = await bindings.tenantsOf(key, tenantLimit(caller));
  if (tenants.length === 1) return tenants[0]!;
  if (tenants.length === 0) throw notFound(`no binding for affinity key '${key}'`);
  throw invalidArgument("tenant_key", `is required: affinity key '${key}' is bound in tenants ${tenants.join(", ")}`);
}

function bindingToWire(b: BindingRow) {
  return {
    id: b.id,
    tenantKey: b.tenant_key,
    affinityKey: b.affinity_key,
    agentId: b.agent_id,
    createdOn: timestampFromMs(b.createdon),
    updatedOn: b.updatedon === null ? undefined : timestampFromMs(b.updatedon),
  };
}

/**
 * At a drain's deadline, what the agent still holds goes back to the queue without spending retries.
 * The release and its count in the drain's progress commit together: nobody ever sees the work gone
 * but not yet counted as released (a `drain --wait` would call that a clean drain).
 */
export function drainDeadlineTask(queue: WorkQueue, agentOps: AgentOpsStore, inTransaction: ReleaseTransaction): MaintenanceTask {
  return {
    name: "drain-deadline",
    async run(now) {
      for (const { name } of await agentOps.drainsPastDeadline(now)) {
        const rows = await inTransaction(async (store, ops) => {
          const released = await store.releaseAgent(name, now, "drain-deadline", `drain deadline of agent '${name}' passed`);
          if (released.length > 0) await ops.addReleasedAtDeadline(name, released.length);
          return released;
        });
        queue.events.requeued(rows, "released");
        queue.freed(rows);
        if (rows.length === 0) continue;
        queue.log.warn({ agent: name, items: rows.length }, "drain deadline passed: work given back to the queue");
        await queue.revoke(rows, "drain deadline passed");
        queue.ringWork(["*"]);
      }
    },
  };
}

/** A duration of `ms` (fractional), to the microsecond: durationFromMs wants whole milliseconds' worth of nanos. */
function microsDuration(ms: number): { seconds: bigint; nanos: number } {
  const us = Math.max(0, Math.round(ms * 1000));
  return { seconds: BigInt(Math.floor(us / 1_000_000)), nanos: (us % 1_000_000) * 1000 };
}
