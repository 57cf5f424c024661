/**
 * OpsService's fair-share and rate-limit RPCs: ListTenants (each tenant's effective weight, where it
 * comes from, pending and dispatched), SetTenantWeight (an operator's weight, or clearing it),
 * ListRateLimits (the operators' limits and the keys' state, with the limit that applies to each)
 * and SetRateLimit (an operator's limit on a key or a key prefix, or clearing it).
 *
 * What must stay true:
 *   - Tenants, and rate limit keys, carry a tenant: a token limited to tenants lists and sets within
 *     them only, and naming another tenant is PERMISSION_DENIED, as for the concurrency-key calls.
 *   - Values are checked against the domain's bounds (../domain/fair-share.ts, rate-limits.ts)
 *     before anything is written: INVALID_ARGUMENT naming the field.
 *   - The weight, and the limit, reported are the store's, computed as the enqueue and the claim
 *     compute them; only their labels are chosen here.
 *   - A change wakes waiting claims: a raised weight or limit lets work go at once, not at their
 *     next look.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Duration, DurationSchema, TimestampSchema } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { invalidArgument } from "../domain/errors.js";
import { weightProblem } from "../domain/fair-share.js";
import { MAX_RATE_BURST, MAX_RATE_COUNT, MAX_RATE_INTERVAL_MS, MIN_RATE_INTERVAL_MS } from "../domain/rate-limits.js";
import type { OpsService, RateLimitKeySchema, RateLimitRuleSchema, TenantSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { ANY } from "../queue/wakeups.js";
import type { WorkQueue } from "../queue/work-queue.js";
import { assertTenant, callerOf, tenantLimit } from "./caller.js";
import type { KeyStateRow, RateLimitStore, RuleRow } from "../store/rate-limits.js";
import { sourceOf, type TenantRow, type TenantShareStore } from "../store/tenant-shares.js";
import { decodeKeyCursor, encodeKeyCursor } from "./input/page-tokens.js";
import { identifier, inRange, optionalText } from "../domain/input.js";
import { MAX_KEY_CHARS } from "../domain/names.js";

export interface FairShareOpsDeps {
  queue: WorkQueue;
  tenants: TenantShareStore;
  limits: RateLimitStore;
}

type Methods = "listTenants" | "setTenantWeight" | "listRateLimits" | "setRateLimit";

export function fairShareOpsImpl(d: FairShareOpsDeps): Pick<ServiceImpl<typeof OpsService>, Methods> {
  const { queue, tenants, limits } = d;
  const configured = () => queue.config.tenantWeights;
  return {
    async listTenants(req, ctx) {
      const caller = callerOf(ctx);
      const tenant = req.tenantKey ? identifier(req.tenantKey, "tenant_key") : undefined;
      if (tenant) assertTenant(caller, tenant);
      const rows = await tenants.list({ tenants: tenantLimit(caller), tenant, configured: configured() });
      return { tenants: rows.map(tenantToWire) };
    },

    async setTenantWeight(req, ctx) {
      const caller = callerOf(ctx);
      const tenant = identifier(req.tenantKey, "tenant_key");
      assertTenant(caller, tenant);
      let weight: number | null = null;
      if (req.clear) {
        if (req.weight !== 0) throw invalidArgument("weight", "is set with clear (clear drops the operator's weight)");
      } else {
        const problem = weightProblem(req.weight);
        if (problem) throw invalidArgument("weight", `${req.weight} ${problem}`);
        weight = req.weight;
      }
      const changed = await tenants.setWeight({ tenant, weight, by: caller.principal, nowMs: queue.clock.nowMs(), configured: configured() });
      queue.log.info(
        { tenant, weight, from: changed.from, to: changed.to, respaced: changed.respaced, by: caller.principal },
        weight === null ? "tenant weight cleared" : "tenant weight set",
      );
      // Read before the wake-up, so the answer is the change's, not the claims' it lets start.
      const [row] = await tenants.list({ tenant, configured: configured() });
      // Turns changed for every claim that serves the tenant among others: wake them all to look again.
      queue.ringWork([ANY]);
      return { tenant: row && tenantToWire(row) };
    },

    async listRateLimits(req, ctx) {
      const caller = callerOf(ctx);
      const tenant = req.tenantKey ? identifier(req.tenantKey, "tenant_key") : undefined;
      if (tenant) assertTenant(caller, tenant);
      const keyPrefix = optionalText(req.keyPrefix, "key_prefix", MAX_KEY_CHARS) ?? undefined;
      const limit = Math.min(req.pageSize || 100, 1000);
      const scope = { tenants: tenantLimit(caller), tenant, keyPrefix };
      const rows = await limits.list({ ...scope, after: req.pageToken ? decodeKeyCursor(req.pageToken) : undefined, limit: limit + 1 });
      const page = rows.slice(0, limit);
      const last = page.at(-1);
      const rules = await limits.rules(scope);
      return {
        rules: rules.map(ruleToWire),
        keys: page.map(keyToWire),
        nextPageToken: rows.length > limit && last ? encodeKeyCursor(last) : "",
      };
    },

    async setRateLimit(req, ctx) {
      const caller = callerOf(ctx);
      const tenant = identifier(req.tenantKey, "tenant_key");
      assertTenant(caller, tenant);
      const key = optionalText(req.key, "key", MAX_KEY_CHARS);
      if (!key) throw invalidArgument("key", req.prefix ? "is required (the prefix the limit applies to)" : "is required");
      const target = { tenant, key, prefix: req.prefix, by: caller.principal, nowMs: queue.clock.nowMs() };
      let rule: { count: number; intervalNs: bigint; burst: number } | null = null;
      if (req.clear) {
        if (req.count !== 0) throw invalidArgument("count", "is set with clear (clear removes the limit)");
        if (req.interval) throw invalidArgument("interval", "is set with clear (clear removes the limit)");
        if (req.burst !== 0) throw invalidArgument("burst", "is set with clear (clear removes the limit)");
        await limits.clear(target);
      } else {
        rule = {
          count: inRange(req.count, "count", 1, MAX_RATE_COUNT),
          intervalNs: intervalNs(req.interval),
          burst: req.burst === 0 ? 1 : inRange(req.burst, "burst", 1, MAX_RATE_BURST),
        };
        await limits.set({ ...target, ...rule });
      }
      queue.log.info(
        { tenant, key, prefix: req.prefix, count: rule?.count, intervalNs: rule && String(rule.intervalNs), burst: rule?.burst, by: caller.principal },
        rule ? "rate limit set" : "rate limit cleared",
      );
      // Read before the wake-up, so the answer is the change's, not the claims' it lets start.
      const now = req.prefix ? undefined : keyToWire(await limits.get(tenant, key));
      // Which claims wait for the keys' items is not known here (they wait by tenant and engine
      // kind, and a prefix spans keys): wake them all to look again.
      queue.ringWork([ANY]);
      return {
        rule: rule
          ? ruleToWire({ tenant_key: tenant, key, prefix: req.prefix, limit_count: rule.count, interval_ns: rule.intervalNs, burst: rule.burst })
          : undefined,
        key: now,
      };
    },
  };
}

/** A limit's interval in nanoseconds, within the domain's bounds. */
function intervalNs(d: Duration | undefined): bigint {
  if (!d) throw invalidArgument("interval", "is required (the window the count applies to)");
  const ns = d.seconds * 1_000_000_000n + BigInt(d.nanos);
  const ms = Number(ns) / 1e6;
  if (!(ms >= MIN_RATE_INTERVAL_MS && ms <= MAX_RATE_INTERVAL_MS))
    throw invalidArgument("interval", `${ms} ms is outside ${MIN_RATE_INTERVAL_MS} ms..${MAX_RATE_INTERVAL_MS} ms (7 days)`);
  return ns;
}

