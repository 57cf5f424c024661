/** aiflowctl's queue commands: queue stats, items list/get/cancel/redrive, enqueue. */
import { durationMs } from "@bufbuild/protobuf/wkt";
import {
  CancelItemsResponseSchema,
  OpsServiceGetItemResponseSchema,
  OpsServiceListItemsResponseSchema,
  QueueStatsResponseSchema,
  RedriveItemsResponseSchema,
  type QueueStatsResponse,
} from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { EnqueueResponseSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { WorkItemStatus, type WorkItem } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { UsageError } from "./args.js";
import { durationFlag, pageOf, printJson, statusesOf, wholeFlag, type Command } from "./command.js";
import { enumName, humanDuration, status, table } from "./format.js";

const itemStatus = (s: WorkItemStatus) => enumName(WorkItemStatus, s, "");

export function itemRows(items: readonly WorkItem[]): string {
  return table(
    ["ID", "TENANT", "KIND", "STATUS", "PRI", "RETRIES", "AGENT", "RUN", "ERROR"],
    items.map((i) => [
      i.id,
      i.tenantKey,
      i.engineKind,
      status(itemStatus(i.status)),
      String(i.priority),
      `${i.retryCount}/${i.maxRetries}`,
      i.agentId || "-",
      i.runId || "-",
      i.error.slice(0, 60),
    ]),
  );
}

const ITEM_FIELDS = {
  tenant_key: "--tenant",
  engine_kind: "--engine-kind",
  run_id: "--run",
  parent_work_item_id: "--parent",
  agent_id: "--agent",
  page_token: "--page-token",
  ids: "ID",
  id: "ID",
  reason: "--reason",
};

/**
 * The work QueueStats says is stuck, each kind under a line saying why, so that waiting work nobody
 * will take is never only a number in the depth table: pending items no ACTIVE agent serves (their
 * tenant and engine kind), and items whose requirements no agent could meet.
 */
function stuck(ctx: { out(text: string): void }, res: QueueStatsResponse): void {
  if (res.unserved.length > 0) {
    ctx.out("\nunserved: no ACTIVE agent serves these tenants and engine kinds; their items wait until one registers or is undrained");
    ctx.out(
      table(
        ["TENANT", "KIND", "PENDING", "OLDEST", "AGENTS NOT ACTIVE"],
        res.unserved.map((u) => [
          u.tenantKey,
          u.engineKind,
          String(u.count),
          humanDuration(durationMs(u.oldestAge!)),
          u.agentsNotActive ? `${u.agentsNotActive} (draining or inactive)` : "none registered",
        ]),
      ),
    );
  }
  if (res.unplaceable.length > 0) {
    ctx.out("\nunplaceable: no agent serving these tenants and engine kinds could ever meet their requirements");
    ctx.out(
      table(
        ["TENANT", "KIND", "PENDING", "OLDEST", "WHY"],
        res.unplaceable.map((u) => [u.tenantKey, u.engineKind, String(u.count), humanDuration(durationMs(u.oldestAge!)), u.reason]),
      ),
    );
  }
}

export const workCommands: Command[] = [
  {
    name: "queue",
    usage: ["  queue stats [--tenant T] [--watch] [--interval 2s]                queue depth, age and rates, and work nobody serves"],
    flags: [
      { name: "tenant", kind: "value", arg: "T", help: "one tenant only", default: "every tenant the token may see" },
      { name: "watch", kind: "bool", help: "print again every --interval until interrupted" },
      { name: "interval", kind: "value", arg: "D", help: "how often --watch prints", default: "2s" },
    ],
    fields: ITEM_FIELDS,
    async run(ctx) {
      if (ctx.args.positionals[0] !== "stats") throw new UsageError("usage: aiflowctl queue stats [--tenant T] [--watch]");
      const interval = durationFlag(ctx.args, "interval", "2s");
      for (;;) {
        const res = await ctx.ops.queueStats({ tenantKey: ctx.args.get("tenant") ?? "" });
        if (ctx.json) printJson(ctx, QueueStatsResponseSchema, res);
        else {
          if (ctx.args.has("watch") && process.stdout.isTTY) ctx.out("\u001b[2J\u001b[H");
          ctx.out(
            `pending ${res.pending}  dispatched ${res.dispatched}  dead letters ${res.deadLetters}  oldest pending ${humanDuration(durationMs(res.oldestPendingAge!))}` +
              `  dispatched/s ${res.dispatchedPerSecond.toFixed(1)}  completed/s ${res.completedPerSecond.toFixed(1)}` +
              (res.dispatchWaitP50
                ? `  wait p50 ${humanDuration(durationMs(res.dispatchWaitP50))} p99 ${humanDuration(durationMs(res.dispatchWaitP99 ?? res.dispatchWaitP50))}`
                : "") +
              "\n",
          );
          ctx.out(
            res.depth.length
              ? table(
                  ["TENANT", "KIND", "STATUS", "COUNT"],
                  res.depth.map((d) => [d.tenantKey, d.engineKind, status(itemStatus(d.status)), String(d.count)]),
                )
              : "queue is empty",
          );
          stuck(ctx, res);
        }
        if (!ctx.args.has("watch")) return 0;
        await new Promise((r) => setTimeout(r, interval));
      }
    },
  },
  {
    name: "items",
    usage: [
      "  items list [--tenant T] [--status S]... [--engine-kind K] [--run R] [--parent P] [--agent A] [--limit N]",
      "  items get ID                                                      one work item",
      "  items cancel --tenant T (ID... | --run R | --parent P...) [--reason R]",
      "  items redrive [--tenant T] (ID... | --run R | --all)              dead letters back to the queue",
    ],
    flags: [
      { name: "tenant", kind: "value", arg: "T", help: "the items' tenant (cancel needs it)", default: "every tenant the token may see" },
      { name: "status", kind: "repeat", arg: "S", help: "list: only items in this status (pending, dispatched, completed, failed, cancelled)" },
      { name: "engine-kind", kind: "value", arg: "K", help: "list: only items of this engine kind" },
      { name: "run", kind: "value", arg: "R", help: "the items of this run" },
      { name: "parent", kind: "repeat", arg: "P", help: "the children of this item" },
      { name: "agent", kind: "value", arg: "A", help: "list: only items dispatched to this agent" },
      { name: "limit", kind: "value", arg: "N", help: "list: items per page (at most 1000)", default: "100" },
      { name: "page-token", kind: "value", arg: "TOKEN", help: "list: the page after the one that printed it" },
      { name: "reason", kind: "value", arg: "R", help: "cancel: why, kept on the items" },
      { name: "all", kind: "bool", help: "redrive: every dead letter" },
    ],
    fields: ITEM_FIELDS,
    async run(ctx) {
      const [sub, ...ids] = ctx.args.positionals;
      const tenantKey = ctx.args.get("tenant") ?? "";
      switch (sub) {
        case "list": {
          const res = await ctx.ops.listItems({
            tenantKey,
            statuses: statusesOf(ctx.args.all("status")),
            engineKind: ctx.args.get("engine-kind") ?? "",
            runId: ctx.args.get("run") ?? "",
            parentWorkItemId: ctx.args.all("parent")[0] ?? "",
            agentId: ctx.args.get("agent") ?? "",
            ...pageOf(ctx.args),
          });
          if (ctx.json) printJson(ctx, OpsServiceListItemsResponseSchema, res);
          else ctx.out((res.items.length ? itemRows(res.items) : "no items") + (res.nextPageToken ? `\nmore: --page-token ${res.nextPageToken}` : ""));
          return 0;
        }
        case "get": {
          if (!ids[0]) throw new UsageError("give the item ID: aiflowctl items get ID");
          const res = await ctx.ops.getItem({ id: ids[0] });
          if (ctx.json) printJson(ctx, OpsServiceGetItemResponseSchema, res);
          else {
            ctx.out(itemRows([res.item!]));
            if (res.item?.payloadJson) ctx.out(`payload ${res.item.payloadJson}`);
            if (res.item?.resultJson) ctx.out(`result ${res.item.resultJson}`);
            if (res.children)
              ctx.out(
                `children: pending ${res.children.pending}, dispatched ${res.children.dispatched}, completed ${res.children.completed}, failed ${res.children.failed}, cancelled ${res.children.cancelled}`,
              );
          }
          return 0;
        }
        case "cancel": {
          if (!tenantKey) throw new UsageError("items cancel needs --tenant");
          const res = await ctx.ops.cancelItems({
            tenantKey,
            ids,
            runId: ctx.args.get("run") ?? "",
            parentIds: ctx.args.all("parent"),
            reason: ctx.args.get("reason") ?? "",
          });
          if (ctx.json) printJson(ctx, CancelItemsResponseSchema, res);
          else ctx.out(`cancelled ${res.cancelledIds.length} item(s)`);
          return 0;
        }
        case "redrive": {
          const res = await ctx.ops.redriveItems({ tenantKey, ids, runId: ctx.args.get("run") ?? "", all: ctx.args.has("all") });
          if (ctx.json) printJson(ctx, RedriveItemsResponseSchema, res);
          else ctx.out(`redrove ${res.redrivenIds.length} item(s)`);
          return 0;
        }
        default:
          throw new UsageError("usage: aiflowctl items list|get|cancel|redrive ...");
      }
    },
  },
  {
    name: "enqueue",
    usage: [
      "  enqueue --tenant T --engine-kind K [--payload JSON] [--count N] [--priority P] [--run R] [--max-retries N]",
      "                                                                    enqueue test work (needs an engine token)",
    ],
    flags: [
      { name: "tenant", kind: "value", arg: "T", help: "the items' tenant (required)" },
      { name: "engine-kind", kind: "value", arg: "K", help: "the engine kind agents claim it by (required)" },
      { name: "payload", kind: "value", arg: "JSON", help: "each item's payload, JSON text" },
      { name: "count", kind: "value", arg: "N", help: "how many items", default: "1" },
      { name: "priority", kind: "value", arg: "P", help: "lower runs first", default: "0" },
      { name: "run", kind: "value", arg: "R", help: "the run the items belong to" },
      { name: "max-retries", kind: "value", arg: "N", help: "attempts after the first", default: "3" },
      { name: "task-name", kind: "value", arg: "NAME", help: "each item's task name" },
    ],
    role: "engine",
    fields: {
      ...ITEM_FIELDS,
      "items[0].payload_json": "--payload",
      "items[0].priority": "--priority",
      "items[0].max_retries": "--max-retries",
      "items[0].run_id": "--run",
      "items[0].task_name": "--task-name",
      "items[0].engine_kind": "--engine-kind",
      items: "--count",
    },
    async run(ctx) {
      const tenantKey = ctx.args.get("tenant");
      const engineKind = ctx.args.get("engine-kind");
      if (!tenantKey || !engineKind) throw new UsageError("enqueue needs --tenant and --engine-kind");
      const count = wholeFlag(ctx.args, "count", 1);
      if (count < 1) throw new UsageError("--count must be a positive whole number");
      const item = {
        engineKind,
        payloadJson: ctx.args.get("payload") ?? "",
        priority: wholeFlag(ctx.args, "priority", 0),
        runId: ctx.args.get("run") ?? "",
        maxRetries: wholeFlag(ctx.args, "max-retries", 3),
        taskName: ctx.args.get("task-name") ?? "",
      };
      const res = await ctx.queue.enqueue({ tenantKey, items: Array.from({ length: count }, () => item) });
      if (ctx.json) printJson(ctx, EnqueueResponseSchema, res);
      else ctx.out(res.results.map((r) => r.id).join("\n"));
      return 0;
    },
  },
];
