/**
 * aiflowctl's DAG-run commands (DagService, role `runs`): runs list; run ID, run start, cancel,
 * resume, signal. Every call names its tenant with --tenant, checked before anything is sent. A
 * run is the caller's own: another token's run is "not found", like an id that does not exist.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  CancelRunResponseSchema,
  DefinitionSchema,
  GetRunResponseSchema,
  ListRunsResponseSchema,
  ResumeRunResponseSchema,
  RunStatus,
  SignalRunResponseSchema,
  StartRunResponseSchema,
  type Definition,
  type NodeStatus,
  type Run,
} from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { UsageError, type Parsed } from "./args.js";
import { printJson, wholeFlag, type Command, type Ctx } from "./command.js";
import { status } from "./format.js";
import { messageFromFile } from "./message-file.js";
import { endLine, progressLines, runRows, runStatus, runTree } from "./run-view.js";

/** ListRuns' largest page. */
const PAGE_MAX = 500;

const RUN_FIELDS = {
  tenant_key: "--tenant",
  run_id: "ID",
  definition_id: "--definition",
  "statuses[0]": "--status",
  page_token: "--page-token",
  context_json: "--context",
  idempotency_key: "--idempotency-key",
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

function runStatusesOf(names: readonly string[]): RunStatus[] {
  return names.map((n) => {
    const v = (RunStatus as unknown as Record<string, number>)[n.toUpperCase()];
    if (v === undefined || v === 0) throw new UsageError(`unknown run status '${n}' (running, completed, failed, cancelled)`);
    return v as RunStatus;
  });
}

/** FILE as aiflow.dag.v1.Definition in protobuf JSON (`-`: stdin). */
const definitionFrom = (path: string): Promise<Definition> => messageFromFile(path, DefinitionSchema);

/** The run ID after the subcommand's name. */
function idOf(args: Parsed, usage: string): string {
  const id = args.positionals[1];
  if (!id) throw new UsageError(`give the run ID: aiflowctl ${usage}`);
  return id;
}

/**
 * Follows the run with WatchRun until it ends, writing a line to stderr for each node status change.
 * A stream that ends while the run still runs (its daemon shutting down) is watched again.
 */
async function follow(ctx: Ctx, tenantKey: string, runId: string): Promise<Run> {
  const seen = new Map<string, NodeStatus>();
  for (;;) {
    // No deadline: the run takes as long as it takes; --timeout bounds each unary call only.
    for await (const m of ctx.dag.watchRun({ tenantKey, runId }, { timeoutMs: 0 })) {
      const run = m.run!;
      for (const line of progressLines(run, seen)) process.stderr.write(`${line}\n`);
      if (run.status !== RunStatus.RUNNING) return (await ctx.dag.getRun({ tenantKey, runId })).run!;
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function start(ctx: Ctx, tenantKey: string): Promise<number> {
  const file = ctx.args.positionals[1];
  if (!file) throw new UsageError("give the definition FILE (or - for stdin): aiflowctl run start FILE --tenant T");
  const definition = await definitionFrom(file);
  const key = ctx.args.get("idempotency-key") ?? "";
  let res;
  try {
    res = await ctx.dag.startRun({
      tenantKey,
      source: { case: "definition", value: definition },
      contextJson: ctx.args.get("context") ?? "",
      idempotencyKey: key,
    });
  } catch (err) {
    // The daemon names a definition's faults by node ("node 'a'.depends_on: …"): say they are in FILE.
    const e = ConnectError.from(err);
    if (e.code === Code.InvalidArgument && /^(definition|node )/.test(e.rawMessage)) throw new UsageError(`${file === "-" ? "stdin" : file}: ${e.rawMessage}`);
    throw err;
  }
  const run = res.run!;
  if (res.existing) process.stderr.write(`run ${run.id} was started before with idempotency key '${key}': nothing new started\n`);
  if (!ctx.args.has("wait")) {
    if (ctx.json) printJson(ctx, StartRunResponseSchema, res);
    else ctx.out(run.id);
    return 0;
  }
  if (!ctx.json) ctx.out(run.id);
  const ended = await follow(ctx, tenantKey, run.id);
  if (ctx.json) printJson(ctx, StartRunResponseSchema, create(StartRunResponseSchema, { run: ended, existing: res.existing }));
  else process.stderr.write(`${endLine(ended)}\n`);
  return ended.status === RunStatus.COMPLETED ? 0 : 1;
}

export const runCommands: Command[] = [
  {
    name: "runs",
    usage: ["  runs list --tenant T [--status S]... [--definition ID] [--limit N]  DAG runs, newest first"],
    flags: [
      TENANT_FLAG,
      { name: "status", kind: "repeat", arg: "S", help: "only runs in this status: running, completed, failed, cancelled" },
      { name: "definition", kind: "value", arg: "ID", help: "only runs of this definition id" },
      { name: "limit", kind: "value", arg: "N", help: "at most N runs, read page by page", default: "50" },
      { name: "page-token", kind: "value", arg: "TOKEN", help: "start after the runs that printed it" },
    ],
    role: "runs",
    fields: RUN_FIELDS,
    async run(ctx) {
      if (ctx.args.positionals[0] !== "list") throw new UsageError("usage: aiflowctl runs list --tenant T [--status S]... [--definition ID] [--limit N]");
      const tenantKey = tenantOf(ctx.args);
      const statuses = runStatusesOf(ctx.args.all("status"));
      const limit = wholeFlag(ctx.args, "limit", 50);
      if (limit < 1) throw new UsageError("--limit must be at least 1");
      const definitionId = ctx.args.get("definition") ?? "";
      const runs: Run[] = [];
      let pageToken = ctx.args.get("page-token") ?? "";
      // Each page asks for no more than is still wanted, so the last token is exactly where --limit stopped.
      do {
        const res = await ctx.dag.listRuns({ tenantKey, statuses, definitionId, pageSize: Math.min(PAGE_MAX, limit - runs.length), pageToken });
        runs.push(...res.runs);
        pageToken = res.nextPageToken;
      } while (pageToken && runs.length < limit);
      if (ctx.json) printJson(ctx, ListRunsResponseSchema, create(ListRunsResponseSchema, { runs, nextPageToken: pageToken }));
      else ctx.out((runs.length ? runRows(runs) : "no runs") + (pageToken ? `\nmore: --page-token ${pageToken} (or a larger --limit)` : ""));
      return 0;
    },
  },
  {
    name: "run",
    usage: [
      "  run ID --tenant T [--all]                                         one run: its nodes and their attempts",
      "  run start FILE --tenant T [--context JSON] [--idempotency-key K] [--wait]",
      "                                                                    start a run of a definition (FILE: protobuf JSON, - for stdin)",
      "  run cancel ID --tenant T [--reason TEXT]                          cancel a running run and the work its agents hold",
      "  run resume ID --tenant T                                          run a failed run's failed nodes again",
      "  run signal ID EVENT --tenant T [--payload JSON]                   deliver EVENT to the run's wait node",
    ],
    flags: [
      TENANT_FLAG,
      { name: "all", kind: "bool", help: "ID: every attempt of a large fan-out, not only the failed and running ones" },
      { name: "context", kind: "value", arg: "JSON", help: "start: the run context, a JSON object", default: "{}" },
      {
        name: "idempotency-key",
        kind: "value",
        arg: "K",
        help: "start: a run started before with K (by this token, in this tenant) is returned, not started again",
      },
      { name: "wait", kind: "bool", help: "start: print node changes to stderr until the run ends" },
      { name: "reason", kind: "value", arg: "TEXT", help: "cancel: why, kept on the run", default: "cancelled by <caller>" },
      { name: "payload", kind: "value", arg: "JSON", help: "signal: the event's payload, the wait node's result", default: "null" },
    ],
    exits: ["0 success (start --wait: the run completed)", "1 also with start --wait: the run failed or was cancelled"],
    role: "runs",
    fields: RUN_FIELDS,
    async run(ctx) {
      const sub = ctx.args.positionals[0];
      if (!sub) throw new UsageError("give the run ID, or start, cancel, resume or signal (see aiflowctl run --help)");
      const tenantKey = tenantOf(ctx.args);
      switch (sub) {
        case "start":
          return start(ctx, tenantKey);
        case "cancel": {
          const res = await ctx.dag.cancelRun({ tenantKey, runId: idOf(ctx.args, "run cancel ID --tenant T"), reason: ctx.args.get("reason") ?? "" });
          if (ctx.json) printJson(ctx, CancelRunResponseSchema, res);
          else ctx.out(`run ${res.run!.id} is ${status(runStatus(res.run!.status))}`);
          return 0;
        }
        case "resume": {
          const res = await ctx.dag.resumeRun({ tenantKey, runId: idOf(ctx.args, "run resume ID --tenant T") });
          if (ctx.json) printJson(ctx, ResumeRunResponseSchema, res);
          else ctx.out(`run ${res.run!.id} is ${status(runStatus(res.run!.status))}`);
          return 0;
        }
        case "signal": {
          const runId = idOf(ctx.args, "run signal ID EVENT --tenant T");
          const event = ctx.args.positionals[2];
          if (!event) throw new UsageError("give the EVENT: aiflowctl run signal ID EVENT --tenant T [--payload JSON]");
          const res = await ctx.dag.signalRun({ tenantKey, runId, event, payloadJson: ctx.args.get("payload") ?? "" });
          const now = `run ${res.run!.id} is ${status(runStatus(res.run!.status))}`;
          if (ctx.json) printJson(ctx, SignalRunResponseSchema, res);
          else ctx.out(res.delivered ? `delivered ${event}: ${now}` : `kept ${event} for its wait node, not reached yet: ${now}`);
          return 0;
        }
        default: {
          if (ctx.args.positionals.length > 1) throw new UsageError(`unknown run subcommand '${sub}' (start, cancel, resume, signal; or a run ID alone)`);
          const res = await ctx.dag.getRun({ tenantKey, runId: sub });
          if (ctx.json) printJson(ctx, GetRunResponseSchema, res);
          else ctx.out(runTree(res.run!, ctx.args.has("all")));
          return 0;
        }
      }
    },
  },
];
