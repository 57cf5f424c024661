/**
 * A drain's result when the agent gives its work back at the deadline itself (issue 52 item 6): the
 * SDK's deadline timer releases what still runs, usually before the daemon's drain-deadline task
 * gets to it, and `aiflowctl drain --wait` must still say work was given back (exit 3), not
 * "drained" (exit 0). The daemons here never sweep (the drain-deadline task never runs), so every
 * release is the agent's. Real daemon, real SDK agent, the real CLI in a child process.
 */
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { durationFromMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { beforeAll, describe, expect, it } from "vitest";
import type { Clock } from "../../src/clock.js";
import type { Daemon } from "../../src/daemon.js";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { TOKENS } from "../../test/support/daemon.js";
import { Connection, useTestDaemon } from "../../test/support/kit.js";
import type { Agent } from "../src/index.js";
import { finished, Producer, testAgent, until, WorkItemStatus } from "./support.js";

const CLI = fileURLToPath(new URL("../../bin/aiflowctl.js", import.meta.url));
/** Only matters when something hangs (node and tsx start in the child: seconds on a busy machine). */
const CLI_TIMEOUT_MS = 60_000;

const config = { sweepInterval: 3_600_000, heartbeatInterval: 300, heartbeatFlush: 50 };
const fx = useTestDaemon({ label: "sdkdrainres", config });

/** Runs aiflowctl to completion against `address`. */
function ctl(address: string, args: readonly string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const env: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1" };
  delete env.AIFLOW_ADDRESS;
  delete env.AIFLOW_TOKEN;
  return new Promise((resolve, reject) =>
    execFile(process.execPath, [CLI, "--address", address, "--token", TOKENS.ops, ...args], { env, timeout: CLI_TIMEOUT_MS }, (err, stdout, stderr) => {
      if (err && typeof err.code !== "number") return reject(Object.assign(err, { stdout, stderr }));
      resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
    }),
  );
}

/** A running agent of `kind` whose handler holds every item until it is aborted. */
async function stubbornAgent(address: string, kind: string, slots: number): Promise<{ agent: Agent; running: () => number }> {
  let running = 0;
  const agent = testAgent(address, {
    engineKinds: [kind],
    slots,
    handlers: {
      [kind]: async (_item, ctx) => {
        running++;
        await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
        return "ignored";
      },
    },
  });
  void agent.run();
  await until("registered", () => agent.state === "running");
  return { agent, running: () => running };
}

describe("the agent releases its work at the drain deadline", () => {
  let daemon: Daemon;
  let producer: Producer;
  beforeAll(() => {
    daemon = fx.daemon;
    producer = fx.closers.add(new Producer(daemon.address, "t1"));
  });

  it("drain --wait exits 3 and counts the items the agent gave back", async () => {
    const { agent, running } = await stubbornAgent(daemon.address, "held-to-deadline", 2);
    const ids = await producer.enqueue([
      { engineKind: "held-to-deadline", maxRetries: 2 },
      { engineKind: "held-to-deadline", maxRetries: 2 },
    ]);
    await until("both items run", () => running() === 2);
    const [res, released] = await Promise.all([
      ctl(daemon.address, ["drain", agent.name, "--wait", "--deadline", "300ms", "--interval", "50ms"]),
      Promise.all(ids.map((id) => finished(agent, id, CLI_TIMEOUT_MS))),
    ]);
    expect(released.map((r) => r.outcome)).toEqual([{ kind: "released" }, { kind: "released" }]);
    expect(res).toMatchObject({ code: 3, stdout: "drained; 2 item(s) were given back at the deadline\n" });
    for (const id of ids) expect(await producer.get(id)).toMatchObject({ status: WorkItemStatus.PENDING, retryCount: 0 });
    await producer.queue.cancel({ tenantKey: "t1", ids });
  });
});

describe("the agent's clock is ahead of the daemon's", () => {
  // The daemon's deadline is still a second off by its clock when the agent's has passed it: only
  // the release's own word (LeaseRef.drain_deadline) can make the daemon count it.
  const behind: Clock = { nowMs: () => Date.now() - 5_000 };
  let daemon: Daemon;
  let producer: Producer;
  beforeAll(async () => {
    daemon = await fx.startDaemon({ clock: behind, config: { ...config, instanceId: "sdk-drain-behind" } });
    producer = fx.closers.add(new Producer(daemon.address, "t1"));
  });

  it("the release the agent marks as made at its deadline counts in the drain's result", async () => {
    const { agent, running } = await stubbornAgent(daemon.address, "held-behind", 1);
    const [id] = await producer.enqueue([{ engineKind: "held-behind" }]);
    await until("the item runs", () => running() === 1);
    const released = finished(agent, id!);
    const conn = fx.closers.add(new Connection(daemon.address, { token: TOKENS.ops }));
    const ops = conn.client(OpsService);

    await ops.drainAgent({ name: agent.name, deadline: durationFromMs(1_000) });
    expect((await released).outcome).toEqual({ kind: "released" });
    const got = await ops.getAgent({ name: agent.name });
    expect(got.agent?.drain).toMatchObject({ inFlightNow: 0, complete: true, releasedAtDeadline: 1 });
    // Given back before the deadline by the daemon's clock: the agent's word is what counted.
    expect(behind.nowMs()).toBeLessThan(timestampMs(got.agent!.drain!.deadline!));
    await producer.queue.cancel({ tenantKey: "t1", ids: [id!] });
  });
});
