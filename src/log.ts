import { createRequire } from "node:module";
import { pino, type DestinationStream, type Logger, type LoggerOptions } from "pino";

export type { Logger };

/**
 * Logs are pino JSON, which log shippers parse; on an interactive terminal they are pretty-printed.
 * pino-pretty runs in-process (not as a transport worker) so nothing outlives a Ctrl-C.
 */
export function createLogger(opts: { level: string; pretty?: boolean; name?: string }): Logger {
  const base: LoggerOptions = {
    level: opts.level,
    name: opts.name ?? "aiflowd",
    // Bearer tokens must never reach a log line, whatever a caller attaches.
    redact: { paths: ["token", "*.token", "authorization", "*.authorization"], censor: "[redacted]" },
  };
  const pretty = opts.pretty ?? (process.stdout.isTTY === true && !process.env.NO_COLOR);
  return pretty ? pino(base, prettyStream()) : pino(base);
}

function prettyStream(): DestinationStream {
  // Loaded only on a terminal; CommonJS, hence createRequire.
  const pretty = createRequire(import.meta.url)("pino-pretty") as (o: object) => DestinationStream;
  return pretty({ colorize: true, translateTime: "SYS:HH:MM:ss.l", ignore: "pid,hostname" });
}

/** A logger that discards everything, for tests that do not inspect logs. */
export const silentLogger = (): Logger => pino({ level: "silent" });
