/**
 * A small flag parser for aiflowctl: `--flag value`, `--flag=value`, repeatable flags, boolean
 * switches, and positionals. Unknown flags are usage errors (exit 2), so typos never act silently.
 */
export class UsageError extends Error {
  override name = "UsageError";
}

export interface FlagSpec {
  /** Boolean switches take no value. */
  bool?: readonly string[];
  /** Flags that take a value; repeatable ones collect every occurrence. */
  value?: readonly string[];
  repeat?: readonly string[];
}

export interface Parsed {
  positionals: string[];
  flags: Map<string, string[]>;
  has(flag: string): boolean;
  get(flag: string): string | undefined;
  all(flag: string): string[];
}

export function parseFlags(argv: readonly string[], spec: FlagSpec): Parsed {
  const bool = new Set(spec.bool ?? []);
  const value = new Set([...(spec.value ?? []), ...(spec.repeat ?? [])]);
  const flags = new Map<string, string[]>();
  const positionals: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (!arg.startsWith("--") || arg === "--") {
      positionals.push(arg);
      continue;
    }
    const eq = arg.indexOf("=");
    const name = (eq >= 0 ? arg.slice(2, eq) : arg.slice(2)).trim();
    if (bool.has(name)) {
      flags.set(name, ["true"]);
      continue;
    }
    if (!value.has(name)) throw new UsageError(`unknown flag --${name}`);
    const v = eq >= 0 ? arg.slice(eq + 1) : argv[++i];
    if (v === undefined) throw new UsageError(`--${name} needs a value`);
    flags.set(name, [...(flags.get(name) ?? []), v]);
  }
  return {
    positionals,
    flags,
    has: (f) => flags.has(f),
    get: (f) => flags.get(f)?.at(-1),
    all: (f) => flags.get(f) ?? [],
  };
}

/** Parses KEY=VALUE pairs (tags, selectors). */
export function keyValues(pairs: readonly string[], flag: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const p of pairs) {
    const eq = p.indexOf("=");
    if (eq <= 0) throw new UsageError(`--${flag} takes KEY=VALUE, got '${p}'`);
    out[p.slice(0, eq)] = p.slice(eq + 1);
  }
  return out;
}
