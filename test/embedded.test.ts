import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { readFile, writeFile } from "node:fs/promises";
import net from "node:net";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { pino, type Logger } from "pino";
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import { startEmbeddedPostgres, type EmbeddedPostgres } from "../src/db/embedded.js";
import { freePort } from "./support/free-port.js";
import { makeTempDir, removeTempDir } from "./support/temp-dir.js";

// initdb and a cold Postgres start take a few seconds each; a slow CI machine may need many more.
const SLOW = 120_000;
const childScript = fileURLToPath(new URL("./support/embedded-child.ts", import.meta.url));
const repoRoot = fileURLToPath(new URL("..", import.meta.url));

let dir: string;
let dataDir: string;
let port: number;
// Servers and processes a test started, so that a failing test still leaves nothing running.
let servers: EmbeddedPostgres[];
let children: ChildProcess[];

beforeEach(async () => {
  dir = await makeTempDir("aiflowd-embedded-test");
  dataDir = path.join(dir, "pg");
  port = await freePort();
  servers = [];
  children = [];
});

afterEach(async () => {
  for (const server of servers) await server.stop();
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  await removeTempDir(dir);
});

describe("startEmbeddedPostgres", () => {
  test("starts a server that pg can query, and stop() closes its port", { timeout: SLOW }, async () => {
    const server = await start();
    expect(server.url).toBe(`postgres://postgres:password@127.0.0.1:${port}/aiflow`);
    expect(await query(server.url, "select 1 as one")).toEqual([{ one: 1 }]);

    await server.stop();
    await server.stop();
    expect(await connectError(port)).toBe("ECONNREFUSED");
  });

  test("a restart on the same data directory keeps the data", { timeout: SLOW }, async () => {
    const first = await start();
    await query(first.url, "create table kept (v text); insert into kept values ('survives')");
    await first.stop();

    const { log, entries } = captureLog();
    const second = await start(log);
    expect(await query(second.url, "select v from kept")).toEqual([{ v: "survives" }]);
    expect(entries.map((e) => e.msg)).toContain("reusing existing embedded Postgres data directory");
  });

  test("recovers from a killed daemon whose Postgres is still running", { timeout: SLOW }, async ({ onTestFailed }) => {
    const child = spawn(process.execPath, ["--import", "tsx", childScript, dataDir, String(port)], { stdio: ["ignore", "pipe", "pipe"] });
    children.push(child);
    const url = await firstLine(child);
    await query(url, "create table kept (v text); insert into kept values ('survives')");
    const orphanPid = await postmasterPid();
    // Only a failed recovery leaves the orphan running; nothing else would ever stop it.
    onTestFailed(() => interruptIfAlive(orphanPid));

    child.kill("SIGKILL");
    await once(child, "exit");
    // The orphan still serves, which is the situation the next start has to cope with.
    expect(await query(url, "select 1 as one")).toEqual([{ one: 1 }]);

    const { log, entries } = captureLog();
    const server = await start(log);
    expect(await query(server.url, "select v from kept")).toEqual([{ v: "survives" }]);
    expect(entries).toContainEqual(expect.objectContaining({ postgresPid: orphanPid, msg: expect.stringContaining("still running") }));
    expect(await postmasterPid()).not.toBe(orphanPid);
  });

  test("removes a stale postmaster.pid whose process is dead", { timeout: SLOW }, async () => {
    const first = await start();
    await query(first.url, "create table kept (v text); insert into kept values ('survives')");
    await first.stop();
    const dead = spawn(process.execPath, ["-e", ""]);
    await once(dead, "exit");
    await writeFakePostmasterPid(dead.pid!);

    const { log, entries } = captureLog();
    const server = await start(log);
    expect(await query(server.url, "select v from kept")).toEqual([{ v: "survives" }]);
    expect(entries).toContainEqual(expect.objectContaining({ postgresPid: dead.pid, msg: expect.stringContaining("stale postmaster.pid") }));
  });

  test("treats a postmaster.pid naming a live non-Postgres process as stale and leaves that process alone", { timeout: SLOW }, async () => {
    const first = await start();
    await first.stop();
    const bystander = spawn(process.execPath, ["-e", "setInterval(() => {}, 1000)"]);
    children.push(bystander);
    await once(bystander, "spawn");
    await writeFakePostmasterPid(bystander.pid!);

    const server = await start();
    expect(await query(server.url, "select 1 as one")).toEqual([{ one: 1 }]);
    expect(bystander.exitCode).toBeNull();
    expect(bystander.signalCode).toBeNull();
  });

  test("fails with an error naming the port when something else holds it", { timeout: SLOW }, async () => {
    const squatter = net.createServer();
    squatter.listen({ port, host: "127.0.0.1" });
    await once(squatter, "listening");
    try {
      await expect(start()).rejects.toThrow(`port ${port} on 127.0.0.1 is already in use`);
    } finally {
      squatter.close();
    }
  });
});

