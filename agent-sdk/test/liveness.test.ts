/**
 * Liveness does not depend on the tasks: heartbeats come from a thread of their own, so a handler
 * that blocks the event loop for many heartbeat intervals leaves the agent active, while an agent
 * that does not beat at all is marked inactive over the same span.
 *
 * The daemon runs in a child process here: in this process it would share the blocked event loop
 * with the handler and could neither take heartbeats nor sweep.
 */
import { spawnSync } from "node:child_process";
import { Worker } from "node:worker_threads";
import { beforeAll, describe, expect, it } from "vitest";
import { agentRow } from "../../test/support/agents.js";
import { TOKENS } from "../../test/support/daemon.js";
import type { TestDb } from "../../test/support/db.js";
import { until, useTestDb } from "../../test/support/kit.js";
import { AgentService } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import type { Registration } from "../src/index.js";
import { mountPointOf } from "../src/liveness/capacity.js";
import { useChildDaemon } from "./daemon-process.js";
import { agentName, Producer, testAgent, WorkItemStatus } from "./support.js";

const HEARTBEAT_MS = 300;
/** Heartbeats that must land while the event loop is blocked: ten intervals; the daemon marks an agent inactive after three. */
const BEATS = 10;

const fx = useTestDb("sdklive");
let db: TestDb;
beforeAll(() => {
  db = fx.db;
});
const daemon = useChildDaemon(() => fx.db.schema, "liveness-child", { heartbeatInterval: `${HEARTBEAT_MS}ms`, leaseTtl: "20s" });

interface Seen {
  /** Times the agent's row took a heartbeat (its updatedon moved) while this thread was blocked. */
  beats: number;
  /** Whether the sweep had marked the control inactive. */
  controlInactive: boolean;
}

/**
 * Blocks this thread, its event loop included, until a watcher on a thread of its own has seen in
 * the database `beats` heartbeats of `agent` land and the sweep mark `control` inactive; returns
 * what it saw (the watcher gives up after `capMs`, which only a broken heartbeat or sweep reaches).
 */
function blockUntilSeen(agent: string, control: string, beats: number, capMs = 10_000): Seen {
  const shared = new SharedArrayBuffer(3 * Int32Array.BYTES_PER_ELEMENT);
  const state = new Int32Array(shared);
  const watcher = new Worker(
    `const { workerData: w } = require("node:worker_threads");
    const pg = require("pg");
    const state = new Int32Array(w.shared);
    (async () => {
      const c = new pg.Client({ connectionString: w.url });
      const giveUpAt = Date.now() + w.capMs;
      try {
        await c.connect();
        let last;
        for (;;) {
          const { rows } = await c.query("SELECT name, status, updatedon FROM " + w.table + " WHERE name = ANY($1)", [[w.agent, w.control]]);
          const at = rows.find((r) => r.name === w.agent)?.updatedon?.getTime();
          if (last !== undefined && at !== last) Atomics.add(state, 1, 1);
          last = at;
          Atomics.store(state, 2, rows.some((r) => r.name === w.control && r.status === "inactive") ? 1 : 0);
          if ((Atomics.load(state, 1) >= w.beats && Atomics.load(state, 2) === 1) || Date.now() > giveUpAt) break;
          await new Promise((r) => setTimeout(r, 20));
        }
      } finally {
        await c.end().catch(() => {});
        Atomics.store(state, 0, 1);
        Atomics.notify(state, 0);
      }
    })();`,
    { eval: true, workerData: { shared, url: db.url, table: db.tables.qualified("agent"), agent, control, beats, capMs } },
  );
  while (Atomics.load(state, 0) === 0) Atomics.wait(state, 0, 0, capMs);
  void watcher.terminate();
  return { beats: Atomics.load(state, 1), controlInactive: Atomics.load(state, 2) === 1 };
}

describe("busy event loop", () => {
  it("a handler blocking the event loop for ten heartbeat intervals does not get the agent marked inactive", async () => {
    const producer = new Producer(daemon.address(), "t1");
    // A control: registered the same way, but never heartbeats.
    const control = agentName("control");
    let seen: Seen | undefined;
    const registrations: Registration[] = [];
    const agent = testAgent(daemon.address(), {
      engineKinds: ["busy"],
      handlers: {
        busy: () => {
          // No timer and no I/O callback of this thread runs until this returns.
          seen = blockUntilSeen(agent.name, control, BEATS);
          return "survived";
        },
      },
    });
    agent.on("registered", (r) => registrations.push(r));
    await agent.start();
    expect(agent.registration?.heartbeatIntervalMs).toBe(HEARTBEAT_MS);
    await fx.clientAt(daemon.address(), AgentService, TOKENS.agent).register({ name: control, metadata: { slots: 1, tenants: ["t1"], engineKinds: ["none"] } });

    const [id] = await producer.enqueue([{ engineKind: "busy" }]);
    const [done] = await producer.waitDone([id!], 30_000);

    // While the event loop was blocked, the agent's heartbeats kept landing (from the SDK's thread)
    // and the sweep ran: it marked the control inactive.
    expect(seen!.beats).toBeGreaterThanOrEqual(BEATS);
    expect(seen!.controlInactive).toBe(true);
    // Had the agent been marked inactive, its item would have been taken back and this completion refused.
    expect(done).toMatchObject({ status: WorkItemStatus.COMPLETED, retryCount: 0, agentId: agent.name, resultJson: JSON.stringify("survived") });
    expect(registrations).toHaveLength(1);
    const row = await agentRow(db, agent.name);
    expect(row).toMatchObject({ status: "active", updatedby: agent.name });
    expect(await agentRow(db, control)).toMatchObject({ status: "inactive", updatedby: "liveness-sweep" });
    producer.close();
  });

  it("heartbeats carry metrics measured by the SDK: CPU, memory, the disks registered and of `mounts`, and GPUs only when nvidia-smi reports them", async () => {
    const agent = testAgent(daemon.address(), { engineKinds: ["metrics"], mounts: ["/", "/definitely/not/a/mount"], handlers: { metrics: () => undefined } });
    await agent.start();
    let metrics = null as Record<string, unknown> | null;
    await until("a heartbeat landed", async () => (metrics = (await agentRow(db, agent.name))?.metrics ?? null) !== null);
    expect(metrics).toMatchObject({ inFlight: 0, cpu: { utilization: expect.any(Number) }, memory: { used: expect.any(Number), total: expect.any(Number) } });
    const m = metrics as {
      cpu: { utilization: number };
      memory: { used: number; total: number };
      disks: { mount: string; free: number; total: number }[];
      gpus: unknown[];
    };
    expect(m.cpu.utilization).toBeGreaterThanOrEqual(0);
    expect(m.cpu.utilization).toBeLessThanOrEqual(100);
    expect(m.memory.used).toBeGreaterThan(0);
    expect(m.memory.used).toBeLessThanOrEqual(m.memory.total);
    // The work directory's disk first (as registered), then `mounts`, each once; the mount that does
    // not exist is left out, not reported as zeros.
    expect(m.disks.map((d) => d.mount)).toEqual([...new Set([await mountPointOf(process.cwd()), "/"])]);
    for (const d of m.disks) expect(d.free).toBeLessThanOrEqual(d.total);
    const hasNvidiaSmi = spawnSync("nvidia-smi", ["-L"]).error === undefined;
    if (hasNvidiaSmi) expect(m.gpus.length).toBeGreaterThan(0);
    else expect(m.gpus).toEqual([]);
  });
});
