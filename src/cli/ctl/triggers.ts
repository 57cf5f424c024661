/**
 * aiflowctl's trigger commands (TriggerService, role `runs`): triggers list, get, put, delete. A
 * trigger belongs to its tenant, named with --tenant and checked before anything is sent.
 *
 * A webhook's secret goes one way: `put` sends it, and nothing here ever prints it (the daemon
 * never returns it; reads say only whether one is set). It can come from an environment variable
 * (--secret-env) so that it need not sit in a trigger file that may be committed.
 */
import { timestampMs, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  Action,
  DeleteTriggerResponseSchema,
  GetTriggerResponseSchema,
  ListTriggersResponseSchema,
  PutTriggerResponseSchema,
  TriggerSchema,
  TriggerType,
  type Trigger,
} from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { UsageError, type Parsed } from "./args.js";
import { printJson, type Command, type Ctx } from "./command.js";
import { enumName, table } from "./format.js";
import { messageFromFile } from "./message-file.js";

const USAGE = {
  list: "aiflowctl triggers list --tenant T",
  get: "aiflowctl triggers get NAME --tenant T",
  put: "aiflowctl triggers put FILE --tenant T [--secret-env VAR]",
  delete: "aiflowctl triggers delete NAME --tenant T",
};

function tenantOf(args: Parsed): string {
  const t = args.get("tenant");
  if (!t) throw new UsageError("give the tenant: --tenant T");
  return t;
}

/** The trigger NAME after the subcommand. */
function nameOf(args: Parsed, usage: string): string {
  const name = args.positionals[1];
  if (!name) throw new UsageError(`give the trigger NAME: ${usage}`);
  return name;
}

/** FILE as a Trigger; fromJson's reason may quote a field's value, and the file's secret is one: then say only where it failed. */
const triggerFrom = (path: string): Promise<Trigger> =>
  messageFromFile(path, TriggerSchema, (reason) => (/secret/i.test(reason) ? "its secret is not a string" : reason));

/** The secret named by --secret-env, or undefined when the flag is not given. */
function secretFromEnv(args: Parsed): { secret: string; from: string } | undefined {
  const name = args.get("secret-env");
  if (name === undefined) return undefined;
  const value = process.env[name];
  if (value === undefined) throw new UsageError(`--secret-env: the environment variable ${name} is not set`);
  if (value === "") throw new UsageError(`--secret-env: the environment variable ${name} is empty`);
  return { secret: value, from: name };
}

const typeText = (t: Trigger) => enumName(TriggerType, t.type, "");
const actionText = (t: Trigger) => enumName(Action, t.action, "");
const iso = (ts: Timestamp | undefined) => (ts ? new Date(timestampMs(ts)).toISOString() : "-");

/** What the trigger acts on: the definition it starts, or the event and the run it signals (a fixed id, or read from the webhook's body). */
function targetText(t: Trigger): string {
  if (t.action === Action.START) return t.engineKind && t.engineKind !== "dag" ? `${t.engineKind}:${t.definitionId}` : t.definitionId || "-";
  return `${t.event || "-"} → ${t.runId || (t.runIdPath ? `body.${t.runIdPath}` : "-")}`;
}

const scheduleText = (t: Trigger) => (t.type === TriggerType.CRON ? `${t.schedule} (${t.timeZone || "UTC"})` : "-");
const secretText = (t: Trigger) => (t.type !== TriggerType.WEBHOOK ? "-" : t.hasSecret ? "set" : "none");
const nextText = (t: Trigger) => (t.type !== TriggerType.CRON ? "-" : t.nextFire ? iso(t.nextFire) : "none");

/** The next firing in the trigger's own zone as well, which is how its schedule reads. */
function nextLocal(t: Trigger): string {
  if (!t.nextFire) return nextText(t);
  const zone = t.timeZone || "UTC";
  const local = new Intl.DateTimeFormat("sv-SE", { timeZone: zone, dateStyle: "short", timeStyle: "short" }).format(new Date(timestampMs(t.nextFire)));
  return `${iso(t.nextFire)} (${local} ${zone})`;
}

function triggerRows(ts: readonly Trigger[]): string {
  return table(
    ["NAME", "TYPE", "ACTION", "TARGET", "SCHEDULE", "NEXT FIRE", "OWNER", "SOURCE", "SECRET"],
    ts.map((t) => [t.name, typeText(t), actionText(t), targetText(t), scheduleText(t), nextText(t), t.owner || "-", t.source || "-", secretText(t)]),
  );
}