describe("aiflowd with an embedded Postgres", () => {
  // Sent once serving (the usual case), and during start-up (handlers must be in place before the
  // daemon logs anything: a Ctrl-C right after "serving" once killed the process outright).
  // Relayed: a wrapper (npm, tsx) passes its own copy of the signal on, so the daemon gets it twice
  // at once; that copy must not count as a second, impatient Ctrl-C.
  test.for([
    ["once it serves", "aiflowd serving gRPC", false],
    ["during start-up", "embedded Postgres ready", false],
    ["once it serves, also relayed by a wrapper", "aiflowd serving gRPC", true],
  ] as const)(
    "Ctrl-C (SIGINT to the terminal's process group) %s drains the daemon, then stops Postgres, with no error",
    { timeout: SLOW },
    async ([, atLine, relayed], { onTestFailed }) => {
      const listen = await freePort();
      // detached: a process group of its own, as a shell gives a foreground job; the signal goes to all of it.
      const daemon = spawn(
        process.execPath,
        [
          path.join(repoRoot, "bin/aiflowd.js"),
          "serve",
          "--data-dir",
          dataDir,
          "--embedded-port",
          String(port),
          "--listen",
          `127.0.0.1:${listen}`,
          "--http-listen",
          "off",
        ],
        {
          cwd: repoRoot,
          detached: true,
          stdio: ["ignore", "pipe", "pipe"],
          env: { ...process.env, DATABASE_URL: "", AIFLOW_LOG_LEVEL: "info", NO_COLOR: "1" },
        },
      );
      children.push(daemon);
      const lines: Record<string, unknown>[] = [];
      const awaited = new Map<unknown, () => void>();
      const logged = (msg: string) => new Promise<void>((resolve) => awaited.set(msg, resolve));
      const ready = logged(atLine);
      const stopping = relayed ? logged("shutting down") : undefined;
      readline.createInterface({ input: daemon.stdout! }).on("line", (line) => {
        const rec = JSON.parse(line) as Record<string, unknown>;
        lines.push(rec);
        awaited.get(rec.msg)?.();
      });
      const exited = once(daemon, "exit");
      await Promise.race([ready, exited.then(() => Promise.reject(new Error(`aiflowd exited before logging '${atLine}': ${JSON.stringify(lines)}`)))]);

      // Postgres runs in a group of its own: if the test fails, nothing else would stop it.
      const postgresPid = await postmasterPid();
      onTestFailed(() => interruptIfAlive(postgresPid));

      process.kill(-daemon.pid!, "SIGINT");
      if (stopping) {
        // The wrapper's copy comes once the daemon has taken the first (34 ms later, as once seen by hand).
        await stopping;
        process.kill(daemon.pid!, "SIGINT");
      }
      const [code] = await exited;
      expect(code).toBe(0);
      expect(lines.filter((l) => (l.level as number) >= 50)).toEqual([]);
      const msgs = lines.map((l) => l.msg);
      expect(msgs.indexOf("embedded Postgres stopped")).toBeGreaterThan(msgs.indexOf("shutting down"));
      expect(msgs.at(-1)).toBe("aiflowd stopped");
      expect(await connectError(port)).toBe("ECONNREFUSED");
    },
  );
});

async function start(log: Logger = pino({ level: "silent" })): Promise<EmbeddedPostgres> {
  const server = await startEmbeddedPostgres({ dataDir, port, log });
  servers.push(server);
  return server;
}

async function query(url: string, sql: string): Promise<unknown[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const results = await client.query(sql);
    // A multi-statement string yields one result per statement; the last one is the interesting one.
    return (Array.isArray(results) ? results.at(-1) : results).rows;
  } finally {
    await client.end();
  }
}

/** The error code of a TCP connect to the port, or "connected" if something accepted it. */
async function connectError(port: number): Promise<string> {
  const socket = net.connect({ port, host: "127.0.0.1" });
  try {
    await once(socket, "connect");
    return "connected";
  } catch (err) {
    return (err as NodeJS.ErrnoException).code ?? String(err);
  } finally {
    socket.destroy();
  }
}

/** The first stdout line of the child, failing with its stderr if it exits before printing one. */
async function firstLine(child: ChildProcess): Promise<string> {
  let stderr = "";
  child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const lines = readline.createInterface({ input: child.stdout! });
  const exited = once(child, "exit").then(([code, signal]) => {
    throw new Error(`child exited (code ${code}, signal ${signal}) before printing its URL:\n${stderr}`);
  });
  try {
    const [line] = await Promise.race([once(lines, "line"), exited]);
    return line as string;
  } finally {
    lines.close();
  }
}

function interruptIfAlive(pid: number): void {
  try {
    process.kill(pid, "SIGINT");
  } catch {
    // Already gone, which is all the caller wants.
  }
}

async function postmasterPid(): Promise<number> {
  return Number.parseInt((await readFile(path.join(dataDir, "postmaster.pid"), "utf8")).split("\n", 1)[0]!, 10);
}

/** The layout Postgres uses, though only the first line (the pid) matters to the recovery. */
async function writeFakePostmasterPid(pid: number): Promise<void> {
  await writeFile(path.join(dataDir, "postmaster.pid"), `${pid}\n${dataDir}\n0\n${port}\n\n127.0.0.1\n0 0\nready\n`);
}

function captureLog(): { log: Logger; entries: Record<string, unknown>[] } {
  const entries: Record<string, unknown>[] = [];
  const log = pino({ level: "debug" }, { write: (line: string) => void entries.push(JSON.parse(line) as Record<string, unknown>) });
  return { log, entries };
}
