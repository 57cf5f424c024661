/** aiflowctl's help: the command list, and one command's usage, flags and exit codes. */
import { flagKinds, type Command, type Flag } from "./command.js";

export const GLOBAL_FLAGS: Flag[] = [
  {
    name: "address",
    kind: "value",
    arg: "HOST:PORT",
    help: "daemon address (env AIFLOW_ADDRESS); https://HOST:PORT for TLS, which any --tls-* flag implies",
    default: "127.0.0.1:7400",
  },
  {
    name: "token",
    kind: "value",
    arg: "TOKEN",
    help: "bearer token (env AIFLOW_TOKEN): ops role; engine role for enqueue; runs role for runs, run, graph, machine, definitions and triggers; optional under mutual TLS with a certificate naming spiffe://…/ops/NAME (…/runs/NAME for runs, run, graph, machine, definitions and triggers)",
  },
  {
    name: "tls-ca",
    kind: "value",
    arg: "FILE",
    help: "PEM CA bundle the daemon's certificate is checked against (env AIFLOW_TLS_CA); default: Node's public CAs",
  },
  { name: "tls-cert", kind: "value", arg: "FILE", help: "PEM client certificate for mutual TLS, with --tls-key (env AIFLOW_TLS_CERT)" },
  { name: "tls-key", kind: "value", arg: "FILE", help: "PEM private key of --tls-cert (env AIFLOW_TLS_KEY)" },
  { name: "timeout", kind: "value", arg: "D", help: "how long one call may take", default: "15s" },
  { name: "json", kind: "bool", help: "print data as JSON (every data command)" },
  { name: "help", kind: "bool", help: "this text, or COMMAND --help" },
  { name: "version", kind: "bool", help: "print aiflowctl's version (before COMMAND; agents --version V filters agents by version)" },
];
export const GLOBAL = flagKinds(GLOBAL_FLAGS);

const EXITS = [
  "0 success",
  "1 the daemon refused or failed, or could not be reached",
  "2 usage: a bad flag or value (nothing was sent, or the daemon refused the value)",
];

function flagLines(flags: readonly Flag[]): string[] {
  const left = (f: Flag) => `  --${f.name}${f.arg ? ` ${f.arg}` : ""}${f.kind === "repeat" ? " (repeatable)" : ""}`;
  const width = Math.max(...flags.map((f) => left(f).length)) + 2;
  return flags.map((f) => `${left(f).padEnd(width)}${f.help}${f.default ? `; default: ${f.default}` : ""}`);
}

export function mainHelp(commands: readonly Command[]): string {
  return [
    "aiflowctl — operate an aiflowd fleet",
    "",
    "Usage: aiflowctl [--address HOST:PORT] [--token TOKEN] [--tls-ca FILE [--tls-cert FILE --tls-key FILE]] COMMAND [flags]",
    "",
    "Commands:",
    ...commands.flatMap((c) => c.usage),
    "",
    "Global flags:",
    ...flagLines(GLOBAL_FLAGS),
    "",
    "Exit codes: 0 success, 1 the daemon refused or failed, 2 usage, 3 a drain deadline gave work back.",
    "aiflowctl COMMAND --help shows a command's flags, defaults and exit codes.",
    "",
  ].join("\n");
}

export function commandHelp(c: Command): string {
  return [
    `Usage: aiflowctl [--address HOST:PORT] [--token TOKEN] ${c.name} [flags]`,
    "",
    ...c.usage,
    ...(c.flags.length ? ["", "Flags:", ...flagLines(c.flags)] : []),
    "",
    "Global flags:",
    ...flagLines(GLOBAL_FLAGS),
    "",
    `Needs a token with role '${c.role ?? "ops"}'.`,
    "",
    "Exit codes:",
    ...[...EXITS.filter((e) => !c.exits?.some((x) => x[0] === e[0] && !x.includes(" also "))), ...(c.exits ?? [])].sort().map((e) => `  ${e}`),
    "",
  ].join("\n");
}
