/**
 * For test files that run a worker binary as a process of its own: a daemon on a database of the
 * file's own (short heartbeat interval, quick flushes), a producer for tenant t1, and the workers it
 * spawns, killed after the file if they are still running.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { afterAll, beforeAll } from "vitest";
import type { Daemon } from "../../src/daemon.js";
import { startTestDaemon } from "../../test/support/daemon.js";
import { createTestDb, type TestDb } from "../../test/support/db.js";
import { Producer } from "./support.js";

export interface WorkerProcessFixture {
  db: TestDb;
  daemon: Daemon;
  producer: Producer;
  /** Runs `node ARGS` in `cwd`, its output on the test's. */
  spawnWorker(args: string[], cwd: string): ChildProcess;
}

/** Sets the fixture up before the file's tests and tears it down after them. */
export function workerProcessFixture(label: string): WorkerProcessFixture {
  const workers: ChildProcess[] = [];
  const f = {
    spawnWorker(args: string[], cwd: string) {
      const worker = spawn(process.execPath, args, { cwd, stdio: ["ignore", "inherit", "inherit"] });
      workers.push(worker);
      return worker;
    },
  } as WorkerProcessFixture;
  beforeAll(async () => {
    f.db = await createTestDb({ label });
    f.daemon = await startTestDaemon({ schema: f.db.schema, config: { heartbeatInterval: 1_000, heartbeatFlush: 50 } });
    f.producer = new Producer(f.daemon.address, "t1");
  });
  afterAll(async () => {
    for (const w of workers) if (w.exitCode === null) w.kill("SIGKILL");
    f.producer?.close();
    await f.daemon?.stop();
    await f.db?.drop();
  });
  return f;
}
