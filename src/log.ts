import { createRequire } from "node:module";
import { pino, type DestinationStream, type Logger, type LoggerOptions } from "pino";

export type { Logger };

/**
 * Logs are pino JSON, which log shippers parse; on an interactive terminal they are pretty-printed.
 * pino-pretty runs in-process (not as a transport worker) so nothing outlives a Ctrl-C.
 */
export function createLogger(opts: { level: string; pretty?: boolean; name?: string; destination?: DestinationStream }): Logger {
  const base: LoggerOptions = { ...LOG_OPTIONS, level: opts.level, name: opts.name ?? "aiflowd" };
  if (opts.destination) return pino(base, opts.destination);
  const pretty = opts.pretty ?? (process.stdout.isTTY === true && !process.env.NO_COLOR);
  return pretty ? pino(base, prettyStream()) : pino(base);
}

/** What every daemon logger keeps out of its lines. */
export const LOG_OPTIONS = {
  // Bearer tokens must never reach a log line, whatever a caller attaches.
  redact: { paths: ["token", "*.token", "authorization", "*.authorization"], censor: "[redacted]" },
  serializers: { err: errorForLog },
} satisfies LoggerOptions;

/** Keys of a database error that hold what the statement carried: callers' payloads, results, metadata. */
const VALUE_KEYS = ["values", "row", "detail", "where", "hint", "internalQuery", "query"];
/** What a database error may say in a log: its SQLSTATE and where Postgres raised it, never a value. */
const SAFE_DB_KEYS = ["code", "severity", "routine", "file", "line", "position", "constraint", "table", "column", "schema", "dataType"];

/**
 * An error as a log line holds it. A database error's message, detail and context quote the values
 * of the statement ("JSON data, line 1: {\"api_key\": …"), and slonik's errors carry the bound
 * values and rows: of those only the SQLSTATE, the raising routine and the constraint, table and
 * column names are kept (a schema error keeps its issues' paths). Other errors keep their type,
 * message and stack; causes are treated alike, a few levels deep.
 */
export function errorForLog(err: unknown, depth = 0): unknown {
  if (err === null || typeof err !== "object") return err;
  const e = err as Record<string, unknown>;
  const type = (err as object).constructor?.name ?? "Error";
  const cause = depth < 4 && e.cause !== undefined ? errorForLog(e.cause, depth + 1) : undefined;
  if (VALUE_KEYS.some((k) => k in e) || (typeof e.severity === "string" && typeof e.routine === "string")) {
    const out: Record<string, unknown> = { type, redacted: "database error: values omitted" };
    for (const k of SAFE_DB_KEYS) if (e[k] !== undefined && e[k] !== null) out[k] = e[k];
    if (Array.isArray(e.issues)) out.issues = e.issues.map((i: { path?: unknown; code?: unknown }) => ({ path: i?.path, code: i?.code }));
    if (cause !== undefined) out.cause = cause;
    return out;
  }
  const out: Record<string, unknown> = { type, message: e.message, stack: e.stack };
  for (const k of ["code", "errno", "syscall", "address", "port", "kind"]) if (e[k] !== undefined) out[k] = e[k];
  if (cause !== undefined) out.cause = cause;
  return out;
}

function prettyStream(): DestinationStream {
  // Loaded only on a terminal; CommonJS, hence createRequire.
  const pretty = createRequire(import.meta.url)("pino-pretty") as (o: object) => DestinationStream;
  return pretty({ colorize: true, translateTime: "SYS:HH:MM:ss.l", ignore: "pid,hostname" });
}

/** A logger that discards everything, for tests that do not inspect logs. */
export const silentLogger = (): Logger => pino({ ...LOG_OPTIONS, level: "silent" });
