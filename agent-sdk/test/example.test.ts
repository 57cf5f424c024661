/**
 * The example worker binary as a user runs it: its own process (tsx), flags for the daemon, a
 * SIGTERM that drains it. It imports the SDK by package name, as a copy of it would.
 */
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { agentRow } from "../../test/support/agents.js";
import { TOKENS } from "../../test/support/daemon.js";
import { agentName, until, WorkItemStatus } from "./support.js";
import { workerProcessFixture } from "./worker-process.js";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const f = workerProcessFixture("sdkexample");

describe("examples/worker.ts", () => {
  it("registers from its flags, runs items, and on SIGTERM finishes its item, deregisters and exits 0", async () => {
    const name = agentName("example");
    const args = [
      "--import",
      "tsx",
      "agent-sdk/examples/worker.ts",
      "--address",
      f.daemon.address,
      "--token",
      TOKENS.agent,
      "--name",
      name,
      "--tenants",
      "t1",
      "--engine-kind",
      "example",
      "--log-level",
      "warn",
    ];
    const worker = f.spawnWorker(args, ROOT);
    await until("the example registered", async () => (await agentRow(f.db, name))?.status === "active", 30_000);

    const [shout, echo] = await f.producer.enqueue([
      { engineKind: "example", taskName: "shout", payloadJson: JSON.stringify({ text: "hello" }) },
      { engineKind: "example", taskName: "anything", payloadJson: JSON.stringify([1, 2]) },
    ]);
    const done = await f.producer.waitDone([shout!, echo!]);
    expect(JSON.parse(done.find((i) => i.id === shout)!.resultJson)).toEqual({ text: "HELLO" });
    expect(JSON.parse(done.find((i) => i.id === echo)!.resultJson)).toEqual({ echoed: [1, 2], by: name, attempt: 1 });

    const [slow] = await f.producer.enqueue([{ engineKind: "example", taskName: "wait", payloadJson: JSON.stringify({ ms: 600 }) }]);
    await until("the wait item runs", async () => (await f.producer.get(slow!)).status === WorkItemStatus.DISPATCHED);
    worker.kill("SIGTERM");
    const [code] = (await once(worker, "exit")) as [number | null];

    expect(code).toBe(0);
    const slowDone = await f.producer.get(slow!);
    expect(slowDone.status).toBe(WorkItemStatus.COMPLETED);
    expect(JSON.parse(slowDone.resultJson)).toEqual({ waitedMs: 600 });
    expect((await agentRow(f.db, name))?.status).toBe("inactive");
  });

  it("exits 1 when the daemon refuses its token", async () => {
    const args = [
      "--import",
      "tsx",
      "agent-sdk/examples/worker.ts",
      "--address",
      f.daemon.address,
      "--token",
      "not-a-token",
      "--name",
      agentName("refused"),
      "--tenants",
      "t1",
      "--log-level",
      "silent",
    ];
    const worker = f.spawnWorker(args, ROOT);
    const [code] = (await once(worker, "exit")) as [number | null];
    expect(code).toBe(1);
  });
});
