/** aiflowctl's fleet commands: agents, agent, drain, undrain, remove. */
import { durationFromMs, durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import {
  DrainAgentResponseSchema,
  GetAgentResponseSchema,
  ListAgentsResponseSchema,
  RemoveAgentResponseSchema,
  UndrainAgentResponseSchema,
  type AgentSummary,
} from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { keyValues, UsageError } from "./args.js";
import { durationFlag, one, printJson, type Command, type Ctx } from "./command.js";
import { enumName, humanDuration, paint, status, table } from "./format.js";
import { itemRows } from "./work.js";

export const agentStatus = (s: AgentStatus) => enumName(AgentStatus, s, "");

function agentRows(agents: readonly AgentSummary[]): string {
  return table(
    ["NAME", "STATUS", "LAST SEEN", "IN FLIGHT", "SLOTS", "VERSION", "CPU%", "MEM"],
    agents.map((a) => {
      const m = (a.metrics ?? {}) as { cpu?: { utilization?: number }; memory?: { used?: number; total?: number } };
      const mem = m.memory?.total ? `${Math.round(((m.memory.used ?? 0) / m.memory.total) * 100)}%` : "-";
      return [
        a.name,
        status(agentStatus(a.status)),
        a.lastSeenAge ? `${humanDuration(durationMs(a.lastSeenAge))} ago` : "-",
        String(a.inFlight),
        String(a.metadata?.slots ?? 0),
        a.agentVersion || "-",
        m.cpu?.utilization === undefined ? "-" : m.cpu.utilization.toFixed(0),
        mem,
      ];
    }),
  );
}

function drainLine(a: AgentSummary): string {
  const d = a.drain;
  if (!d) return agentStatus(a.status);
  const deadline = d.deadline ? `deadline in ${humanDuration(Math.max(0, timestampMs(d.deadline) - Date.now()))}` : "no deadline";
  return `in flight ${d.inFlightNow}/${d.inFlightAtStart}, ${deadline}${d.complete ? `, ${paint("complete", "green")}` : ""}${d.releasedAtDeadline ? `, ${d.releasedAtDeadline} released at deadline` : ""}`;
}

/**
 * Shows drain progress until every agent has nothing in flight; exit 3 when a deadline gave work
 * back. released_at_deadline counts the daemon's releases at the deadline and the agent's own (the
 * SDK's deadline timer usually fires first), and is written with the release itself, so the poll
 * that sees nothing in flight sees the count too.
 */
async function waitForDrains(ctx: Ctx, names: readonly string[], intervalMs: number): Promise<number> {
  if (names.length === 0) return (ctx.out("no agent matched"), 0);
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

const AGENT_FIELDS = { name: "NAME" };

export const agentCommands: Command[] = [
  {
    name: "agents",
    usage: ["  agents [--status S]... [--tag K=V]... [--version V] [--removed]   list agents (by name)"],
    flags: [
      { name: "status", kind: "repeat", arg: "S", help: "only agents in this status: active, draining, inactive" },
      { name: "tag", kind: "repeat", arg: "K=V", help: "only agents with this tag" },
      { name: "version", kind: "value", arg: "V", help: "only agents of this agent version" },
      { name: "removed", kind: "bool", help: "include removed (soft-deleted) agents" },
    ],
    fields: { "statuses[0]": "--status", "tags key": "--tag", version: "--version" },
    async run(ctx) {
      const statuses = ctx.args.all("status").map((s) => {
        const v = (AgentStatus as unknown as Record<string, number>)[s.toUpperCase()];
        if (v === undefined || v === 0) throw new UsageError(`unknown agent status '${s}' (active, draining, inactive)`);
        return v as AgentStatus;
      });
      const res = await ctx.ops.listAgents({
        statuses,
        tags: keyValues(ctx.args.all("tag"), "tag"),
        version: ctx.args.get("version") ?? "",
        includeRemoved: ctx.args.has("removed"),
      });
      if (ctx.json) printJson(ctx, ListAgentsResponseSchema, res);
      else ctx.out(res.agents.length ? agentRows(res.agents) : "no agents");
      return 0;
    },
  },
  {
    name: "agent",
    usage: ["  agent NAME                                                        one agent, its work and drain progress"],
    flags: [],
    fields: AGENT_FIELDS,
    async run(ctx) {
      const res = await ctx.ops.getAgent({ name: one(ctx.args, "agent name") });
      if (ctx.json) return (printJson(ctx, GetAgentResponseSchema, res), 0);
      const a = res.agent!;
      ctx.out(agentRows([a]));
      const meta = a.metadata;
      ctx.out(
        `\nid ${a.id}  type ${enumName({ 0: "unspecified", 1: "remote", 2: "local" }, a.agentType, "")}  tenants ${meta?.tenants.join(",") || "-"}  engine kinds ${meta?.engineKinds.join(",") || "-"}`,
      );
      ctx.out(
        `tags ${
          Object.entries(meta?.tags ?? {})
            .map(([k, v]) => `${k}=${v}`)
            .join(" ") || "-"
        }`,
      );
      if (a.drain) ctx.out(`drain: ${drainLine(a)}`);
      if (res.affinityKeys.length) ctx.out(`affinity keys: ${res.affinityKeys.join(", ")}`);
      ctx.out(res.dispatched.length ? `\n${itemRows(res.dispatched)}` : "\nnothing dispatched");
      return 0;
    },
  },
  {
    name: "drain",
    usage: [
      "  drain NAME | --tag K=V... | --version-below X [--deadline 10m] [--reason R] [--wait | --dry-run]",
      "                                                                    drain agents for a rolling deploy",
    ],
    flags: [
      { name: "tag", kind: "repeat", arg: "K=V", help: "drain every active agent with these tags (instead of NAME)" },
      {
        name: "version-below",
        kind: "value",
        arg: "X",
        help: "drain every active agent older than version X (instead of NAME), in semver order (1.10 = 1.10.0 < 2.0.0-rc.1 < 2.0.0); agents whose version is not one are left alone and named",
      },
      {
        name: "deadline",
        kind: "value",
        arg: "D",
        help: "give back what is still in flight after D (10m, 1h), retries unspent",
        default: "none: wait for the work to finish",
      },
      { name: "reason", kind: "value", arg: "R", help: "why, shown to the agent and in `agent NAME`", default: "drained by an operator" },
      { name: "wait", kind: "bool", help: "show progress until nothing is in flight" },
      { name: "dry-run", kind: "bool", help: "drain nothing: list the agents the drain would hit" },
      { name: "interval", kind: "value", arg: "D", help: "how often --wait polls", default: "500ms" },
    ],
    exits: [
      "0 drained (with --wait), the drain started, or (--dry-run) the agents listed",
      "3 with --wait: the deadline gave work back to the queue (whether the daemon or the agent gave it back)",
    ],
    fields: { ...AGENT_FIELDS, "selector.tags key": "--tag", "selector.version_below": "--version-below", deadline: "--deadline", reason: "--reason" },
    async run(ctx) {
      const name = ctx.args.positionals[0] ?? "";
      const tags = keyValues(ctx.args.all("tag"), "tag");
      const below = ctx.args.get("version-below") ?? "";
      if (!name && !below && Object.keys(tags).length === 0) throw new UsageError("give an agent NAME or a selector (--tag K=V, --version-below X)");
      const dryRun = ctx.args.has("dry-run");
      if (dryRun && ctx.args.has("wait")) throw new UsageError("--dry-run drains nothing, so there is nothing to --wait for");
      const deadline = durationFlag(ctx.args, "deadline");
      const interval = durationFlag(ctx.args, "interval", "500ms");
      const res = await ctx.ops.drainAgent({
        name,
        selector: { tags, versionBelow: below },
        deadline: deadline === undefined ? undefined : durationFromMs(deadline),
        reason: ctx.args.get("reason") ?? "",
        dryRun,
      });
      // Agents the selector left alone because their version cannot be compared: said, never silently skipped.
      const skipped = res.versionNotComparable.length
        ? `not comparable with ${below} (their version is not a version), left alone: ${res.versionNotComparable.join(", ")}`
        : "";
      if (dryRun) {
        if (ctx.json) printJson(ctx, DrainAgentResponseSchema, res);
        else
          ctx.out(
            [res.agents.length ? `would drain ${res.agents.length} agent(s):\n${agentRows(res.agents)}` : "no agent matched", skipped]
              .filter(Boolean)
              .join("\n"),
          );
        return 0;
      }
      if (skipped && !ctx.json) process.stderr.write(`aiflowctl: ${skipped}\n`);
      if (!ctx.args.has("wait")) {
        if (ctx.json) printJson(ctx, DrainAgentResponseSchema, res);
        else ctx.out(res.agents.length ? res.agents.map((a) => `draining ${a.name}: ${drainLine(a)}`).join("\n") : "no agent matched");
        return 0;
      }
      return waitForDrains(
        ctx,
        res.agents.map((a) => a.name),
        interval,
      );
    },
  },
  {
    name: "undrain",
    usage: ["  undrain NAME                                                      return a draining agent to service"],
    flags: [],
    exits: ["1 also when the agent is inactive: its process has gone and must register again"],
    fields: AGENT_FIELDS,
    async run(ctx) {
      const name = one(ctx.args, "agent name");
      const res = await ctx.ops.undrainAgent({ name });
      const now = res.agent?.status ?? AgentStatus.UNSPECIFIED;
      if (ctx.json) printJson(ctx, UndrainAgentResponseSchema, res);
      if (now === AgentStatus.INACTIVE) {
        process.stderr.write(`aiflowctl: ${name} is inactive: undrain changed nothing; the agent returns when its process registers again (restart it)\n`);
        return 1;
      }
      if (!ctx.json) ctx.out(`${res.agent?.name} is ${agentStatus(now)}`);
      return 0;
    },
  },
  {
    name: "remove",
    usage: ["  remove NAME [--force]                                             decommission (soft delete) an agent"],
    flags: [{ name: "force", kind: "bool", help: "remove even while it holds work, giving the work back to the queue" }],
    fields: AGENT_FIELDS,
    async run(ctx) {
      const name = one(ctx.args, "agent name");
      const res = await ctx.ops.removeAgent({ name, force: ctx.args.has("force") });
      if (ctx.json) printJson(ctx, RemoveAgentResponseSchema, res);
      else ctx.out(`removed ${name}${res.released ? ` (${res.released} item(s) given back to the queue)` : ""}`);
      return 0;
    },
  },
];
