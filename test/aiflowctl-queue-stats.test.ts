/**
 * `aiflowctl queue stats` says which waiting work nobody will take (`node bin/aiflowctl.js …` in a
 * child process, as operators run it): items of a tenant and engine kind no ACTIVE agent serves,
 * with the agents that serve them but are drained, and items whose requirements no agent could
 * meet; in text and in --json.
 */
import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, it, vi } from "vitest";
import { TOKENS } from "./support/daemon.js";
import { useTestDaemon, type Session } from "./support/kit.js";
import { Producer } from "./support/queue.js";
import { opsSession, OpsTestAgent } from "./support/ops.js";
import type { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";

const CLI = fileURLToPath(new URL("../bin/aiflowctl.js", import.meta.url));
vi.setConfig({ testTimeout: 120_000 });
// The test agents never heartbeat; they must not be found dead during the test.
const fx = useTestDaemon({ label: "ctlstats", config: { instanceId: "ctl-stats", heartbeatInterval: 3_600_000 } });
let ops: Session<typeof OpsService>;
let producer: Producer;

beforeAll(async () => {
  ops = fx.closers.add(opsSession(fx.address));
  producer = fx.closers.add(new Producer(fx.address));
  // cq/gpu: nobody registered; cq/cpu: served; cq/train: served by an agent that is drained;
  // cq/big: served, but needs more memory than its agent has.
  await producer.many("cq", "gpu", 2);
  await producer.many("cq", "cpu", 1);
  await producer.many("cq", "train", 1);
  await producer.ids("cq", [{ engineKind: "big", payloadJson: "{}", workerParams: { requirements: { memoryMb: 1_000_000_000n } } }]);
  fx.closers.add(await OpsTestAgent.register(fx.address, "cq-cpu", { tenants: ["cq"], engineKinds: ["cpu", "big"] }));
  fx.closers.add(await OpsTestAgent.register(fx.address, "cq-train", { tenants: ["cq"], engineKinds: ["train"] }));
  await ops.client.drainAgent({ name: "cq-train", reason: "deploy" }, ops.call);
});

function ctl(args: readonly string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const env: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1" };
  for (const k of ["AIFLOW_ADDRESS", "AIFLOW_TOKEN", "AIFLOW_TLS_CA", "AIFLOW_TLS_CERT", "AIFLOW_TLS_KEY"]) delete env[k];
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [CLI, "--address", fx.address, "--token", TOKENS.ops, ...args], { env, timeout: 60_000 }, (err, stdout, stderr) => {
      if (err && typeof err.code !== "number") return reject(Object.assign(err, { stdout, stderr }));
      resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
    });
  });
}

describe("aiflowctl queue stats", () => {
  it("lists work no ACTIVE agent serves, and work no agent could place, under a line that says why", async () => {
    const text = await ctl(["queue", "stats", "--tenant", "cq"]);
    expect(text).toMatchObject({ code: 0, stderr: "" });
    const lines = text.stdout.split("\n");
    const at = lines.findIndex((l) => l.startsWith("unserved: no ACTIVE agent serves"));
    expect(at).toBeGreaterThan(0);
    expect(lines[at + 1]).toMatch(/^TENANT +KIND +PENDING +OLDEST +AGENTS NOT ACTIVE$/);
    expect(lines[at + 2]).toMatch(/^cq +gpu +2 +\d+(ms|s) +none registered$/);
    expect(lines[at + 3]).toMatch(/^cq +train +1 +\d+(ms|s) +1 \(draining or inactive\)$/);
    expect(text.stdout).not.toMatch(/^cq +cpu +1 +\d/m);
    const un = lines.findIndex((l) => l.startsWith("unplaceable: no agent"));
    expect(un).toBeGreaterThan(at);
    expect(lines[un + 2]).toMatch(/^cq +big +1 +\d+(ms|s) +\S/);
  });

  it("gives them in --json", async () => {
    const r = await ctl(["queue", "stats", "--tenant", "cq", "--json"]);
    expect(r.code).toBe(0);
    const json = JSON.parse(r.stdout) as { unserved: { tenantKey: string; engineKind: string; count: string; oldestAge: string; agentsNotActive: number }[] };
    expect(json.unserved.map((u) => ({ ...u, oldestAge: typeof u.oldestAge }))).toEqual([
      { tenantKey: "cq", engineKind: "gpu", count: "2", oldestAge: "string", agentsNotActive: 0 },
      { tenantKey: "cq", engineKind: "train", count: "1", oldestAge: "string", agentsNotActive: 1 },
    ]);
  });
});