function triggerView(t: Trigger, tenantKey: string): string {
  const lines: [string, string][] = [[t.action === Action.START ? "definition" : "signal", targetText(t)]];
  if (t.type === TriggerType.CRON) lines.push(["schedule", scheduleText(t)], ["next fire", nextLocal(t)]);
  else lines.push(["hook", `POST /hooks/${tenantKey}/${t.name} on the daemon's HTTP port`], ["secret", t.hasSecret ? "set (never shown)" : "none"]);
  lines.push(["owner", t.owner || "-"], ["source", t.source || "-"], ["created", iso(t.createdOn)], ["updated", iso(t.updatedOn)]);
  const width = Math.max(...lines.map(([k]) => k.length)) + 2;
  return [`trigger ${t.name}  ${typeText(t)}  ${actionText(t)}`, ...lines.map(([k, v]) => `  ${k.padEnd(width)}${v}`)].join("\n");
}

async function put(ctx: Ctx, tenantKey: string): Promise<number> {
  const file = ctx.args.positionals[1];
  if (!file) throw new UsageError(`give the trigger FILE (or - for stdin): ${USAGE.put}`);
  const fromEnv = secretFromEnv(ctx.args);
  const trigger = await triggerFrom(file);
  const where = file === "-" ? "stdin" : file;
  if (fromEnv) {
    if (trigger.secret !== "") throw new UsageError(`${where} has a secret and --secret-env ${fromEnv.from} gives one: give it one way`);
    trigger.secret = fromEnv.secret;
  }
  let res;
  try {
    res = await ctx.triggers.putTrigger({ tenantKey, trigger });
  } catch (err) {
    // The daemon names the trigger's fields ("trigger.schedule: …"): say they are in FILE, or in
    // the variable the secret came from. Its messages give a secret's length, never the secret.
    const e = ConnectError.from(err);
    const m = /^trigger\.(\w+): /.exec(e.rawMessage);
    if (e.code !== Code.InvalidArgument || !m) throw err;
    const rest = e.rawMessage.slice(m[0].length);
    if (m[1] === "secret" && fromEnv) throw new UsageError(`--secret-env ${fromEnv.from}: ${rest}`);
    throw new UsageError(`${where}: ${m[1]}: ${rest}`);
  }
  const t = res.trigger!;
  if (ctx.json) printJson(ctx, PutTriggerResponseSchema, res);
  else ctx.out(`${res.created ? "created" : "replaced"} ${typeText(t)} trigger ${t.name}${t.type === TriggerType.CRON ? `: next fire ${nextLocal(t)}` : ""}`);
  return 0;
}

export const triggerCommands: Command[] = [
  {
    name: "triggers",
    usage: [
      "  triggers list --tenant T                                          the tenant's webhook and cron triggers, by name",
      "  triggers get NAME --tenant T                                      one trigger",
      "  triggers put FILE --tenant T [--secret-env VAR]                   create or replace a trigger (FILE: protobuf JSON, - for stdin)",
      "  triggers delete NAME --tenant T                                   delete a trigger; its firings stay in the log",
    ],
    flags: [
      { name: "tenant", kind: "value", arg: "T", help: "the trigger's tenant (required)" },
      {
        name: "secret-env",
        kind: "value",
        arg: "VAR",
        help: "put: the webhook's secret from the environment variable VAR, not from FILE; a replacement without one keeps the stored secret. The secret is never printed",
      },
    ],
    role: "runs",
    fields: { tenant_key: "--tenant", name: "NAME" },
    async run(ctx) {
      const sub = ctx.args.positionals[0];
      if (!sub || !Object.keys(USAGE).includes(sub))
        throw new UsageError(
          `${sub ? `unknown triggers subcommand '${sub}'` : "give the subcommand"}: list, get, put or delete (see aiflowctl triggers --help)`,
        );
      const tenantKey = tenantOf(ctx.args);
      switch (sub) {
        case "list": {
          const res = await ctx.triggers.listTriggers({ tenantKey });
          if (ctx.json) printJson(ctx, ListTriggersResponseSchema, res);
          else ctx.out(res.triggers.length ? triggerRows(res.triggers) : "no triggers");
          return 0;
        }
        case "get": {
          const res = await ctx.triggers.getTrigger({ tenantKey, name: nameOf(ctx.args, USAGE.get) });
          if (ctx.json) printJson(ctx, GetTriggerResponseSchema, res);
          else ctx.out(triggerView(res.trigger!, tenantKey));
          return 0;
        }
        case "put":
          return put(ctx, tenantKey);
        default: {
          const name = nameOf(ctx.args, USAGE.delete);
          const res = await ctx.triggers.deleteTrigger({ tenantKey, name });
          if (ctx.json) printJson(ctx, DeleteTriggerResponseSchema, res);
          else ctx.out(`deleted trigger ${name}`);
          return 0;
        }
      }
    },
  },
];