const durationOfNs = (ns: bigint): MessageInitShape<typeof DurationSchema> => ({
  seconds: ns / 1_000_000_000n,
  nanos: Number(ns % 1_000_000_000n),
});

/** Epoch nanoseconds (a float8 column) as a Timestamp. */
function timestampOfNs(ns: number): MessageInitShape<typeof TimestampSchema> {
  const seconds = Math.floor(ns / 1e9);
  const nanos = Math.min(999_999_999, Math.max(0, Math.round(ns - seconds * 1e9)));
  return { seconds: BigInt(seconds), nanos };
}

function tenantToWire(r: TenantRow): MessageInitShape<typeof TenantSchema> {
  return { tenantKey: r.tenant_key, weight: r.weight, weightSource: sourceOf(r), pending: r.pending, dispatched: r.dispatched };
}

function ruleToWire(r: RuleRow): MessageInitShape<typeof RateLimitRuleSchema> {
  return { tenantKey: r.tenant_key, key: r.key, prefix: r.prefix, count: r.limit_count, interval: durationOfNs(r.interval_ns), burst: r.burst };
}

function keyToWire(r: KeyStateRow): MessageInitShape<typeof RateLimitKeySchema> {
  const limit =
    r.rule_key === null || r.limit_count === null || r.interval_ns === null || r.burst === null
      ? undefined
      : ruleToWire({
          tenant_key: r.tenant_key,
          key: r.rule_key,
          prefix: r.rule_prefix ?? false,
          limit_count: r.limit_count,
          interval_ns: r.interval_ns,
          burst: r.burst,
        });
  return { tenantKey: r.tenant_key, key: r.key, nextSlotAt: r.open_ns === null ? undefined : timestampOfNs(r.open_ns), limit };
}
