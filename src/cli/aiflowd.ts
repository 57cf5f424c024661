/**
 * aiflowd — the daemon's command line.
 *   aiflowd [serve]   run the daemon (the default)
 *   aiflowd migrate   apply pending migrations and exit
 *   aiflowd token new ROLE   make a bearer token and its tokens-file entry (./token.ts)
 * Exit codes: 0 clean stop, 1 runtime failure, 2 bad configuration or usage.
 */
import { ConfigError, parseArgs, settingsHelp, type Config } from "../config.js";
import { startDaemon } from "../daemon.js";
import { startEmbeddedPostgres } from "../db/embedded.js";
import { migrate, MigrationError } from "../db/migrate.js";
import { createLogger, type Logger } from "../log.js";
import { startTracing } from "../observability/tracing.js";
import { VERSION } from "../util/package-version.js";
import { tokenCommand } from "./token.js";

const USAGE = `aiflowd — gRPC agent-coordination daemon

Usage:
  aiflowd [serve] [flags]    serve gRPC (starts an embedded Postgres when no database URL is given)
  aiflowd migrate [flags]    apply pending schema migrations and exit
  aiflowd token new ROLE     make a bearer token and the tokens-file entry for it (aiflowd token --help)
  aiflowd --help             this text
  aiflowd --version          the version

Every flag can also be set by the environment variable next to it; flags win.
Durations: 500ms, 30s, 5m, 2h, 7d.

Flags:
`;

async function main(argv: string[]): Promise<number> {
  if (argv[0] === "token") {
    if (argv.includes("--version")) {
      process.stdout.write(`aiflowd ${VERSION}\n`);
      return 0;
    }
    try {
      return tokenCommand(argv.slice(1), (text) => process.stdout.write(text));
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      process.stderr.write(`aiflowd: ${err.message}\n`);
      return 2;
    }
  }
  let parsed;
  try {
    parsed = parseArgs(argv);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`aiflowd: ${err.message}\n`);
      return 2;
    }
    throw err;
  }
  const { command = "serve", help, version, config, rest } = parsed;
  if (version) {
    process.stdout.write(`aiflowd ${VERSION}\n`);
    return 0;
  }
  if (help) {
    process.stdout.write(`${USAGE + settingsHelp()}\n`);
    return 0;
  }
  if (rest.length > 0 || !["serve", "migrate"].includes(command)) {
    process.stderr.write(`aiflowd: unknown command '${[command, ...rest].join(" ")}' (see aiflowd --help)\n`);
    return 2;
  }
  const log = createLogger({ level: config.logLevel });
  try {
    return command === "migrate" ? await runMigrate(config, log) : await serve(config, log);
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`aiflowd: ${err.message}\n`);
      return 2;
    }
    if (err instanceof MigrationError) {
      log.fatal(err.message);
      return 1;
    }
    log.fatal({ err }, "aiflowd failed");
    return 1;
  }
}

/** A repeat of the stop signal sooner than this is a relayed copy, not a person asking again. */
const RELAYED_SIGNAL_MS = 1000;

async function serve(config: Config, log: Logger): Promise<number> {
  // The handlers go in before the daemon starts: it logs "serving" from inside startDaemon, and a
  // Ctrl-C that followed that line before they were in killed the process outright (no drain, and
  // an embedded Postgres left running). A signal during start-up stops the daemon once it is up.
  // A second signal skips the drain, but only one sent on purpose: a Ctrl-C under `npm start` reaches
  // the daemon twice within milliseconds (the terminal signals the whole process group, and the
  // wrapper relays its own copy), and that copy once cut the drain short.
  let firstSignalAt: number | undefined;
  let signalled!: () => void;
  const stopAsked = new Promise<void>((resolve) => (signalled = resolve));
  const onSignal = (signal: NodeJS.Signals) => {
    const now = performance.now();
    if (firstSignalAt !== undefined) {
      if (now - firstSignalAt < RELAYED_SIGNAL_MS) {
        log.debug({ signal }, "the stop signal arrived again at once (relayed by a wrapper): already stopping");
        return;
      }
      log.warn({ signal }, "second signal: exiting without waiting");
      process.exit(130);
    }
    firstSignalAt = now;
    log.info({ signal, graceMs: config.shutdownGrace }, "shutting down");
    signalled();
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  // SIGHUP re-reads the TLS files (they are also watched); the reloader logs what it did. In before
  // the start too: unheard, SIGHUP would end the process.
  let daemon: Awaited<ReturnType<typeof startDaemon>> | undefined;
  process.on("SIGHUP", () => void daemon?.reloadTls());
  // Before the daemon is built: its interceptor and dispatch spans trace only when a provider is registered then.
  const tracing = await startTracing({ log, resource: { "service.instance.id": config.instanceId } });
  daemon = await startDaemon(config, { log });
  await stopAsked;
  await daemon.stop();
  // After the daemon: the spans of its last calls go out before the process exits.
  await tracing.shutdown();
  return 0;
}

async function runMigrate(config: Config, log: Logger): Promise<number> {
  const embedded = config.databaseUrl
    ? undefined
    : await startEmbeddedPostgres({ dataDir: config.dataDir, port: config.embeddedPort, log: log.child({ component: "embedded-postgres" }) });
  try {
    const url = config.databaseUrl ?? embedded!.url;
    const { applied, current } = await migrate(url, { schema: config.schema, prefix: config.tablePrefix }, log);
    log.info({ applied, current }, applied.length ? "migrations applied" : "schema already current");
    return 0;
  } finally {
    await embedded?.stop();
  }
}

process.exitCode = await main(process.argv.slice(2));
