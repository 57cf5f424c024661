/**
 * aiflowctl's graph-run and state-machine commands (GraphService, MachineService; role `runs`):
 * graph ID shows a run's path, steps and why it stopped; machine ID a machine's state, history and
 * what it is waiting on. Every call names its tenant with --tenant; a run is the caller's own.
 */
import {
  CancelRunResponseSchema as GraphCancelSchema,
  DefinitionSchema as GraphDefinitionSchema,
  GetRunResponseSchema as GraphGetSchema,
  ListRunsResponseSchema as GraphListSchema,
  RunStatus,
  StartRunResponseSchema as GraphStartSchema,
  type Run as GraphRun,
} from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import {
  CancelRunResponseSchema as MachineCancelSchema,
  DefinitionSchema as MachineDefinitionSchema,
  GetRunResponseSchema as MachineGetSchema,
  ListRunsResponseSchema as MachineListSchema,
  SignalRunResponseSchema,
  StartRunResponseSchema as MachineStartSchema,
  type Run as MachineRun,
} from "@aiflow/wire/gen/aiflow/machine/v1/machine_pb.js";
import { create } from "@bufbuild/protobuf";
import { UsageError, type Parsed } from "./args.js";
import { printJson, type Command, type Ctx } from "./command.js";
import { enumName, status, table } from "./format.js";
import { messageFromFile } from "./message-file.js";

const FIELDS = {
  tenant_key: "--tenant",
  run_id: "ID",
  state_json: "--state",
  context_json: "--context",
  reason: "--reason",
  event: "EVENT",
  payload_json: "--payload",
};
const TENANT_FLAG = { name: "tenant", kind: "value", arg: "T", help: "the run's tenant (required)" } as const;

function tenantOf(args: Parsed): string {
  const t = args.get("tenant");
  if (!t) throw new UsageError("give the tenant: --tenant T");
  return t;
}

function idOf(args: Parsed, usage: string): string {
  const id = args.positionals[1];
  if (!id) throw new UsageError(`give the run ID: aiflowctl ${usage}`);
  return id;
}

/** A run's kept steps, after a note of how many it dropped (the daemon keeps the latest --run-history-max). */
const walk = (kept: readonly string[], dropped: bigint, none: string) => (dropped > 0n ? `(${dropped} earlier dropped) … → ` : "") + (kept.join(" → ") || none);

const graphStatus = (r: GraphRun) => status(enumName(RunStatus, r.status, "RUN_STATUS_"));
const machineStatus = (m: MachineRun) => status(m.live ? (m.suspended ? "suspended" : "live") : m.failure ? "failed" : "ended");

/** A graph run as a person reads it: where it is, the walk so far, and why it stopped. */
export function graphView(r: GraphRun): string {
  const counts = Object.entries(r.runCounts)
    .map(([node, n]) => `${node}×${n}`)
    .join(" ");
  const lines = [
    `graph run ${r.runId}  ${graphStatus(r)}  definition ${r.definitionId}`,
    `  at:     ${r.task}${r.workItemId ? ` (work item ${r.workItemId})` : ""}`,
    `  steps:  ${r.steps}${counts ? `  (${counts})` : ""}`,
    `  path:   ${walk(r.path, r.pathDropped, "(none yet)")}`,
  ];
  if (r.reason) lines.push(`  reason: ${r.reason}`);
  if (r.error) lines.push(`  error:  ${r.error}`);
  lines.push(`  state:  ${r.stateJson}`);
  return lines.join("\n");
}

/** A machine as a person reads it: its state, the states it went through, what it waits on. */
export function machineView(m: MachineRun): string {
  const lines = [
    `machine ${m.runId}  ${machineStatus(m)}  definition ${m.definitionId}`,
    `  state:   ${m.state}`,
    `  history: ${walk(m.history, m.historyDropped, "")}`,
  ];
  if (m.suspended) lines.push(`  running: the action of ${m.state} --${m.pendingEvent}--> ${m.pendingTo} (work item ${m.workItemId})`);
  if (m.reason) lines.push(`  reason:  ${m.reason}`);
  if (m.failure) lines.push(`  failure: ${m.failure}`);
  lines.push(`  context: ${m.contextJson}`);
  return lines.join("\n");
}

