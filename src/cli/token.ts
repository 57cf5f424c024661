/**
 * `aiflowd token new ROLE [--name NAME] [--tenants T,…] [--agents P,…] [--json]`: a fresh random
 * token, and the tokens-file entry that grants it, holding only its SHA-256 (the file is then not a
 * credential; the token goes to the caller and nowhere else). Nothing is written or logged.
 */
import { ConfigError } from "../domain/errors.js";
import { isIdentifierText } from "../domain/names.js";
import { isAgentPattern, newToken, ROLES, tokenDigest, type Role } from "../domain/tokens.js";

export const TOKEN_USAGE = `aiflowd token new ROLE [flags] — make a bearer token for ROLE (${ROLES.join("|")})

Prints the token (give it to the caller; it is shown once and kept nowhere) and the entry to add
to the --tokens-file array, which holds the token's SHA-256, not the token.

Flags:
  --name NAME       who the caller is in audit records and createdby (default ROLE-<fingerprint>)
  --tenants T,...   limit the token to these tenants
  --agents P,...    agent tokens: the agent names it may act as (exact, or a prefix ending in '*')
  --json            print {"token": …, "entry": …} as one JSON line
  --help            this text
`;

/** Runs the command; returns the exit code. */
export function tokenCommand(argv: readonly string[], out: (text: string) => void): number {
  if (argv.includes("--help") || argv.includes("-h")) {
    out(TOKEN_USAGE);
    return 0;
  }
  const [verb, role, ...rest] = argv;
  if (verb !== "new") throw new ConfigError("token", `unknown subcommand '${verb ?? ""}': use 'aiflowd token new ROLE' (see aiflowd token --help)`);
  if (!role || !(ROLES as readonly string[]).includes(role)) throw new ConfigError("token new", `ROLE must be one of ${ROLES.join("|")}`);
  const flags = new Map<string, string>();
  let json = false;
  for (let i = 0; i < rest.length; i++) {
    const arg = rest[i]!;
    if (arg === "--json") {
      json = true;
      continue;
    }
    const [flag, inline] = arg.includes("=") ? [arg.slice(0, arg.indexOf("=")), arg.slice(arg.indexOf("=") + 1)] : [arg, undefined];
    if (!["--name", "--tenants", "--agents"].includes(flag)) throw new ConfigError(flag, "unknown flag (see aiflowd token --help)");
    const value = inline ?? rest[++i];
    if (value === undefined) throw new ConfigError(flag, "needs a value");
    flags.set(flag, value);
  }
  const token = newToken();
  const entry: Record<string, unknown> = { role: role as Role, sha256: tokenDigest(token) };
  const name = flags.get("--name");
  if (name !== undefined) {
    if (!isIdentifierText(name)) throw new ConfigError("--name", `'${name}' is not a name (letters, digits, '.', '-', '_')`);
    entry.name = name;
  }
  const tenants = flags.get("--tenants");
  if (tenants !== undefined) entry.tenants = tenants.split(",").filter(Boolean);
  const agents = flags.get("--agents");
  if (agents !== undefined) {
    if (role !== "agent") throw new ConfigError("--agents", "applies to agent tokens only");
    const patterns = agents.split(",").filter(Boolean);
    if (patterns.length === 0 || !patterns.every(isAgentPattern))
      throw new ConfigError("--agents", "must be agent names, each exact or a prefix ending in '*' (gpu-*)");
    entry.agents = patterns;
  }
  if (json) out(`${JSON.stringify({ token, entry })}\n`);
  else out(`token (give it to the caller; it is not shown again):\n  ${token}\n\nadd to the --tokens-file array:\n  ${JSON.stringify(entry)}\n`);
  return 0;
}
