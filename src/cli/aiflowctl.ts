/**
 * aiflowctl — the operator's command line for aiflowd, built on the generated Connect client. The
 * commands live in ./ctl/ by what they act on (agents, work, bindings, concurrency keys, tenants'
 * fair-share weights, rate limits, DAG runs, triggers); each carries its flags, defaults and exit
 * codes, from which `--help` is written.
 * Exit codes: 0 success, 1 the daemon refused or failed, 2 usage, 3 a drain deadline gave work back.
 */
import { createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { DagService } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { TriggerService } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { agentCommands } from "./ctl/agents.js";
import { parseFlags, UsageError } from "./ctl/args.js";
import { bindingCommands } from "./ctl/bindings.js";
import { durationFlag, flagKinds, type Command } from "./ctl/command.js";
import { explain } from "./ctl/errors.js";
import { commandHelp, GLOBAL, mainHelp } from "./ctl/help.js";
import { keyCommands } from "./ctl/keys.js";
import { limitCommands } from "./ctl/limits.js";
import { runCommands } from "./ctl/runs.js";
import { tenantCommands } from "./ctl/tenants.js";
import { tlsChoice, type TlsChoice } from "./ctl/tls.js";
import { triggerCommands } from "./ctl/triggers.js";
import { engineCommands } from "./ctl/engines.js";
import { definitionCommands } from "./ctl/definitions.js";
import { GraphService } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { MachineService } from "@aiflow/wire/gen/aiflow/machine/v1/machine_pb.js";
import { workCommands } from "./ctl/work.js";
import { VERSION } from "../util/package-version.js";

const COMMANDS: readonly Command[] = [
  ...agentCommands,
  ...workCommands,
  ...bindingCommands,
  ...keyCommands,
  ...tenantCommands,
  ...limitCommands,
  ...runCommands,
  ...engineCommands,
  ...definitionCommands,
  ...triggerCommands,
];

export async function main(argv: readonly string[], env = process.env, out = (t: string) => process.stdout.write(`${t}\n`)): Promise<number> {
  const at = argv.findIndex((a) => !a.startsWith("--") && !isGlobalValue(argv, a));
  const name = at >= 0 ? argv[at] : undefined;
  const spec = name ? COMMANDS.find((c) => c.name === name) : undefined;
  const own = spec ? flagKinds(spec.flags) : { bool: [], value: [], repeat: [] };
  // A command's own flag wins over a global switch of the same name after the command (agents
  // --version V filters by agent version); before the command the global one still stands
  // (aiflowctl --version agents prints aiflowctl's version).
  const shadowed = spec ? GLOBAL.bool.filter((f) => own.value.includes(f) || own.repeat.includes(f)) : [];
  const fail = (message: string, exit: number) => (process.stderr.write(`aiflowctl: ${message}\n`), exit);
  let args;
  try {
    if (shadowed.includes("version") && argv.slice(0, at).includes("--version")) return (out(`aiflowctl ${VERSION}`), 0);
    args = parseFlags(argv, {
      bool: [...GLOBAL.bool.filter((f) => !shadowed.includes(f)), ...own.bool],
      value: [...GLOBAL.value, ...own.value],
      repeat: [...GLOBAL.repeat, ...own.repeat],
    });
    if (!shadowed.includes("version") && args.has("version")) return (out(`aiflowctl ${VERSION}`), 0);
    if (!name) {
      out(mainHelp(COMMANDS));
      return args.has("help") ? 0 : 2;
    }
    if (!spec) throw new UsageError(`unknown command '${name}' (see aiflowctl --help)`);
    if (args.has("help")) return (out(commandHelp(spec)), 0);
  } catch (err) {
    if (err instanceof UsageError) return fail(err.message, 2);
    throw err;
  }
  args.positionals.shift();
  const address = args.get("address") ?? env.AIFLOW_ADDRESS ?? "127.0.0.1:7400";
  const token = args.get("token") ?? env.AIFLOW_TOKEN;
  const tokenFrom = args.get("token") !== undefined ? "--token" : env.AIFLOW_TOKEN !== undefined ? "AIFLOW_TOKEN" : undefined;
  let tls: TlsChoice["given"];
  try {
    const timeoutMs = durationFlag(args, "timeout", "15s");
    const choice = tlsChoice(address, args, env);
    tls = choice.given;
    const auth: Interceptor = (next) => (req) => {
      if (token) req.header.set("authorization", `Bearer ${token}`);
      return next(req);
    };
    const transport = createGrpcTransport({ baseUrl: choice.baseUrl, nodeOptions: choice.nodeOptions, interceptors: [auth], defaultTimeoutMs: timeoutMs });
    return await spec.run({
      args,
      json: args.has("json"),
      address,
      ops: createClient(OpsService, transport),
      queue: createClient(QueueService, transport),
      dag: createClient(DagService, transport),
      triggers: createClient(TriggerService, transport),
      graph: createClient(GraphService, transport),
      machine: createClient(MachineService, transport),
      out,
    });
  } catch (err) {
    if (err instanceof UsageError) return fail(err.message, 2);
    const { message, exit } = explain(err, spec, { address, tokenFrom, tls });
    return fail(message, exit);
  }
}

/** True when `a` is the value of a global value flag (`--address X`), not a command. */
function isGlobalValue(argv: readonly string[], a: string): boolean {
  const i = argv.indexOf(a);
  return i > 0 && (GLOBAL.value as readonly string[]).includes(argv[i - 1]!.replace(/^--/, ""));
}
