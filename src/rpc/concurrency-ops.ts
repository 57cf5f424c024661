/**
 * OpsService's concurrency-key RPCs: ListConcurrencyKeys (keys with work or a limit, their counts,
 * the limit the next dispatch is held to and where it comes from, and the prefix rules) and
 * SetConcurrencyLimit (an operator's limit on a key or a key prefix, or clearing it).
 *
 * What must stay true:
 *   - Keys carry a tenant: a token limited to tenants lists and sets within them only, and naming
 *     another tenant is PERMISSION_DENIED, as for the other tenant-scoped ops calls.
 *   - The limit reported is the store's, computed as the claim computes it; only its label is
 *     chosen here, from which of the operator's limits exists.
 *   - A change wakes waiting claims: a raised limit lets work start at once, not at their next look.
 */
import type { ServiceImpl } from "@connectrpc/connect";
import { MAX_IN_FLIGHT } from "../domain/concurrency.js";
import { invalidArgument } from "../domain/errors.js";
import type { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { ANY } from "../queue/wakeups.js";
import type { WorkQueue } from "../queue/work-queue.js";
import { assertTenant, callerOf, tenantLimit } from "./caller.js";
import type { ConcurrencyKeyStore, KeyRow } from "../store/concurrency-keys.js";
import { decodeKeyCursor, encodeKeyCursor } from "./input/page-tokens.js";
import { identifier, inRange, optionalText } from "../domain/input.js";
import { MAX_KEY_CHARS } from "../domain/names.js";

export interface ConcurrencyOpsDeps {
  queue: WorkQueue;
  keys: ConcurrencyKeyStore;
}

export function concurrencyOpsImpl(d: ConcurrencyOpsDeps): Pick<ServiceImpl<typeof OpsService>, "listConcurrencyKeys" | "setConcurrencyLimit"> {
  const { queue, keys } = d;
  return {
    async listConcurrencyKeys(req, ctx) {
      const caller = callerOf(ctx);
      const tenant = req.tenantKey ? identifier(req.tenantKey, "tenant_key") : undefined;
      if (tenant) assertTenant(caller, tenant);
      const tenants = tenantLimit(caller);
      const limit = Math.min(req.pageSize || 100, 1000);
      const rows = await keys.list({
        tenants,
        tenant,
        keyPrefix: optionalText(req.keyPrefix, "key_prefix", MAX_KEY_CHARS) ?? undefined,
        after: req.pageToken ? decodeKeyCursor(req.pageToken) : undefined,
        limit: limit + 1,
      });
      const page = rows.slice(0, limit);
      const last = page.at(-1);
      const rules = await keys.rules(tenant ? [tenant] : tenants);
      return {
        keys: page.map(keyToWire),
        nextPageToken: rows.length > limit && last ? encodeKeyCursor(last) : "",
        rules: rules.map((r) => ({ tenantKey: r.tenant_key, keyPrefix: r.key_prefix, maxInFlight: r.max_in_flight })),
      };
    },

    async setConcurrencyLimit(req, ctx) {
      const caller = callerOf(ctx);
      const tenant = identifier(req.tenantKey, "tenant_key");
      assertTenant(caller, tenant);
      const key = optionalText(req.key, "key", MAX_KEY_CHARS);
      if (!key) throw invalidArgument("key", req.prefix ? "is required (the prefix the rule applies to)" : "is required");
      const max = inRange(req.maxInFlight, "max_in_flight", 0, MAX_IN_FLIGHT);
      const maxInFlight = max === 0 ? null : max;
      await keys.setLimit({ tenant, key, prefix: req.prefix, maxInFlight, by: caller.principal, nowMs: queue.clock.nowMs() });
      queue.log.info(
        { tenant, key, prefix: req.prefix, maxInFlight, by: caller.principal },
        maxInFlight === null ? "concurrency limit cleared" : "concurrency limit set",
      );
      // Read before the wake-up, so the answer is the change's, not the claims' it lets start.
      const now = req.prefix ? undefined : keyToWire(await keys.get(tenant, key));
      // Which claims wait for the key's items is not known here (they wait by tenant and engine
      // kind, and a prefix spans keys): wake them all to look again.
      queue.ringWork([ANY]);
      return { key: now };
    },
  };
}

function keyToWire(r: KeyRow) {
  return {
    tenantKey: r.tenant_key,
    key: r.key,
    limit: r.next_limit ?? 0,
    limitSource: sourceOf(r),
    inFlight: r.in_flight,
    pending: r.pending,
  };
}

/** Where the key's limit comes from, in the order the claim looks (../domain/concurrency.ts). */
function sourceOf(r: KeyRow): string {
  if (r.next_limit === null) return "";
  if (r.key_limit !== null) return "ops";
  if (r.rule_prefix !== null) return `ops prefix ${r.rule_prefix}`;
  return "items";
}
