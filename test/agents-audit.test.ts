/**
 * The audit stream of aiflow_agent: every write records the table, the primary key, the NAMES of
 * the fields written, who and when — and no value. The daemon logs into memory here; the test reads
 * the lines tagged "stream":"audit" and looks for every secret it sent.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { fingerprint } from "../src/domain/tokens.js";
import { agentClient, call, captureLog, ok, ULID, type CapturedLog, type RegisterReply } from "./support/agents.js";
import { TOKENS } from "./support/daemon.js";
import type { TestDb } from "./support/db.js";
import { useTestDaemon } from "./support/kit.js";
import { grpc } from "./support/grpc-js.js";
import { opsSession } from "./support/ops.js";

const clock = new FakeClock(Date.UTC(2026, 5, 1));
const captured: CapturedLog = captureLog("trace");
const fx = useTestDaemon({
  label: "agaudit",
  clock,
  log: captured.log,
  config: { instanceId: "audit-daemon", heartbeatFlush: 3_600_000, sweepInterval: 3_600_000 },
});
let db: TestDb;
let daemon: Daemon;
let client: grpc.Client;

// Distinctive values, so finding one in a line cannot be a coincidence (pids and epoch times are shorter or differently shaped).
const SECRETS = {
  http: "http://10.77.66.55:18080/secret-http",
  grpc: "10.77.66.56:19090-secret-grpc",
  infra: "ssh://10.77.66.57:2222/secret-infra",
  version: "9.8.7-secret-version",
  binary: "/opt/secret-binary/agentd",
  tagKey: "secretTagKey",
  tagValue: "tag-value-f00dfeed",
  model: "model-secret-llama-70b",
  mount: "/mnt/secret-mount-point",
  gpuModel: "GPU-SECRET-MODEL-X1",
};
const METRICS = {
  cpuUtilization: 42.424242,
  memoryUsedBytes: "987654321987",
  memoryTotalBytes: "999888777666555",
  disks: [{ mount: SECRETS.mount, freeBytes: "111222333444", totalBytes: "222333444555666" }],
  gpus: [{ index: 3, model: SECRETS.gpuModel, utilization: 77.7777, memoryUsedBytes: "31415926535", memoryTotalBytes: "27182818284590" }],
};
const IN_FLIGHT = 3141592653;
const METRIC_STRINGS = [
  "42.424242",
  "987654321987",
  "999888777666555",
  "111222333444",
  "222333444555666",
  "77.7777",
  "31415926535",
  "27182818284590",
  String(IN_FLIGHT),
];
const ALLOWED_KEYS = ["level", "time", "pid", "hostname", "name", "stream", "table", "action", "ids", "fields", "by", "at", "msg"];

beforeAll(() => {
  ({ db, daemon } = fx);
  client = agentClient(daemon.address);
});
afterAll(() => client?.close());

describe("audit of aiflow_agent", () => {
  it("records create, update (register, drain, sweep) and deregister with ids and field names only, and no heartbeat", async () => {
    const register = (extra: Record<string, unknown> = {}) =>
      ok<RegisterReply>(client, "register", {
        name: "audited-agent",
        httpAddress: SECRETS.http,
        grpcAddress: SECRETS.grpc,
        infraAddress: SECRETS.infra,
        agentVersion: SECRETS.version,
        binaryPath: SECRETS.binary,
        agentType: "AGENT_TYPE_REMOTE",
        metadata: { tags: { [SECRETS.tagKey]: SECRETS.tagValue }, slots: 2, tenants: ["t1"], engineKinds: ["dag"], models: [SECRETS.model] },
        ...extra,
      });
    const { id } = await register();
    expect(id).toMatch(ULID);
    const createdAt = clock.nowMs();

    clock.advance(1_000);
    await ok(client, "heartbeat", { name: "audited-agent", metrics: METRICS, inFlight: IN_FLIGHT });
    await daemon.maintenance.flushHeartbeats();
    // The values did reach the database (so their absence from the audit means something).
    const row = (await db.raw<{ metrics: { inFlight: number } }>(`SELECT metrics FROM ${db.tables.qualified("agent")} WHERE id = $1`, [id]))[0];
    expect(row!.metrics.inFlight).toBe(IN_FLIGHT);

    clock.advance(1_000);
    await register({ httpAddress: `${SECRETS.http}/v2` });
    const reRegisteredAt = clock.nowMs();

    // A drain changes the agent's status: audited, by the operator who asked.
    clock.advance(1_000);
    const ops = opsSession(daemon.address);
    try {
      await ops.client.drainAgent({ name: "audited-agent", reason: "audit test" }, ops.call);
    } finally {
      ops.close();
    }
    const drainedAt = clock.nowMs();

    // A refused call writes nothing and so audits nothing.
    const before = captured.audit().length;
    const [refused] = await call(client, "heartbeat", { name: "audited-agent", metrics: { ...METRICS, cpuUtilization: 150 } });
    expect(refused?.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(captured.audit()).toHaveLength(before);

    clock.advance(1_000);
    await ok(client, "deregister", { name: "audited-agent" });
    const leftAt = clock.nowMs();

    // And one the liveness sweep flips.
    const { id: sweptId } = await ok<RegisterReply>(client, "register", { name: "audited-silent", httpAddress: SECRETS.http });
    clock.advance(15_001);
    await daemon.maintenance.runOnce();
    const sweptAt = clock.nowMs();

    const audit = captured.audit().map((x) => x.rec);
    const principal = `agent-${fingerprint(TOKENS.agent)}`;
    const iso = (ms: number) => new Date(ms).toISOString();
    const mine = audit.filter((r) => (r.ids as string[]).includes(id));
    expect(mine).toEqual([
      expect.objectContaining({
        table: "agent",
        action: "create",
        ids: [id],
        by: principal,
        at: iso(createdAt),
        fields: [
          "agenttype",
          "agentversion",
          "binarypath",
          "createdby",
          "createdon",
          "grpc_address",
          "http_address",
          "id",
          "infra_address",
          "metadata",
          "name",
          "status",
          "updatedby",
          "updatedon",
        ],
      }),
      expect.objectContaining({
        table: "agent",
        action: "update",
        ids: [id],
        by: principal,
        at: iso(reRegisteredAt),
        fields: ["agenttype", "agentversion", "binarypath", "grpc_address", "http_address", "infra_address", "metadata", "status", "updatedby", "updatedon"],
      }),
      expect.objectContaining({
        table: "agent",
        action: "update",
        ids: [id],
        by: `ops-${fingerprint(TOKENS.ops)}`,
        at: iso(drainedAt),
        fields: ["metadata", "status"],
      }),
      expect.objectContaining({ table: "agent", action: "update", ids: [id], by: principal, at: iso(leftAt), fields: ["status", "updatedby", "updatedon"] }),
    ]);
    // A heartbeat is no change worth a record (issue 52: 69 % of the log's bytes at 1,000 agents).
    expect(audit.filter((r) => r.by === "heartbeat")).toEqual([]);
    expect(audit.filter((r) => r.by === "liveness-sweep")).toEqual([
      expect.objectContaining({ table: "agent", action: "update", ids: [sweptId], at: iso(sweptAt), fields: ["status", "updatedby", "updatedon"] }),
    ]);
  });

  it("every audit line has only the audit keys, ULIDs as ids, and real column names as fields", async () => {
    const columns = (
      await db.raw<{ column_name: string }>(`SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2`, [
        db.schema,
        `${db.prefix}agent`,
      ])
    ).map((c) => c.column_name);
    const audit = captured.audit();
    expect(audit.length).toBeGreaterThanOrEqual(6);
    for (const { rec } of audit) {
      for (const k of Object.keys(rec)) expect(ALLOWED_KEYS, `unexpected key '${k}' in ${JSON.stringify(rec)}`).toContain(k);
      for (const id of rec.ids as string[]) expect(id).toMatch(ULID);
      for (const f of rec.fields as string[]) expect(columns).toContain(f);
    }
  });

  it("no metric value, address, tag, model, version, path or token appears in any audit line", () => {
    const audit = captured.audit().map((x) => x.raw);
    const forbidden = [...Object.values(SECRETS), ...METRIC_STRINGS, TOKENS.agent, "10.77.66"];
    for (const line of audit) for (const f of forbidden) expect(line, `audit line leaks '${f}'`).not.toContain(f);
  });

  it("no token appears anywhere in the daemon's log", () => {
    const all = captured.raw().join("\n");
    expect(all.length).toBeGreaterThan(0);
    for (const t of Object.values(TOKENS)) expect(all).not.toContain(t);
  });
});
