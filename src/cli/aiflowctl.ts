/**
 * aiflowctl — the operator's command line for aiflowd, built on the generated Connect client.
 * Exit codes: 0 success, 1 the daemon refused or failed, 2 usage, 3 a drain deadline gave work back.
 */
import { toJson, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { durationFromMs, durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { parseDuration } from "../config.js";
import { AgentStatus } from "../gen/aiflow/cluster/v1/common_pb.js";
import {
  GetAgentResponseSchema,
  ListAgentsResponseSchema,
  OpsService,
  OpsServiceGetItemResponseSchema,
  OpsServiceListItemsResponseSchema,
  QueueStatsResponseSchema,
  DrainAgentResponseSchema,
  UndrainAgentResponseSchema,
  RemoveAgentResponseSchema,
  CancelItemsResponseSchema,
  RedriveItemsResponseSchema,
  type AgentSummary,
} from "../gen/aiflow/cluster/v1/ops_pb.js";
import { EnqueueResponseSchema, QueueService } from "../gen/aiflow/cluster/v1/queue_pb.js";
import { WorkItemStatus, type WorkItem } from "../gen/aiflow/cluster/v1/work_item_pb.js";
import { keyValues, parseFlags, UsageError, type Parsed } from "./ctl/args.js";
import { enumName, humanDuration, paint, status, table } from "./ctl/format.js";

const HELP = `aiflowctl — operate an aiflowd fleet

Usage: aiflowctl [--address HOST:PORT] [--token TOKEN] COMMAND [flags]

Commands:
  agents [--status S]... [--tag K=V]... [--version V] [--removed]   list agents (by name)
  agent NAME                                                        one agent, its work and drain progress
  drain NAME | --tag K=V... | --version-below X [--deadline 10m] [--reason R] [--wait]
                                                                    drain agents for a rolling deploy
  undrain NAME                                                      return a draining agent to service
  remove NAME [--force]                                             decommission (soft delete) an agent
  queue stats [--tenant T] [--watch] [--interval 2s]                queue depth, age and rates
  items list [--tenant T] [--status S]... [--engine-kind K] [--run R] [--parent P] [--agent A] [--limit N]
  items get ID                                                      one work item
  items cancel --tenant T (ID... | --run R | --parent P...) [--reason R]
  items redrive [--tenant T] (ID... | --run R | --all)              dead letters back to the queue
  enqueue --tenant T --engine-kind K [--payload JSON] [--count N] [--priority P] [--run R] [--max-retries N]
                                                                    enqueue test work (needs an engine token)

Global flags:
  --address HOST:PORT   daemon address (env AIFLOW_ADDRESS, default 127.0.0.1:7400)
  --token TOKEN         bearer token (env AIFLOW_TOKEN); ops role, engine role for enqueue
  --json                print data as JSON (every data command)
  --help                this text, or COMMAND --help
`;

const GLOBAL = { value: ["address", "token"], bool: ["json", "help"] } as const;

/** COMMAND --help: that command's entries of the command list (continuation lines too), and the global flags. */
function commandHelp(command: string): string {
  const lines = HELP.split("\n");
  const from = lines.indexOf("Commands:") + 1;
  const entries: string[] = [];
  let mine = false;
  for (const line of lines.slice(from, lines.indexOf("", from))) {
    if (/^ {2}\S/.test(line)) mine = line.trim().split(/\s+/)[0] === command;
    if (mine) entries.push(line);
  }
  return `Usage: aiflowctl [--address HOST:PORT] [--token TOKEN] ${command} [flags]\n\n${entries.join("\n")}\n\n${lines.slice(lines.indexOf("Global flags:")).join("\n")}`;
}

interface Ctx {
  args: Parsed;
  json: boolean;
  ops: ReturnType<typeof createClient<typeof OpsService>>;
  queue: ReturnType<typeof createClient<typeof QueueService>>;
  out(text: string): void;
}

function printJson<D extends DescMessage>(ctx: Ctx, schema: D, msg: MessageShape<D>): void {
  ctx.out(JSON.stringify(toJson(schema, msg, { alwaysEmitImplicit: true }), null, 2));
}

const agentStatus = (s: AgentStatus) => enumName(AgentStatus, s, "");
const itemStatus = (s: WorkItemStatus) => enumName(WorkItemStatus, s, "");

function agentRows(agents: readonly AgentSummary[]): string {
  return table(
    ["NAME", "STATUS", "LAST SEEN", "IN FLIGHT", "SLOTS", "VERSION", "CPU%", "MEM"],
    agents.map((a) => {
      const m = (a.metrics ?? {}) as { cpu?: { utilization?: number }; memory?: { used?: number; total?: number } };
      const mem = m.memory?.total ? `${Math.round(((m.memory.used ?? 0) / m.memory.total) * 100)}%` : "-";
      return [
        a.name,
        status(agentStatus(a.status)),
        a.lastSeenAge ? humanDuration(durationMs(a.lastSeenAge)) + " ago" : "-",
        String(a.inFlight),
        String(a.metadata?.slots ?? 0),
        a.agentVersion || "-",
        m.cpu?.utilization === undefined ? "-" : m.cpu.utilization.toFixed(0),
        mem,
      ];
    }),
  );
}

function itemRows(items: readonly WorkItem[]): string {
  return table(
    ["ID", "TENANT", "KIND", "STATUS", "PRI", "RETRIES", "AGENT", "RUN", "ERROR"],
    items.map((i) => [i.id, i.tenantKey, i.engineKind, status(itemStatus(i.status)), String(i.priority), `${i.retryCount}/${i.maxRetries}`, i.agentId || "-", i.runId || "-", i.error.slice(0, 60)]),
  );
}

const statusesOf = (names: readonly string[]) =>
  names.map((n) => {
    const v = (WorkItemStatus as unknown as Record<string, number>)[n.toUpperCase()];
    if (v === undefined || v === 0) throw new UsageError(`unknown status '${n}' (pending, dispatched, completed, failed, cancelled)`);
    return v as WorkItemStatus;
  });

/** A duration flag; a malformed one is a usage error (exit 2), found before anything is sent. */
function durationFlag(args: Parsed, flag: string, fallback: string): number;
function durationFlag(args: Parsed, flag: string): number | undefined;
function durationFlag(args: Parsed, flag: string, fallback?: string): number | undefined {
  const raw = args.get(flag) ?? fallback;
  if (raw === undefined) return undefined;
  try {
    return parseDuration(raw, `--${flag}`);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

/** A whole-number flag; anything else is a usage error, not a NaN sent as zero. */
function wholeFlag(args: Parsed, flag: string, fallback: number): number {
  const raw = args.get(flag);
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (raw.trim() === "" || !Number.isSafeInteger(n) || n < 0) throw new UsageError(`--${flag} must be a whole number, got '${raw}'`);
  return n;
}

const one = (args: Parsed, what: string) => {
  const v = args.positionals[0];
  if (!v) throw new UsageError(`give the ${what}`);
  return v;
};

const COMMANDS: Record<string, { flags: { bool?: string[]; value?: string[]; repeat?: string[] }; run(ctx: Ctx): Promise<number> }> = {
  agents: {
    flags: { bool: ["removed"], value: ["version"], repeat: ["status", "tag"] },
    async run(ctx) {
      const statuses = ctx.args.all("status").map((s) => {
        const v = (AgentStatus as unknown as Record<string, number>)[s.toUpperCase()];
        if (v === undefined || v === 0) throw new UsageError(`unknown agent status '${s}' (active, draining, inactive)`);
        return v as AgentStatus;
      });
      const res = await ctx.ops.listAgents({ statuses, tags: keyValues(ctx.args.all("tag"), "tag"), version: ctx.args.get("version") ?? "", includeRemoved: ctx.args.has("removed") });
      if (ctx.json) printJson(ctx, ListAgentsResponseSchema, res);
      else ctx.out(res.agents.length ? agentRows(res.agents) : "no agents");
      return 0;
    },
  },
  agent: {
    flags: {},
    async run(ctx) {
      const res = await ctx.ops.getAgent({ name: one(ctx.args, "agent name") });
      if (ctx.json) return printJson(ctx, GetAgentResponseSchema, res), 0;
      const a = res.agent!;
      ctx.out(agentRows([a]));
      const meta = a.metadata;
      ctx.out(`\nid ${a.id}  type ${enumName({ 0: "unspecified", 1: "remote", 2: "local" }, a.agentType, "")}  tenants ${meta?.tenants.join(",") || "-"}  engine kinds ${meta?.engineKinds.join(",") || "-"}`);
      ctx.out(`tags ${Object.entries(meta?.tags ?? {}).map(([k, v]) => `${k}=${v}`).join(" ") || "-"}`);
      if (a.drain) ctx.out(`drain: ${drainLine(a)}`);
      if (res.affinityKeys.length) ctx.out(`affinity keys: ${res.affinityKeys.join(", ")}`);
      ctx.out(res.dispatched.length ? `\n${itemRows(res.dispatched)}` : "\nnothing dispatched");
      return 0;
    },
  },
  drain: {
    flags: { bool: ["wait"], value: ["deadline", "reason", "version-below", "interval"], repeat: ["tag"] },
    async run(ctx) {
      const name = ctx.args.positionals[0] ?? "";
      const tags = keyValues(ctx.args.all("tag"), "tag");
      const below = ctx.args.get("version-below") ?? "";
      if (!name && !below && Object.keys(tags).length === 0) throw new UsageError("give an agent NAME or a selector (--tag K=V, --version-below X)");
      const deadline = durationFlag(ctx.args, "deadline");
      const interval = durationFlag(ctx.args, "interval", "500ms");
      const res = await ctx.ops.drainAgent({
        name,
        selector: { tags, versionBelow: below },
        deadline: deadline === undefined ? undefined : durationFromMs(deadline),
        reason: ctx.args.get("reason") ?? "",
      });
      if (!ctx.args.has("wait")) {
        if (ctx.json) printJson(ctx, DrainAgentResponseSchema, res);
        else ctx.out(res.agents.length ? res.agents.map((a) => `draining ${a.name}: ${drainLine(a)}`).join("\n") : "no agent matched");
        return 0;
      }
      return waitForDrains(ctx, res.agents.map((a) => a.name), interval);
    },
  },
  undrain: {
    flags: {},
    async run(ctx) {
      const res = await ctx.ops.undrainAgent({ name: one(ctx.args, "agent name") });
      if (ctx.json) printJson(ctx, UndrainAgentResponseSchema, res);
      else ctx.out(`${res.agent?.name} is ${agentStatus(res.agent?.status ?? AgentStatus.UNSPECIFIED)}`);
      return 0;
    },
  },
  remove: {
    flags: { bool: ["force"] },
    async run(ctx) {
      const name = one(ctx.args, "agent name");
      const res = await ctx.ops.removeAgent({ name, force: ctx.args.has("force") });
      if (ctx.json) printJson(ctx, RemoveAgentResponseSchema, res);
      else ctx.out(`removed ${name}${res.released ? ` (${res.released} item(s) given back to the queue)` : ""}`);
      return 0;
    },
  },
  queue: {
    flags: { bool: ["watch"], value: ["tenant", "interval"] },
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
              `  dispatched/s ${res.dispatchedPerSecond.toFixed(1)}  completed/s ${res.completedPerSecond.toFixed(1)}\n`,
          );
          ctx.out(res.depth.length ? table(["TENANT", "KIND", "STATUS", "COUNT"], res.depth.map((d) => [d.tenantKey, d.engineKind, status(itemStatus(d.status)), String(d.count)])) : "queue is empty");
        }
        if (!ctx.args.has("watch")) return 0;
        await new Promise((r) => setTimeout(r, interval));
      }
    },
  },
  items: {
    flags: { bool: ["all"], value: ["tenant", "engine-kind", "run", "agent", "limit", "reason", "page-token"], repeat: ["status", "parent"] },
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
            pageSize: wholeFlag(ctx.args, "limit", 100),
            pageToken: ctx.args.get("page-token") ?? "",
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
            if (res.children) ctx.out(`children: pending ${res.children.pending}, dispatched ${res.children.dispatched}, completed ${res.children.completed}, failed ${res.children.failed}, cancelled ${res.children.cancelled}`);
          }
          return 0;
        }
        case "cancel": {
          const res = await ctx.ops.cancelItems({ tenantKey, ids, runId: ctx.args.get("run") ?? "", parentIds: ctx.args.all("parent"), reason: ctx.args.get("reason") ?? "" });
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
  enqueue: {
    flags: { value: ["tenant", "engine-kind", "payload", "count", "priority", "run", "max-retries", "task-name"] },
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
};

function drainLine(a: AgentSummary): string {
  const d = a.drain;
  if (!d) return agentStatus(a.status);
  const deadline = d.deadline ? `deadline in ${humanDuration(Math.max(0, timestampMs(d.deadline) - Date.now()))}` : "no deadline";
  return `in flight ${d.inFlightNow}/${d.inFlightAtStart}, ${deadline}${d.complete ? ", " + paint("complete", "green") : ""}${d.releasedAtDeadline ? `, ${d.releasedAtDeadline} released at deadline` : ""}`;
}

/** Shows drain progress until every agent has nothing in flight; exit 3 when a deadline gave work back. */
async function waitForDrains(ctx: Ctx, names: readonly string[], intervalMs: number): Promise<number> {
  if (names.length === 0) return ctx.out("no agent matched"), 0;
  const live = process.stderr.isTTY === true;
  for (;;) {
    const agents = (await Promise.all(names.map((name) => ctx.ops.getAgent({ name })))).map((r) => r.agent!);
    const line = agents.map((a) => `${a.name}: ${drainLine(a)}`).join(" | ");
    if (!ctx.json) process.stderr.write(live ? `\r\u001b[2K${line}` : `${line}\n`);
    if (agents.every((a) => (a.drain?.inFlightNow ?? a.inFlight) === 0)) {
      if (live && !ctx.json) process.stderr.write("\n");
      const released = agents.reduce((n, a) => n + (a.drain?.releasedAtDeadline ?? 0), 0);
      if (ctx.json) ctx.out(JSON.stringify({ drained: names, releasedAtDeadline: released }));
      else ctx.out(released ? `drained; ${released} item(s) were given back at the deadline` : "drained");
      return released > 0 ? 3 : 0;
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

export async function main(argv: readonly string[], env = process.env, out = (t: string) => process.stdout.write(t + "\n")): Promise<number> {
  const command = argv.find((a) => !a.startsWith("--") && !isGlobalValue(argv, a));
  const spec = command ? COMMANDS[command] : undefined;
  try {
    const args = parseFlags(argv, {
      bool: [...GLOBAL.bool, ...(spec?.flags.bool ?? [])],
      value: [...GLOBAL.value, ...(spec?.flags.value ?? [])],
      repeat: spec?.flags.repeat ?? [],
    });
    if (!command) {
      out(HELP);
      return args.has("help") ? 0 : 2;
    }
    if (!spec) throw new UsageError(`unknown command '${command}' (see aiflowctl --help)`);
    if (args.has("help")) {
      out(commandHelp(command));
      return 0;
    }
    args.positionals.shift();
    const address = args.get("address") ?? env.AIFLOW_ADDRESS ?? "127.0.0.1:7400";
    const token = args.get("token") ?? env.AIFLOW_TOKEN;
    const auth: Interceptor = (next) => (req) => {
      if (token) req.header.set("authorization", `Bearer ${token}`);
      return next(req);
    };
    const transport = createGrpcTransport({ baseUrl: address.includes("://") ? address : `http://${address}`, interceptors: [auth] });
    return await spec.run({ args, json: args.has("json"), ops: createClient(OpsService, transport), queue: createClient(QueueService, transport), out });
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`aiflowctl: ${err.message}\n`);
      return 2;
    }
    const e = ConnectError.from(err);
    process.stderr.write(`aiflowctl: ${e.rawMessage}${e.code === 14 ? " (is aiflowd running at that address?)" : ""}\n`);
    return 1;
  }
}

/** True when `a` is the value of a global value flag (`--address X`), not a command. */
function isGlobalValue(argv: readonly string[], a: string): boolean {
  const i = argv.indexOf(a);
  return i > 0 && (GLOBAL.value as readonly string[]).includes(argv[i - 1]!.replace(/^--/, ""));
}
