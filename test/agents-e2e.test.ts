/**
 * AgentService end to end: a stock @grpc/grpc-js client built from the published protos, over real
 * HTTP/2, against a real daemon and Postgres. Time is a fake clock; writes are flushed explicitly.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { parseTokenSpec, parseTokensFile } from "../src/domain/tokens.js";
import {
  agentClient,
  agentRow,
  agentRows,
  call,
  ok,
  registerRequest,
  ULID,
  watchDirectives,
  type HeartbeatReply,
  type RegisterReply,
} from "./support/agents.js";
import { testTokens, TOKENS } from "./support/daemon.js";
import type { TestDb } from "./support/db.js";
import { useTestDaemon } from "./support/kit.js";
import { grpc } from "./support/grpc-js.js";

const AGENT_T1 = "agent-t1-only-token";
/** An agent token that may act only as agents named gpu-… or exactly e2e-solo. */
const AGENT_GPU = "agent-gpu-names-token";
const clock = new FakeClock(Date.UTC(2026, 1, 1));
const fx = useTestDaemon({
  label: "age2e",
  clock,
  config: {
    instanceId: "e2e-daemon",
    // The timers never fire during the test: flushes and sweeps happen when the test says.
    heartbeatFlush: 3_600_000,
    sweepInterval: 3_600_000,
    metadataMaxBytes: 2048,
    tokens: [
      ...testTokens(),
      parseTokenSpec(`agent:${AGENT_T1}:t1`, "test"),
      ...parseTokensFile(JSON.stringify([{ role: "agent", token: AGENT_GPU, name: "gpu-pool", agents: ["gpu-*", "e2e-solo"] }]), "test"),
    ],
  },
});
let db: TestDb;
let daemon: Daemon;
let client: grpc.Client;

beforeAll(() => {
  ({ db, daemon } = fx);
  client = agentClient(daemon.address);
});
afterAll(() => client?.close());

const register = (name: string, extra: Record<string, unknown> = {}) => ok<RegisterReply>(client, "register", registerRequest(name, extra));
const heartbeat = (name: string, extra: Record<string, unknown> = {}) => ok<HeartbeatReply>(client, "heartbeat", { name, ...extra });
const metrics = (extra: Record<string, unknown> = {}) => ({
  cpuUtilization: 37.5,
  memoryUsedBytes: "8000000000",
  memoryTotalBytes: "16000000000",
  disks: [{ mount: "/", freeBytes: "1000", totalBytes: "5000" }],
  gpus: [{ index: 0, model: "H100", utilization: 99.5, memoryUsedBytes: "10", memoryTotalBytes: "80" }],
  ...extra,
});

describe("Register", () => {
  it("creates the agent and replies with its ULID and the server's intervals", async () => {
    const res = await register("e2e-alpha");
    expect(res.id).toMatch(ULID);
    expect(res.created).toBe(true);
    expect(res.status).toBe("AGENT_STATUS_ACTIVE");
    expect(res.heartbeatInterval).toEqual({ seconds: "5", nanos: 0 });
    expect(res.leaseTtl).toEqual({ seconds: "30", nanos: 0 });
    const row = await agentRow(db, "e2e-alpha");
    expect(row).toMatchObject({
      id: res.id,
      status: "active",
      http_address: "http://e2e-alpha.example:8080",
      grpc_address: "e2e-alpha.example:9090",
      infra_address: "e2e-alpha.infra:22",
      agentversion: "1.2.3",
      binarypath: "/opt/agent/bin/agent",
      agenttype: "remote",
    });
    expect(row!.metadata).toEqual({ tags: { zone: "eu-1", gpu: "yes" }, slots: 4, tenants: ["t1"], engineKinds: ["dag"], models: ["llama-3"] });
    expect(row!.createdon.getTime()).toBe(clock.nowMs());
  });

  it("re-registering keeps the id and updates the row", async () => {
    const first = await register("e2e-again");
    clock.advance(1_000);
    const second = await register("e2e-again", { agentVersion: "1.2.4", httpAddress: "", agentType: "AGENT_TYPE_LOCAL", metadata: { slots: 1 } });
    expect(second.id).toBe(first.id);
    expect(second.created).toBe(false);
    const row = await agentRow(db, "e2e-again");
    expect(row).toMatchObject({ id: first.id, agentversion: "1.2.4", http_address: null, agenttype: "local" });
    expect(row!.metadata).toEqual({ tags: {}, slots: 1, tenants: [], engineKinds: [], models: [] });
    expect(row!.updatedon!.getTime()).toBe(clock.nowMs());
  });

  it("trims the name", async () => {
    const res = await register("  e2e-trimmed  ");
    expect((await agentRow(db, "e2e-trimmed"))?.id).toBe(res.id);
  });
});

