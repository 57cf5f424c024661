/**
 * Liveness does not depend on the tasks: heartbeats come from a thread of their own, so a handler
 * that blocks the event loop for many heartbeat intervals leaves the agent active, while an agent
 * that does not beat at all is marked inactive over the same span.
 *
 * The daemon runs in a child process here: in this process it would share the blocked event loop
 * with the handler and could neither take heartbeats nor sweep.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { agentRow } from "../../test/support/agents.js";
import { bearer, TOKENS } from "../../test/support/daemon.js";
import { databaseUrl } from "../../test/support/database-url.js";
import { createTestDb, type TestDb } from "../../test/support/db.js";
import { freePort } from "../../test/support/free-port.js";
import { AgentService } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import type { Registration } from "../src/index.js";
import { agentName, Producer, testAgent, WorkItemStatus } from "./support.js";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const HEARTBEAT_MS = 300;
/** Ten heartbeat intervals; the daemon marks an agent inactive after three. */
const BLOCK_MS = 10 * HEARTBEAT_MS;

let db: TestDb;
let daemon: ChildProcess;
let address: string;

/** Starts `aiflowd serve` in a child process and resolves once it serves. */
async function spawnDaemon(schema: string, port: number): Promise<ChildProcess> {
  const flags = {
    "--listen": `127.0.0.1:${port}`,
    "--database-url": databaseUrl(),
    "--schema": schema,
    "--instance-id": "liveness-child",
    "--heartbeat-interval": `${HEARTBEAT_MS}ms`,
    "--heartbeat-flush": "50ms",
    "--sweep-interval": "50ms",
    "--lease-ttl": "20s",
    "--log-level": "info",
  };
  const args = ["--import", "tsx", "src/cli/aiflowd.ts", "serve", ...Object.entries(flags).flat(), "--token", `agent:${TOKENS.agent}`, "--token", `engine:${TOKENS.engine}`];
  const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, NO_COLOR: "1" } });
  let out = "";
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`aiflowd did not start within 30s:\n${out}`)), 30_000);
    child.stdout!.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      if (out.includes("aiflowd serving gRPC")) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.once("exit", (code) => reject(new Error(`aiflowd exited with ${code}:\n${out}`)));
  });
  child.stdout!.resume();
  return child;
}

beforeAll(async () => {
  db = await createTestDb({ label: "sdklive" });
  const port = await freePort();
  daemon = await spawnDaemon(db.schema, port);
  address = `127.0.0.1:${port}`;
});
afterAll(async () => {
  if (daemon && daemon.exitCode === null) {
    daemon.kill("SIGTERM");
    await once(daemon, "exit");
  }
  await db?.drop();
});

describe("busy event loop", () => {
  it("a handler blocking the event loop for ten heartbeat intervals does not get the agent marked inactive", async () => {
    const producer = new Producer(address, "t1");
    let block: { from: number; to: number } | undefined;
    const registrations: Registration[] = [];
    const agent = testAgent(address, {
      engineKinds: ["busy"],
      handlers: {
        busy: () => {
          const from = Date.now();
          while (Date.now() - from < BLOCK_MS) {
            // Spinning: no timer, no I/O callback of this thread runs until it returns.
          }
          block = { from, to: Date.now() };
          return "survived";
        },
      },
    });
    agent.on("registered", (r) => registrations.push(r));
    await agent.start();
    expect(agent.registration?.heartbeatIntervalMs).toBe(HEARTBEAT_MS);

    // A control: registered the same way, but never heartbeats.
    const control = agentName("control");
    const raw = createClient(AgentService, createGrpcTransport({ baseUrl: `http://${address}` }));
    await raw.register({ name: control, metadata: { slots: 1, tenants: ["t1"], engineKinds: ["none"] } }, { headers: bearer(TOKENS.agent) });

    const [id] = await producer.enqueue([{ engineKind: "busy" }]);
    const [done] = await producer.waitDone([id!], 30_000);

    expect(block!.to - block!.from).toBeGreaterThanOrEqual(BLOCK_MS);
    // Had the agent been marked inactive, its item would have been taken back and this completion refused.
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, retryCount: 0, agentId: agent.name, resultJson: JSON.stringify("survived") });
    expect(registrations).toHaveLength(1);
    const row = await agentRow(db, agent.name);
    expect(row).toMatchObject({ status: "active", updatedby: agent.name });
    // The sweep was running meanwhile: the control went inactive during the block.
    const controlRow = await agentRow(db, control);
    expect(controlRow).toMatchObject({ status: "inactive", updatedby: "liveness-sweep" });
    expect(controlRow!.updatedon!.getTime()).toBeLessThan(block!.to);
    producer.close();
  });

  it("heartbeats carry metrics measured by the SDK: CPU, memory, disks, and GPUs only when nvidia-smi reports them", async () => {
    const agent = testAgent(address, { engineKinds: ["metrics"], mounts: ["/", "/definitely/not/a/mount"], handlers: { metrics: () => undefined } });
    await agent.start();
    let metrics: Record<string, unknown> | null = null;
    for (const deadline = Date.now() + 10_000; metrics === null && Date.now() < deadline; await new Promise((r) => setTimeout(r, 20)))
      metrics = (await agentRow(db, agent.name))?.metrics ?? null;
    expect(metrics).toMatchObject({ inFlight: 0, cpu: { utilization: expect.any(Number) }, memory: { used: expect.any(Number), total: expect.any(Number) } });
    const m = metrics as { cpu: { utilization: number }; memory: { used: number; total: number }; disks: { mount: string; free: number; total: number }[]; gpus: unknown[] };
    expect(m.cpu.utilization).toBeGreaterThanOrEqual(0);
    expect(m.cpu.utilization).toBeLessThanOrEqual(100);
    expect(m.memory.used).toBeGreaterThan(0);
    expect(m.memory.used).toBeLessThanOrEqual(m.memory.total);
    // The mount that does not exist is left out, not reported as zeros.
    expect(m.disks).toHaveLength(1);
    expect(m.disks[0]).toMatchObject({ mount: "/" });
    expect(m.disks[0]!.free).toBeLessThanOrEqual(m.disks[0]!.total);
    const hasNvidiaSmi = spawnSync("nvidia-smi", ["-L"]).error === undefined;
    if (hasNvidiaSmi) expect(m.gpus.length).toBeGreaterThan(0);
    else expect(m.gpus).toEqual([]);
  });
});
