/**
 * QueueService (role `engine`, tenant-scoped): enqueue, read back, wait for, and cancel work.
 */
import { durationMs } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { invalidArgument, notFound } from "../domain/errors.js";
import type { ListItemsRequest, QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { assertTenant, callerOf } from "./caller.js";
import { WorkItemStore, type ItemStatus, type NewItem } from "../store/work-items.js";
import type { WorkQueue } from "../queue/work-queue.js";
import { workKey } from "../queue/work-keys.js";
import { identifier, optionalText } from "../domain/input.js";
import { itemStatusFromWire, itemsToWire, TERMINAL } from "./work-item-messages.js";
import type { AgentStore } from "../store/agents.js";
import { z } from "zod";
import { decodeCursor, encodeCursor } from "./input/page-tokens.js";
import { handedTraceparent } from "../observability/rpc-spans.js";
import { newItem } from "../queue/new-item.js";
import { enqueueQuota } from "../queue/enqueue-quota.js";

/** A ListItems page token: the last item's sort key. Its priority is an int4 column's, so a forged one past int4 is refused here, not by Postgres as INTERNAL. */
const listCursor = z.object({
  priority: z
    .number()
    .int()
    .min(-(2 ** 31))
    .max(2 ** 31 - 1),
  createdon: z.number(),
  id: z.string(),
});

const MAX_WAIT_MS = 60_000;
/** Items one Wait may name: its reply carries each of them. */
const MAX_WAIT_IDS = 1_000;
/**
 * The payload and result bytes of one ListItems page. Stock gRPC clients refuse replies over 4 MiB
 * by default; a page stops before this (after its first item, however large) and says more follow.
 */
export const LIST_PAGE_BYTES = 3 * 1024 * 1024;

export function queueServiceImpl(queue: WorkQueue, agents: AgentStore, draining: AbortSignal): ServiceImpl<typeof QueueService> {
  const { store, clock, config } = queue;

  const tenantOf = (raw: string, ctx: Parameters<ServiceImpl<typeof QueueService>["getItem"]>[1]) => {
    const tenant = identifier(raw, "tenant_key");
    assertTenant(callerOf(ctx), tenant);
    return tenant;
  };

  return {
    async enqueue(req, ctx) {
      const tenant = tenantOf(req.tenantKey, ctx);
      const caller = callerOf(ctx);
      if (req.items.length === 0) throw invalidArgument("items", "needs at least one item");
      const quota = enqueueQuota(queue);
      quota.checkCall(req.items.length, "items");
      const now = clock.nowMs();
      const items = req.items.map((it, i) => newItem(it, i, now, config));
      // Valid items only spend the tenant's rate; they are admitted before anything is written.
      quota.admit(tenant, items.length, "items");
      const parents = [...new Set(items.map((i) => i.parentId).filter((p): p is string => p !== null))];
      if (parents.length > 0) {
        const found = await store.find(tenant, parents, null);
        const missing = parents.filter((p) => !found.some((f) => f.id === p));
        if (missing.length > 0) throw invalidArgument("parent_work_item_id", `no item '${missing[0]}' in tenant '${tenant}'`);
      }
      const engineId = optionalText(req.engineId, "engine_id", 256) ?? caller.principal;
      // Every item of the call joins its trace: each attempt's handler span is a child of this context.
      const results = await queue.enqueuer.submit(WorkItemStore.rows(tenant, engineId, items, now, caller.principal, handedTraceparent(ctx)));
      // Items handed to a waiting claim are taken; the rest wake claims.
      wakeClaims(
        queue,
        tenant,
        items.filter((_, i) => !results[i]!.claimed),
      );
      return { results: results.map((r) => ({ id: r.id, existing: r.existing })) };
    },

    async getItem(req, ctx) {
      const tenant = tenantOf(req.tenantKey, ctx);
      const id = identifier(req.id, "id");
      const row = await store.get(tenant, id);
      if (!row) throw notFound(`no work item '${id}' in tenant '${tenant}'`);
      const counts = await store.childCounts(tenant, id);
      const hasChildren = Object.values(counts).some((n) => n > 0);
      return { item: (await itemsToWire(agents, [row]))[0], children: hasChildren ? counts : undefined };
    },

    async listItems(req, ctx) {
      return listItemsPage(store, agents, [tenantOf(req.tenantKey, ctx)], req);
    },

    async wait(req, ctx) {
      const tenant = tenantOf(req.tenantKey, ctx);
      if (req.ids.length > MAX_WAIT_IDS)
        throw invalidArgument("ids", `names ${req.ids.length} items; the limit is ${MAX_WAIT_IDS} (wait for a run_id instead, or in parts)`);
      const ids = req.ids.map((id, i) => identifier(id, `ids[${i}]`));
      const runId = req.runId ? identifier(req.runId, "run_id") : null;
      if (ids.length === 0 && !runId) throw invalidArgument("ids", "name items or a run_id to wait for");
      // Real time, not the clock: the wait sleeps on real timers, and a deadline on a clock that does
      // not move (a test's) would never pass.
      const deadline = Date.now() + Math.min(req.timeout ? durationMs(req.timeout) : 0, MAX_WAIT_MS);
      for (;;) {
        const armed = queue.done.arm(null);
        try {
          const rows = await store.find(tenant, ids, runId);
          const unknown = ids.filter((id) => !rows.some((r) => r.id === id));
          if (unknown.length > 0) throw notFound(`no work item '${unknown[0]}' in tenant '${tenant}'`);
          const done = rows.length > 0 && rows.every((r) => TERMINAL.has(r.status));
          const remaining = deadline - Date.now();
          if (done || remaining <= 0 || ctx.signal.aborted || draining.aborted) return { done, items: await itemsToWire(agents, rows) };
          await armed.wait(Math.min(remaining, 5_000), [ctx.signal, draining]);
        } finally {
          armed.disarm();
        }
      }
    },

    async cancel(req, ctx) {
      const tenant = tenantOf(req.tenantKey, ctx);
      const caller = callerOf(ctx);
      return { cancelledIds: await queue.cancel(tenant, req, caller.principal) };
    },
  };
}

/**
 * Wakes waiting claims for new items. Any agent of the tenant and engine kind can take a plain item,
 * so as many claims are woken as there are plain items (not every idle claim, which would cost one
 * claim statement per idle agent per item); items with a selector or an affinity key only some
 * agents may take, so those wake every matching claim.
 */
function wakeClaims(queue: WorkQueue, tenant: string, items: readonly NewItem[]): void {
  const plain = new Map<string, number>();
  const picky = new Set<string>();
  for (const i of items) {
    const key = workKey(tenant, i.engineKind);
    if (i.workerParams) picky.add(key);
    else plain.set(key, (plain.get(key) ?? 0) + 1);
  }
  for (const [key, n] of plain) queue.ringWork([key], n);
  if (picky.size > 0) queue.ringWork([...picky]);
}

/** One page of items in dispatch order, of these tenants (undefined: every tenant); shared by QueueService and OpsService. */
export async function listItemsPage(store: WorkItemStore, agents: AgentStore, tenants: readonly string[] | undefined, req: ListItemsQuery) {
  const limit = Math.min(req.pageSize || 100, 1000);
  const { rows, more } = await store.list({
    ...listFilter(req),
    tenants,
    limit,
    maxBytes: LIST_PAGE_BYTES,
    after: req.pageToken ? decodeCursor(req.pageToken, listCursor) : undefined,
  });
  const last = rows.at(-1);
  return {
    items: await itemsToWire(agents, rows),
    nextPageToken: more && last ? encodeCursor({ priority: last.priority ?? 0, createdon: last.createdon, id: last.id }) : "",
  };
}

type ListItemsQuery = Pick<ListItemsRequest, "statuses" | "engineKind" | "runId" | "parentWorkItemId" | "agentId" | "pageSize" | "pageToken"> & {
  idempotencyKey?: string;
};

function listFilter(req: ListItemsQuery) {
  const statuses = req.statuses.map((s, i) => {
    const v = itemStatusFromWire(s);
    if (!v) throw invalidArgument(`statuses[${i}]`, `unknown status ${s}`);
    return v;
  }) as ItemStatus[];
  return {
    statuses,
    engineKind: req.engineKind ? identifier(req.engineKind, "engine_kind") : undefined,
    runId: req.runId ? identifier(req.runId, "run_id") : undefined,
    parentId: req.parentWorkItemId ? identifier(req.parentWorkItemId, "parent_work_item_id") : undefined,
    agent: req.agentId ? identifier(req.agentId, "agent_id") : undefined,
    idempotencyKey: req.idempotencyKey ? (optionalText(req.idempotencyKey, "idempotency_key", 256) ?? undefined) : undefined,
  };
}