describe("Heartbeat", () => {
  it("answers ACTIVE, and its metrics land in aiflow_agent.metrics at the next flush, moving updatedon", async () => {
    await register("e2e-beat");
    const registeredAt = clock.nowMs();
    clock.advance(2_500);
    const res = await heartbeat("e2e-beat", { metrics: metrics(), inFlight: 3 });
    expect(res).toEqual({ status: "AGENT_STATUS_ACTIVE", directives: [] });
    await daemon.maintenance.flushHeartbeats();
    const row = await agentRow(db, "e2e-beat");
    expect(row!.metrics).toEqual({
      cpu: { utilization: 37.5 },
      memory: { used: 8_000_000_000, total: 16_000_000_000 },
      disks: [{ mount: "/", free: 1000, total: 5000 }],
      gpus: [{ index: 0, model: "H100", utilization: 99.5, memory: { used: 10, total: 80 } }],
      inFlight: 3,
      // When it arrived: placement trusts what it reports free only while it is fresh.
      at: registeredAt + 2_500,
    });
    expect(row!.updatedon!.getTime()).toBe(registeredAt + 2_500);
    expect(row!.status).toBe("active");
  });

  it("a heartbeat without metrics still records the in-flight count", async () => {
    await register("e2e-bare");
    await heartbeat("e2e-bare", { inFlight: 7 });
    await daemon.maintenance.flushHeartbeats();
    expect((await agentRow(db, "e2e-bare"))!.metrics).toEqual({ inFlight: 7, at: clock.nowMs() });
  });

  it("an unknown name is NOT_FOUND, telling the agent to register", async () => {
    const [err] = await call(client, "heartbeat", { name: "e2e-never-registered", metrics: metrics() });
    expect(err?.code).toBe(grpc.status.NOT_FOUND);
    expect(err?.details).toContain("Register");
    await daemon.maintenance.flushHeartbeats();
    expect(await agentRow(db, "e2e-never-registered")).toBeUndefined();
  });
});

describe("authentication and authorisation", () => {
  it("refuses a call without a token (UNAUTHENTICATED) or with an unknown one, and writes nothing", async () => {
    const [noToken] = await call(client, "register", registerRequest("e2e-anon"), null);
    expect(noToken?.code).toBe(grpc.status.UNAUTHENTICATED);
    const [badToken] = await call(client, "register", registerRequest("e2e-anon"), "not-a-known-token");
    expect(badToken?.code).toBe(grpc.status.UNAUTHENTICATED);
    expect(await agentRow(db, "e2e-anon")).toBeUndefined();
  });

  it("refuses engine and ops tokens (PERMISSION_DENIED)", async () => {
    for (const token of [TOKENS.engine, TOKENS.ops]) {
      const [err] = await call(client, "register", registerRequest("e2e-wrong-role"), token);
      expect(err?.code).toBe(grpc.status.PERMISSION_DENIED);
    }
    await register("e2e-role-target");
    const before = await agentRow(db, "e2e-role-target");
    const [hb] = await call(client, "heartbeat", { name: "e2e-role-target", metrics: metrics() }, TOKENS.engine);
    expect(hb?.code).toBe(grpc.status.PERMISSION_DENIED);
    const [dr] = await call(client, "deregister", { name: "e2e-role-target" }, TOKENS.engine);
    expect(dr?.code).toBe(grpc.status.PERMISSION_DENIED);
    await daemon.maintenance.flushHeartbeats();
    expect(await agentRow(db, "e2e-wrong-role")).toBeUndefined();
    expect(await agentRow(db, "e2e-role-target")).toEqual(before);
  });

  it("an agent token limited to t1 may not register an agent serving t2", async () => {
    const [err] = await call(client, "register", registerRequest("e2e-t2", { metadata: { tenants: ["t1", "t2"] } }), AGENT_T1);
    expect(err?.code).toBe(grpc.status.PERMISSION_DENIED);
    expect(err?.details).toContain("t2");
    expect(await agentRow(db, "e2e-t2")).toBeUndefined();
    await ok(client, "register", registerRequest("e2e-t1", { metadata: { tenants: ["t1"] } }), AGENT_T1);
  });
});

