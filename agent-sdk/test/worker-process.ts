/**
 * For test files that run a worker binary as a process of its own: a daemon on a database of the
 * file's own (short heartbeat interval, quick flushes), a producer for tenant t1, and the workers it
 * spawns, killed after the file if they are still running.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { afterAll, beforeAll } from "vitest";
import type { Daemon } from "../../src/daemon.js";
import type { TestDb } from "../../test/support/db.js";
import { useTestDaemon } from "../../test/support/kit.js";
import { Producer } from "./support.js";

export interface WorkerProcessFixture {
  readonly db: TestDb;
  readonly daemon: Daemon;
  readonly producer: Producer;
  /** Runs `node ARGS` in `cwd`, its output on the test's. */
  spawnWorker(args: string[], cwd: string): ChildProcess;
}

/** Sets the fixture up before the file's tests and tears it down after them. */
export function workerProcessFixture(label: string): WorkerProcessFixture {
  const fx = useTestDaemon({ label, config: { heartbeatInterval: 1_000, heartbeatFlush: 50 } });
  const workers: ChildProcess[] = [];
  let producer: Producer | undefined;
  beforeAll(() => {
    producer = fx.closers.add(new Producer(fx.address, "t1"));
  });
  // Runs before the fixture's own teardown: the workers go before their daemon.
  afterAll(() => {
    for (const w of workers) if (w.exitCode === null) w.kill("SIGKILL");
  });
  return {
    get db() {
      return fx.db;
    },
    get daemon() {
      return fx.daemon;
    },
    get producer() {
      if (!producer) throw new Error("the producer is made in beforeAll");
      return producer;
    },
    spawnWorker(args, cwd) {
      const worker = spawn(process.execPath, args, { cwd, stdio: ["ignore", "inherit", "inherit"] });
      workers.push(worker);
      return worker;
    },
  };
}