/** Follows a graph run with WatchRun until it ends, a line on stderr for each step; watched again if the stream ends first (its daemon stopping). */
async function followGraph(ctx: Ctx, tenantKey: string, runId: string): Promise<GraphRun> {
  let shown = 0;
  for (;;) {
    for await (const m of ctx.graph.watchRun({ tenantKey, runId }, { timeoutMs: 0 })) {
      const run = m.run!;
      // Steps that came together arrive in one message: the path names each (those it still keeps).
      for (; shown < Number(run.steps); shown++) process.stderr.write(`  step ${shown + 1}: ${run.path[shown - Number(run.pathDropped)] ?? "(dropped)"}\n`);
      if (run.status !== RunStatus.RUNNING) return run;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function graph(ctx: Ctx): Promise<number> {
  const sub = ctx.args.positionals[0];
  if (!sub) throw new UsageError("give the run ID, or list, start or cancel (see aiflowctl graph --help)");
  const tenantKey = tenantOf(ctx.args);
  switch (sub) {
    case "list": {
      const res = await ctx.graph.listRuns({ tenantKey });
      if (ctx.json) printJson(ctx, GraphListSchema, res);
      else
        ctx.out(
          res.runs.length
            ? table(
                ["RUN", "STATUS", "DEFINITION", "AT", "STEPS"],
                res.runs.map((r) => [r.runId, graphStatus(r), r.definitionId, r.task, String(r.steps)]),
              )
            : "no graph runs",
        );
      return 0;
    }
    case "start": {
      const file = ctx.args.positionals[1];
      if (!file) throw new UsageError("give the definition FILE (or - for stdin): aiflowctl graph start FILE --tenant T");
      const definition = await messageFromFile(file, GraphDefinitionSchema);
      const res = await ctx.graph.startRun({ tenantKey, source: { case: "definition", value: definition }, stateJson: ctx.args.get("state") ?? "" });
      if (!ctx.args.has("wait")) {
        if (ctx.json) printJson(ctx, GraphStartSchema, res);
        else ctx.out(res.run!.runId);
        return 0;
      }
      if (!ctx.json) ctx.out(res.run!.runId);
      const ended = await followGraph(ctx, tenantKey, res.run!.runId);
      if (ctx.json) printJson(ctx, GraphStartSchema, create(GraphStartSchema, { run: ended }));
      else
        process.stderr.write(
          `graph run ${ended.runId} ${enumName(RunStatus, ended.status, "RUN_STATUS_")} after ${ended.steps} steps${ended.reason ? `: ${ended.reason}` : ""}${ended.error ? `: ${ended.error}` : ""}\n`,
        );
      return ended.status === RunStatus.COMPLETED ? 0 : 1;
    }
    case "cancel": {
      const res = await ctx.graph.cancelRun({ tenantKey, runId: idOf(ctx.args, "graph cancel ID --tenant T"), reason: ctx.args.get("reason") ?? "" });
      if (ctx.json) printJson(ctx, GraphCancelSchema, res);
      else ctx.out(`graph run ${res.run!.runId} is ${graphStatus(res.run!)}`);
      return 0;
    }
    default: {
      if (ctx.args.positionals.length > 1) throw new UsageError(`unknown graph subcommand '${sub}' (list, start, cancel; or a run ID alone)`);
      const res = await ctx.graph.getRun({ tenantKey, runId: sub });
      if (ctx.json) printJson(ctx, GraphGetSchema, res);
      else ctx.out(graphView(res.run!));
      return 0;
    }
  }
}

async function machine(ctx: Ctx): Promise<number> {
  const sub = ctx.args.positionals[0];
  if (!sub) throw new UsageError("give the run ID, or list, start, signal or cancel (see aiflowctl machine --help)");
  const tenantKey = tenantOf(ctx.args);
  switch (sub) {
    case "list": {
      const res = await ctx.machine.listRuns({ tenantKey });
      if (ctx.json) printJson(ctx, MachineListSchema, res);
      else
        ctx.out(
          res.runs.length
            ? table(
                ["RUN", "STATUS", "DEFINITION", "STATE", "HISTORY"],
                res.runs.map((m) => [m.runId, machineStatus(m), m.definitionId, m.state, walk(m.history, m.historyDropped, "")]),
              )
            : "no machines",
        );
      return 0;
    }
    case "start": {
      const file = ctx.args.positionals[1];
      if (!file) throw new UsageError("give the definition FILE (or - for stdin): aiflowctl machine start FILE --tenant T");
      const definition = await messageFromFile(file, MachineDefinitionSchema);
      const res = await ctx.machine.startRun({ tenantKey, source: { case: "definition", value: definition }, contextJson: ctx.args.get("context") ?? "" });
      if (ctx.json) printJson(ctx, MachineStartSchema, res);
      else ctx.out(res.run!.runId);
      return 0;
    }
    case "signal": {
      const runId = idOf(ctx.args, "machine signal ID EVENT --tenant T");
      const event = ctx.args.positionals[2];
      if (!event) throw new UsageError("give the EVENT: aiflowctl machine signal ID EVENT --tenant T [--payload JSON]");
      const res = await ctx.machine.signalRun({ tenantKey, runId, event, payloadJson: ctx.args.get("payload") ?? "" });
      if (ctx.json) printJson(ctx, SignalRunResponseSchema, res);
      else ctx.out(res.actionStarted ? `${event}: running the action toward ${res.to}` : `${event}: now in ${res.to}${res.run!.live ? "" : " (ended)"}`);
      return 0;
    }
    case "cancel": {
      const res = await ctx.machine.cancelRun({ tenantKey, runId: idOf(ctx.args, "machine cancel ID --tenant T"), reason: ctx.args.get("reason") ?? "" });
      if (ctx.json) printJson(ctx, MachineCancelSchema, res);
      else ctx.out(`machine ${res.run!.runId} is ${machineStatus(res.run!)}`);
      return 0;
    }
    default: {
      if (ctx.args.positionals.length > 1) throw new UsageError(`unknown machine subcommand '${sub}' (list, start, signal, cancel; or a run ID alone)`);
      const res = await ctx.machine.getRun({ tenantKey, runId: sub });
      if (ctx.json) printJson(ctx, MachineGetSchema, res);
      else ctx.out(machineView(res.run!));
      return 0;
    }
  }
}

export const engineCommands: Command[] = [
  {
    name: "graph",
    usage: [
      "  graph ID --tenant T                                               one graph run: where it is, its path, why it stopped",
      "  graph list --tenant T                                             the caller's graph runs, newest first",
      "  graph start FILE --tenant T [--state JSON] [--wait]               start a run of a graph definition (protobuf JSON, - for stdin)",
      "  graph cancel ID --tenant T [--reason TEXT]                        cancel a running graph run",
    ],
    flags: [
      TENANT_FLAG,
      { name: "state", kind: "value", arg: "JSON", help: "start: the run's state, a JSON object", default: "{}" },
      { name: "wait", kind: "bool", help: "start: print each step to stderr until the run ends" },
      { name: "reason", kind: "value", arg: "TEXT", help: "cancel: why, kept on the run", default: "cancelled by <caller>" },
    ],
    exits: ["1 also with start --wait: the run stopped at a bound, failed or was cancelled"],
    role: "runs",
    fields: FIELDS,
    run: graph,
  },
  {
    name: "machine",
    usage: [
      "  machine ID --tenant T                                             one state machine: its state, history, what it waits on",
      "  machine list --tenant T                                           the caller's machines, newest first",
      "  machine start FILE --tenant T [--context JSON]                    start a machine (definition: protobuf JSON, - for stdin)",
      "  machine signal ID EVENT --tenant T [--payload JSON]               apply EVENT to the machine",
      "  machine cancel ID --tenant T [--reason TEXT]                      stop a live machine",
    ],
    flags: [
      TENANT_FLAG,
      { name: "context", kind: "value", arg: "JSON", help: "start: the machine's context, a JSON object", default: "{}" },
      { name: "payload", kind: "value", arg: "JSON", help: "signal: the event's payload", default: "null" },
      { name: "reason", kind: "value", arg: "TEXT", help: "cancel: why, kept on the machine", default: "cancelled by <caller>" },
    ],
    role: "runs",
    fields: FIELDS,
    run: machine,
  },
];
