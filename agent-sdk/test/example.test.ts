/**
 * The example worker binary as a user runs it: its own process (tsx), flags for the daemon, a
 * SIGTERM that drains it. It imports the SDK by package name, as a copy of it would.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../../src/daemon.js";
import { agentRow } from "../../test/support/agents.js";
import { startTestDaemon, TOKENS } from "../../test/support/daemon.js";
import { createTestDb, type TestDb } from "../../test/support/db.js";
import { agentName, Producer, until, WorkItemStatus } from "./support.js";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
let db: TestDb;
let daemon: Daemon;
let producer: Producer;
let worker: ChildProcess | undefined;

beforeAll(async () => {
  db = await createTestDb({ label: "sdkexample" });
  daemon = await startTestDaemon({ schema: db.schema, config: { heartbeatInterval: 1_000, heartbeatFlush: 50 } });
  producer = new Producer(daemon.address, "t1");
});
afterAll(async () => {
  if (worker && worker.exitCode === null) worker.kill("SIGKILL");
  producer?.close();
  await daemon?.stop();
  await db?.drop();
});

describe("examples/worker.ts", () => {
  it("registers from its flags, runs items, and on SIGTERM finishes its item, deregisters and exits 0", async () => {
    const name = agentName("example");
    const args = ["--import", "tsx", "agent-sdk/examples/worker.ts", "--address", daemon.address, "--token", TOKENS.agent, "--name", name, "--tenants", "t1", "--engine-kind", "example", "--log-level", "warn"];
    worker = spawn(process.execPath, args, { cwd: ROOT, stdio: ["ignore", "inherit", "inherit"] });
    await until("the example registered", async () => (await agentRow(db, name))?.status === "active", 30_000);

    const [shout, echo] = await producer.enqueue([
      { engineKind: "example", taskName: "shout", payloadJson: JSON.stringify({ text: "hello" }) },
      { engineKind: "example", taskName: "anything", payloadJson: JSON.stringify([1, 2]) },
    ]);
    const done = await producer.waitDone([shout!, echo!]);
    expect(done.find((i) => i.id === shout)?.resultJson).toBe(JSON.stringify({ text: "HELLO" }));
    expect(JSON.parse(done.find((i) => i.id === echo)!.resultJson)).toEqual({ echoed: [1, 2], by: name, attempt: 1 });

    const [slow] = await producer.enqueue([{ engineKind: "example", taskName: "wait", payloadJson: JSON.stringify({ ms: 600 }) }]);
    await until("the wait item runs", async () => (await producer.get(slow!)).status === WorkItemStatus.DISPATCHED);
    worker.kill("SIGTERM");
    const [code] = (await once(worker, "exit")) as [number | null];

    expect(code).toBe(0);
    expect(await producer.get(slow!)).toMatchObject({ status: WorkItemStatus.COMPLETED, resultJson: JSON.stringify({ waitedMs: 600 }) });
    expect((await agentRow(db, name))?.status).toBe("inactive");
  });

  it("exits 1 when the daemon refuses its token", async () => {
    const args = ["--import", "tsx", "agent-sdk/examples/worker.ts", "--address", daemon.address, "--token", "not-a-token", "--name", agentName("refused"), "--tenants", "t1", "--log-level", "silent"];
    worker = spawn(process.execPath, args, { cwd: ROOT, stdio: ["ignore", "inherit", "inherit"] });
    const [code] = (await once(worker, "exit")) as [number | null];
    expect(code).toBe(1);
  });
});
