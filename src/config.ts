/**
 * All configuration. Every setting has a flag, an AIFLOW_* environment variable and a default, held
 * in the tables of ./config/ by area (serving, database, instance, queue, engines, intake, limits),
 * assembled in ./config/settings.ts, their values' parsers in ./config/parsers.ts; `aiflowd --help`
 * prints that table. Here: argv and the environment read through it into a Config. Flags win over
 * the environment, which wins over defaults. A bad value is a ConfigError naming the setting; the
 * CLI prints it on one line and exits 2.
 */
import { hostname } from "node:os";
import { readFileSync } from "node:fs";
import { ConfigError } from "./domain/errors.js";
import { parseTokensFile, type TokenGrant } from "./domain/tokens.js";
import { SETTINGS, type Setting } from "./config/settings.js";

export { ConfigError };
export { formatAddress, parseDuration, redactDatabaseUrl, type ListenAddress } from "./config/parsers.js";

type Settings = typeof SETTINGS;
type Parsed = {
  [K in keyof Settings]: Settings[K] extends { repeatable: true }
    ? ReturnType<Settings[K]["parse"]>[]
    : Settings[K]["default"] extends string
      ? ReturnType<Settings[K]["parse"]>
      : ReturnType<Settings[K]["parse"]> | undefined;
};

export interface Config extends Omit<Parsed, "tokens" | "instanceId"> {
  instanceId: string;
  /** Every grant from --token, AIFLOW_TOKENS and --tokens-file. Empty means the daemon runs open. */
  tokens: TokenGrant[];
}

export interface ParsedArgs {
  command: string | undefined;
  help: boolean;
  /** `--version` was given. */
  version: boolean;
  config: Config;
  /** Arguments that were not settings, after the command. */
  rest: string[];
}

/** Parses argv (without node and script) and the environment into a Config. Throws ConfigError. */
export function parseArgs(argv: readonly string[], env: NodeJS.ProcessEnv = process.env): ParsedArgs {
  const byFlag = new Map<string, keyof Settings>(Object.entries(SETTINGS).map(([k, s]) => [s.flag, k as keyof Settings]));
  const fromFlags = new Map<keyof Settings, string[]>();
  let command: string | undefined;
  let help = false;
  let version = false;
  const rest: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--help" || arg === "-h") {
      help = true;
      continue;
    }
    if (arg === "--version") {
      version = true;
      continue;
    }
    if (arg.startsWith("--")) {
      const eq = arg.indexOf("=");
      const flag = eq >= 0 ? arg.slice(0, eq) : arg;
      const key = byFlag.get(flag);
      if (!key) throw new ConfigError(flag, "unknown flag (see --help)");
      const value = eq >= 0 ? arg.slice(eq + 1) : (SETTINGS[key] as Setting<unknown>).switch ? "true" : argv[++i];
      if (value === undefined) throw new ConfigError(flag, "needs a value");
      fromFlags.set(key, [...(fromFlags.get(key) ?? []), value]);
      continue;
    }
    if (command === undefined) command = arg;
    else rest.push(arg);
  }

  const out: Record<string, unknown> = {};
  for (const [key, s] of Object.entries(SETTINGS) as [keyof Settings, Setting<unknown>][]) {
    const flagValues = fromFlags.get(key);
    const envName = s.env.find((e) => env[e] !== undefined && env[e] !== "");
    const name = flagValues ? s.flag : (envName ?? s.flag);
    if (s.repeatable) {
      const raws = flagValues ?? (envName ? env[envName]!.split(/[;\s]+/).filter(Boolean) : []);
      out[key] = raws.map((r) => s.parse(r, name));
      continue;
    }
    const raw = flagValues ? flagValues[flagValues.length - 1] : envName ? env[envName] : s.default;
    out[key] = raw === undefined ? undefined : s.parse(raw, name);
  }
  const parsed = out as Parsed;
  const tokens = [...parsed.tokens];
  if (parsed.tokensFile) tokens.push(...readTokensFile(parsed.tokensFile));
  const config: Config = {
    ...parsed,
    tokens,
    // Port 0 binds a random port, so HOST:0 would not tell instances on one host apart.
    instanceId: parsed.instanceId ?? `${hostname()}:${parsed.listen.port === 0 ? `pid${process.pid}` : parsed.listen.port}`,
  };
  if (config.backoffCap < config.backoffBase) throw new ConfigError("--backoff-cap", "is smaller than --backoff-base");
  if ((config.tlsCert === undefined) !== (config.tlsKey === undefined))
    throw new ConfigError(config.tlsCert ? "--tls-key" : "--tls-cert", "--tls-cert and --tls-key go together");
  if (config.tlsClientCa !== undefined && config.tlsCert === undefined)
    throw new ConfigError("--tls-client-ca", "mutual TLS needs TLS: give --tls-cert and --tls-key too");
  if (config.insecurePlaintext && config.tlsCert !== undefined) throw new ConfigError("--insecure-plaintext", "contradicts --tls-cert: say one or the other");
  // A heartbeat buffered for longer than the liveness window would let a live agent be marked inactive.
  if (config.heartbeatFlush >= config.livenessIntervals * config.heartbeatInterval)
    throw new ConfigError("--heartbeat-flush", "must be shorter than --liveness-intervals × --heartbeat-interval");
  return { command, help, version, config, rest };
}

function readTokensFile(path: string): TokenGrant[] {
  let body: string;
  try {
    body = readFileSync(path, "utf8");
  } catch (err) {
    throw new ConfigError("--tokens-file", `cannot read ${path}: ${(err as Error).message}`);
  }
  return parseTokensFile(body, "--tokens-file");
}

/** The settings table for --help: flag, env vars, default, description. */
export function settingsHelp(): string {
  const rows = Object.values(SETTINGS).map((s: Setting<unknown>) => [
    s.switch ? s.flag : `${s.flag} ${s.repeatable ? "SPEC" : "VALUE"}`,
    s.env.join(", "),
    s.default ?? "",
    s.help,
  ]);
  const widths = [0, 1, 2].map((c) => Math.max(...rows.map((r) => r[c]!.length)));
  return rows.map((r) => r.map((cell, c) => (c < 3 ? cell.padEnd(widths[c]!) : cell)).join("  ")).join("\n");
}

/**
 * Config for tests and embedders: the defaults, except that the HTTP endpoints are off unless
 * asked for (`httpListen`): an embedding process, or a test starting several daemons, opens no
 * port it did not name.
 */
export function defaultConfig(overrides: Partial<Config> = {}): Config {
  return { ...parseArgs([], {}).config, httpListen: null, ...overrides };
}