describe("agent tokens limited to some agent names", () => {
  it("act as the names they may, and every agent RPC under any other name is PERMISSION_DENIED and changes nothing", async () => {
    // Exact and prefix names pass.
    expect((await ok<RegisterReply>(client, "register", registerRequest("gpu-e2e-1"), AGENT_GPU)).created).toBe(true);
    await ok(client, "register", registerRequest("e2e-solo"), AGENT_GPU);
    await ok<HeartbeatReply>(client, "heartbeat", { name: "gpu-e2e-1" }, AGENT_GPU);
    await ok(client, "claim", { name: "gpu-e2e-1", maxItems: 1 }, AGENT_GPU);

    // Another agent, registered with the unrestricted token: the limited token cannot touch it.
    await register("cpu-e2e-1");
    const before = await agentRow(db, "cpu-e2e-1");
    const [refused] = await call(client, "register", registerRequest("cpu-e2e-2"), AGENT_GPU);
    expect(refused?.code).toBe(grpc.status.PERMISSION_DENIED);
    expect(refused?.details).toContain("'cpu-e2e-2'");
    expect(refused?.details).toContain("'gpu-*'");
    const lease = { workItemId: "01J0000000000000000000000A", leaseToken: "01J0000000000000000000000B" };
    const calls: [string, object][] = [
      ["heartbeat", { name: "cpu-e2e-1" }],
      ["claim", { name: "cpu-e2e-1", maxItems: 1 }],
      ["extendLease", { name: "cpu-e2e-1", leases: [lease] }],
      ["complete", { name: "cpu-e2e-1", items: [{ ...lease, resultJson: "" }] }],
      ["fail", { name: "cpu-e2e-1", items: [{ ...lease, error: "x" }] }],
      ["release", { name: "cpu-e2e-1", leases: [lease] }],
      ["deregister", { name: "cpu-e2e-1" }],
      // A prefix is a prefix, not a substring.
      ["heartbeat", { name: "my-gpu-e2e" }],
    ];
    for (const [method, req] of calls) {
      const [err] = await call(client, method, req, AGENT_GPU);
      expect([method, err?.code]).toEqual([method, grpc.status.PERMISSION_DENIED]);
    }
    const stream = watchDirectives(client, "cpu-e2e-1", AGENT_GPU);
    await expect(stream.next()).rejects.toMatchObject({ code: grpc.status.PERMISSION_DENIED });
    stream.close();

    await daemon.maintenance.flushHeartbeats();
    expect(await agentRow(db, "cpu-e2e-1")).toEqual(before);
    expect(await agentRow(db, "cpu-e2e-2")).toBeUndefined();
  });
});

describe("validation: refused calls change nothing", () => {
  const registerCases: [string, Record<string, unknown>, grpc.status, string][] = [
    ["a name with a space and !", { name: "bad name!" }, grpc.status.INVALID_ARGUMENT, "name"],
    ["a 129-character name", { name: "n".repeat(129) }, grpc.status.INVALID_ARGUMENT, "name"],
    ["an empty name", { name: "   " }, grpc.status.INVALID_ARGUMENT, "name"],
    ["a bad tag key", { metadata: { tags: { "bad key": "v" } } }, grpc.status.INVALID_ARGUMENT, "metadata.tags"],
    ["a bad tenant key", { metadata: { tenants: ["t 1"] } }, grpc.status.INVALID_ARGUMENT, "metadata.tenants[0]"],
    ["a 257-character tag value", { metadata: { tags: { a: "x".repeat(257) } } }, grpc.status.INVALID_ARGUMENT, "metadata.tags[a]"],
    ["an overlong agent_version", { agentVersion: "v".repeat(129) }, grpc.status.INVALID_ARGUMENT, "agent_version"],
    [
      "oversized metadata",
      { metadata: { tags: Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`tag${i}`, "x".repeat(100)])) } },
      grpc.status.RESOURCE_EXHAUSTED,
      "metadata",
    ],
  ];

  it.each(registerCases)("Register with %s is refused and the existing row is untouched", async (_label, bad, code, field) => {
    await register("e2e-valid");
    const before = await agentRow(db, "e2e-valid");
    const count = await agentRows(db);
    clock.advance(10);
    const [err] = await call(client, "register", registerRequest("e2e-valid", bad));
    expect(err?.code).toBe(code);
    expect(err?.details).toContain(field);
    expect(await agentRow(db, "e2e-valid")).toEqual(before);
    expect((await agentRows(db)).length).toBe(count.length);
  });

  it("metadata under the configured cap is accepted", async () => {
    const tags = Object.fromEntries(Array.from({ length: 7 }, (_, i) => [`k${i}`, "y".repeat(250)]));
    await ok(client, "register", registerRequest("e2e-big-ok", { metadata: { tags } }));
    expect((await agentRow(db, "e2e-big-ok"))!.metadata).toMatchObject({ tags });
  });

  const heartbeatCases: [string, Record<string, unknown>, string][] = [
    ["cpu_utilization 150", { metrics: metrics({ cpuUtilization: 150 }) }, "metrics.cpu_utilization"],
    ["negative cpu_utilization", { metrics: metrics({ cpuUtilization: -1 }) }, "metrics.cpu_utilization"],
    ["memory used > total", { metrics: metrics({ memoryUsedBytes: "17000000000" }) }, "metrics.memory"],
    // uint64 cannot carry a negative; a client that sends -1 puts 2^64-1 on the wire.
    ["negative memory (wrapped to 2^64-1)", { metrics: metrics({ memoryUsedBytes: "-1", memoryTotalBytes: "0" }) }, "metrics.memory"],
    [
      "GPU utilisation 101",
      { metrics: metrics({ gpus: [{ index: 0, model: "H100", utilization: 101, memoryUsedBytes: "1", memoryTotalBytes: "2" }] }) },
      "metrics.gpus[0].utilization",
    ],
    [
      "GPU memory used > total",
      { metrics: metrics({ gpus: [{ index: 0, model: "H100", utilization: 1, memoryUsedBytes: "3", memoryTotalBytes: "2" }] }) },
      "metrics.gpus[0].memory",
    ],
    ["disk free > total", { metrics: metrics({ disks: [{ mount: "/", freeBytes: "6", totalBytes: "5" }] }) }, "metrics.disks[0]"],
    ["a bad name", { name: "bad name!" }, "name"],
  ];

  it.each(heartbeatCases)("Heartbeat with %s is INVALID_ARGUMENT and writes nothing", async (_label, bad, field) => {
    await register("e2e-hb-valid");
    await heartbeat("e2e-hb-valid", { metrics: metrics(), inFlight: 1 });
    await daemon.maintenance.flushHeartbeats();
    const before = await agentRow(db, "e2e-hb-valid");
    clock.advance(10);
    const [err] = await call(client, "heartbeat", { name: "e2e-hb-valid", ...bad });
    expect(err?.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err?.details).toContain(field);
    await daemon.maintenance.flushHeartbeats();
    expect(await agentRow(db, "e2e-hb-valid")).toEqual(before);
  });
});

describe("WatchDirectives", () => {
  it("starts with the agent's current status", async () => {
    await register("e2e-watch");
    const stream = watchDirectives(client, "e2e-watch");
    try {
      const first = await stream.next();
      expect(first.kind).toBe("status");
      expect(first.status?.status).toBe("AGENT_STATUS_ACTIVE");
    } finally {
      stream.close();
    }
  });

  it("fails NOT_FOUND for an unknown agent", async () => {
    const stream = watchDirectives(client, "e2e-watch-nobody");
    const err = await stream.next().catch((e: Error & { code?: number }) => e);
    expect((err as { code?: number }).code).toBe(grpc.status.NOT_FOUND);
  });

  it("fails UNAUTHENTICATED without a valid token", async () => {
    const stream = watchDirectives(client, "e2e-watch", "no-such-token-123");
    const err = await stream.next().catch((e: Error & { code?: number }) => e);
    expect((err as { code?: number }).code).toBe(grpc.status.UNAUTHENTICATED);
  });
});

describe("Deregister", () => {
  it("makes the agent inactive at once; its next heartbeat says so; registering again revives the same id", async () => {
    const { id } = await register("e2e-leaving");
    await heartbeat("e2e-leaving", { metrics: metrics() });
    clock.advance(100);
    await ok(client, "deregister", { name: "e2e-leaving" });
    // No flush, no sweep: the row is inactive as soon as the call returns.
    const row = await agentRow(db, "e2e-leaving");
    expect(row).toMatchObject({ status: "inactive" });
    expect(row!.updatedon!.getTime()).toBe(clock.nowMs());
    // The heartbeat buffered before the deregistration must not land after it.
    await daemon.maintenance.flushHeartbeats();
    expect((await agentRow(db, "e2e-leaving"))!.metrics).toBeNull();
    expect((await heartbeat("e2e-leaving")).status).toBe("AGENT_STATUS_INACTIVE");
    const again = await register("e2e-leaving");
    expect(again).toMatchObject({ id, created: false, status: "AGENT_STATUS_ACTIVE" });
    expect((await heartbeat("e2e-leaving")).status).toBe("AGENT_STATUS_ACTIVE");
  });

  it("an unknown agent is NOT_FOUND", async () => {
    const [err] = await call(client, "deregister", { name: "e2e-nobody" });
    expect(err?.code).toBe(grpc.status.NOT_FOUND);
  });
});
