/**
 * The authorization matrix: every RPC the daemon serves × every kind of token, over real HTTP/2 with
 * a stock @grpc/grpc-js client. The methods come from the generated service descriptors, so an RPC
 * added without a row here fails this test. Each row's request targets tenant tB's rows and agents;
 * a token limited to tenant tA, or to agent names `a-*`, must be refused them (or, for reads that
 * filter, see none of them).
 */
import type { DescService } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { AgentService } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { RunDirectoryService, TriggerFiringService } from "@aiflow/wire/gen/aiflow/cluster/v1/runs_pb.js";
import { DagOpsService, DagService } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { TriggerService } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { GraphService } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { MachineService } from "@aiflow/wire/gen/aiflow/machine/v1/machine_pb.js";
import { Health } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import { ServerReflection } from "@aiflow/wire/gen/grpc/reflection/v1/reflection_pb.js";
import { ServerReflection as ServerReflectionAlpha } from "@aiflow/wire/gen/grpc/reflection/v1alpha/reflection_pb.js";
import { parseTokenSpec, parseTokensFile, type TokenGrant } from "../src/domain/tokens.js";
import { useTestDaemon } from "./support/kit.js";
import { grpc, loadService, metadata, unary } from "./support/grpc-js.js";

const TOKEN = {
  agent: "m-agent-all",
  agentTA: "m-agent-ta",
  agentNames: "m-agent-names",
  engine: "m-engine-all",
  engineTA: "m-engine-ta",
  ops: "m-ops-all-1",
  opsTA: "m-ops-ta-1",
  runs: "m-runs-all-1",
  runsTA: "m-runs-ta-1",
} as const;
type TokenKind = keyof typeof TOKEN | "none";
/** Limited tokens first: a row's refused calls run before the allowed ones change its target. */
const KINDS: TokenKind[] = ["none", "agentTA", "agentNames", "agent", "engineTA", "engine", "opsTA", "ops", "runsTA", "runs"];
const ROLE_OF: Record<Exclude<TokenKind, "none">, "agent" | "engine" | "ops" | "runs"> = {
  agent: "agent",
  agentTA: "agent",
  agentNames: "agent",
  engine: "engine",
  engineTA: "engine",
  ops: "ops",
  opsTA: "ops",
  runs: "runs",
  runsTA: "runs",
};
const LIMITED = new Set<TokenKind>(["agentTA", "agentNames", "engineTA", "opsTA", "runsTA"]);

const grants = (): TokenGrant[] => [
  parseTokenSpec(`agent:${TOKEN.agent}`, "t"),
  parseTokenSpec(`agent:${TOKEN.agentTA}:tA`, "t"),
  ...parseTokensFile(JSON.stringify([{ role: "agent", token: TOKEN.agentNames, agents: ["a-*"], name: "agent-names" }]), "t"),
  parseTokenSpec(`engine:${TOKEN.engine}`, "t"),
  parseTokenSpec(`engine:${TOKEN.engineTA}:tA`, "t"),
  parseTokenSpec(`ops:${TOKEN.ops}`, "t"),
  parseTokenSpec(`ops:${TOKEN.opsTA}:tA`, "t"),
  parseTokenSpec(`runs:${TOKEN.runs}`, "t"),
  parseTokenSpec(`runs:${TOKEN.runsTA}:tA`, "t"),
];

type Access = "agent" | "engine" | "ops" | "runs" | "public" | "any";
const SERVICES: { service: DescService; access: Access; proto: string }[] = [
  { service: AgentService, access: "agent", proto: "aiflow/cluster/v1/agent.proto" },
  { service: QueueService, access: "engine", proto: "aiflow/cluster/v1/queue.proto" },
  { service: OpsService, access: "ops", proto: "aiflow/cluster/v1/ops.proto" },
  { service: RunDirectoryService, access: "engine", proto: "aiflow/cluster/v1/runs.proto" },
  { service: TriggerFiringService, access: "engine", proto: "aiflow/cluster/v1/runs.proto" },
  { service: DagService, access: "runs", proto: "aiflow/dag/v1/dag.proto" },
  { service: DagOpsService, access: "ops", proto: "aiflow/dag/v1/dag.proto" },
  { service: TriggerService, access: "runs", proto: "aiflow/trigger/v1/trigger.proto" },
  { service: GraphService, access: "runs", proto: "aiflow/graph/v1/graph.proto" },
  { service: MachineService, access: "runs", proto: "aiflow/machine/v1/machine.proto" },
  { service: Health, access: "public", proto: "grpc/health/v1/health.proto" },
  { service: ServerReflection, access: "any", proto: "grpc/reflection/v1/reflection.proto" },
  { service: ServerReflectionAlpha, access: "any", proto: "grpc/reflection/v1alpha/reflection.proto" },
];

const GRAPH_B = {
  id: "graph-b",
  start: "a",
  nodes: [
    { name: "a", kind: "NODE_KIND_TASK", engineKind: "nobody" },
    { name: "z", kind: "NODE_KIND_END" },
  ],
  edges: [{ from: "a", to: "z" }],
};
const MACHINE_B = {
  id: "machine-b",
  initial: "a",
  states: [
    { name: "a", transitions: [{ event: "go", to: "z" }] },
    { name: "z", terminal: true },
  ],
};

/** What the fixture made in tenant tB. */
interface Fixture {
  /** An item dispatched to b-agent, with the lease token its claim got. */
  held: { id: string; token: string };
  pending: string;
  cancelByEngine: string;
  cancelByOps: string;
}

interface Row {
  request: (f: Fixture) => object;
  /**
   * What a limited token of the method's role gets: refused (PERMISSION_DENIED, the default) or
   * allowed (a read that filters to the token's tenants); `code` names the exact code when allowed.
   */
  limited?: { outcome: "allowed"; code?: grpc.status };
}

const B = "b-agent";
const leaseOf = (f: Fixture) => [{ workItemId: f.held.id, leaseToken: f.held.token }];

const TABLE: Record<string, Row> = {
  "aiflow.cluster.v1.AgentService/Register": { request: () => ({ name: B, metadata: { tenants: ["tB"], engineKinds: ["dag"] } }) },
  "aiflow.cluster.v1.AgentService/Heartbeat": { request: () => ({ name: B }) },
  "aiflow.cluster.v1.AgentService/WatchDirectives": { request: () => ({ name: B }) },
  // The first message names the agent; the daemon answers it with the agent's status.
  "aiflow.cluster.v1.AgentService/Connect": { request: () => ({ name: B }) },
  "aiflow.cluster.v1.AgentService/Deregister": { request: () => ({ name: "b-dereg" }) },
  "aiflow.cluster.v1.AgentService/Claim": { request: () => ({ name: B, maxItems: 1 }) },
  "aiflow.cluster.v1.AgentService/ExtendLease": { request: (f) => ({ name: B, leases: leaseOf(f) }) },
  "aiflow.cluster.v1.AgentService/Complete": { request: (f) => ({ name: B, items: leaseOf(f) }) },
  "aiflow.cluster.v1.AgentService/Fail": { request: (f) => ({ name: B, items: leaseOf(f) }) },
  "aiflow.cluster.v1.AgentService/Release": { request: (f) => ({ name: B, leases: leaseOf(f) }) },

  "aiflow.cluster.v1.QueueService/Enqueue": { request: () => ({ tenantKey: "tB", items: [{ engineKind: "other" }] }) },
  "aiflow.cluster.v1.QueueService/GetItem": { request: (f) => ({ tenantKey: "tB", id: f.pending }) },
  "aiflow.cluster.v1.QueueService/ListItems": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.cluster.v1.QueueService/Wait": { request: (f) => ({ tenantKey: "tB", ids: [f.pending] }) },
  "aiflow.cluster.v1.QueueService/Cancel": { request: (f) => ({ tenantKey: "tB", ids: [f.cancelByEngine] }) },

  // Lists filter to the token's tenants rather than refusing it.
  "aiflow.cluster.v1.OpsService/ListAgents": { request: () => ({}), limited: { outcome: "allowed", code: grpc.status.OK } },
  "aiflow.cluster.v1.OpsService/GetAgent": { request: () => ({ name: B }) },
  "aiflow.cluster.v1.OpsService/DrainAgent": { request: () => ({ name: "b-drain" }) },
  "aiflow.cluster.v1.OpsService/UndrainAgent": { request: () => ({ name: "b-drain" }) },
  "aiflow.cluster.v1.OpsService/RemoveAgent": { request: () => ({ name: "b-remove" }) },
  "aiflow.cluster.v1.OpsService/QueueStats": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.cluster.v1.OpsService/ListItems": { request: () => ({ tenantKey: "tB" }) },
  // Another tenant's item is not revealed: it answers as a missing one.
  "aiflow.cluster.v1.OpsService/GetItem": { request: (f) => ({ id: f.pending }), limited: { outcome: "allowed", code: grpc.status.NOT_FOUND } },
  "aiflow.cluster.v1.OpsService/CancelItems": { request: (f) => ({ tenantKey: "tB", ids: [f.cancelByOps] }) },
  "aiflow.cluster.v1.OpsService/RedriveItems": { request: () => ({ tenantKey: "tB", all: true }) },
  // Bindings belong to a tenant: tB's are refused to a token limited to tA.
  "aiflow.cluster.v1.OpsService/ListBindings": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.cluster.v1.OpsService/Unbind": { request: () => ({ tenantKey: "tB", affinityKey: "key-b" }) },
  "aiflow.cluster.v1.OpsService/Rebind": { request: () => ({ tenantKey: "tB", affinityKey: "key-b", agentId: B }) },
  // Concurrency keys carry a tenant: tB's are refused to a token limited to tA.
  "aiflow.cluster.v1.OpsService/ListConcurrencyKeys": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.cluster.v1.OpsService/SetConcurrencyLimit": { request: () => ({ tenantKey: "tB", key: "key-b", maxInFlight: 2 }) },
  // So do tenants' weights and rate limits.
  "aiflow.cluster.v1.OpsService/ListTenants": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.cluster.v1.OpsService/SetTenantWeight": { request: () => ({ tenantKey: "tB", weight: 2 }) },
  "aiflow.cluster.v1.OpsService/ListRateLimits": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.cluster.v1.OpsService/SetRateLimit": { request: () => ({ tenantKey: "tB", key: "key-b", count: 5, interval: { seconds: 1, nanos: 0 } }) },

  "aiflow.cluster.v1.RunDirectoryService/RecordRun": { request: () => ({ tenantKey: "tB", runId: "run-b", engineKind: "dag" }) },
  "aiflow.cluster.v1.RunDirectoryService/GetRun": { request: () => ({ tenantKey: "tB", runId: "run-b" }) },
  "aiflow.cluster.v1.RunDirectoryService/ListRuns": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.cluster.v1.TriggerFiringService/RecordFiring": {
    request: () => ({
      tenantKey: "tB",
      triggerName: "hook",
      triggerType: "TRIGGER_TYPE_WEBHOOK",
      outcome: "FIRING_OUTCOME_STARTED",
      runId: "run-b",
      firedOn: String(Date.now() * 1_000_000),
    }),
  },
  "aiflow.cluster.v1.TriggerFiringService/GetFiring": { request: () => ({ tenantKey: "tB", id: "01J00000000000000000000000" }) },
  "aiflow.cluster.v1.TriggerFiringService/ListFirings": { request: () => ({ tenantKey: "tB" }) },

  // Runs of tB: a token limited to tA is refused before any read; an unknown run is NOT_FOUND.
  "aiflow.dag.v1.DagService/PutDefinition": { request: () => ({ tenantKey: "tB", definition: { id: "def-b", nodes: [{ name: "a", engineKind: "nobody" }] } }) },
  "aiflow.dag.v1.DagService/GetDefinition": { request: () => ({ tenantKey: "tB", definitionId: "def-b" }) },
  "aiflow.dag.v1.DagService/ListDefinitions": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.dag.v1.DagService/StartRun": { request: () => ({ tenantKey: "tB", definition: { nodes: [{ name: "a", engineKind: "nobody" }] } }) },
  "aiflow.dag.v1.DagService/GetRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000" }) },
  "aiflow.dag.v1.DagService/ListRuns": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.dag.v1.DagService/CancelRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000" }) },
  "aiflow.dag.v1.DagService/SignalRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000", event: "go" }) },
  "aiflow.dag.v1.DagService/ResumeRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000" }) },
  "aiflow.dag.v1.DagService/WatchRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000" }) },
  // Any run of tB, for operators: refused to a token limited to tA before any read.
  "aiflow.dag.v1.DagOpsService/GetRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000" }) },

  // Graph runs and machines of tB: a token limited to tA is refused before any read; an unknown run is NOT_FOUND.
  "aiflow.graph.v1.GraphService/PutDefinition": { request: () => ({ tenantKey: "tB", definition: GRAPH_B }) },
  "aiflow.graph.v1.GraphService/GetDefinition": { request: () => ({ tenantKey: "tB", definitionId: "graph-b" }) },
  "aiflow.graph.v1.GraphService/ListDefinitions": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.graph.v1.GraphService/StartRun": { request: () => ({ tenantKey: "tB", definition: GRAPH_B }) },
  "aiflow.graph.v1.GraphService/GetRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000" }) },
  "aiflow.graph.v1.GraphService/ListRuns": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.graph.v1.GraphService/CancelRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000" }) },
  "aiflow.graph.v1.GraphService/WatchRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000" }) },
  "aiflow.machine.v1.MachineService/PutDefinition": { request: () => ({ tenantKey: "tB", definition: MACHINE_B }) },
  "aiflow.machine.v1.MachineService/GetDefinition": { request: () => ({ tenantKey: "tB", definitionId: "machine-b" }) },
  "aiflow.machine.v1.MachineService/ListDefinitions": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.machine.v1.MachineService/StartRun": { request: () => ({ tenantKey: "tB", definition: MACHINE_B }) },
  "aiflow.machine.v1.MachineService/GetRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000" }) },
  "aiflow.machine.v1.MachineService/ListRuns": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.machine.v1.MachineService/SignalRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000", event: "go" }) },
  "aiflow.machine.v1.MachineService/CancelRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000" }) },
  "aiflow.machine.v1.MachineService/WatchRun": { request: () => ({ tenantKey: "tB", runId: "01J00000000000000000000000" }) },

  // Triggers of tB: a token limited to tA is refused before any read or write.
  "aiflow.trigger.v1.TriggerService/PutTrigger": {
    request: () => ({
      tenantKey: "tB",
      trigger: { name: "hook-b", type: "TRIGGER_TYPE_WEBHOOK", action: "ACTION_START", definitionId: "def-b", secret: "a-secret-of-16-bytes-or-more" },
    }),
  },
  "aiflow.trigger.v1.TriggerService/GetTrigger": { request: () => ({ tenantKey: "tB", name: "hook-b" }) },
  "aiflow.trigger.v1.TriggerService/ListTriggers": { request: () => ({ tenantKey: "tB" }) },
  "aiflow.trigger.v1.TriggerService/DeleteTrigger": { request: () => ({ tenantKey: "tB", name: "no-such-trigger" }) },

  "grpc.health.v1.Health/Check": { request: () => ({}) },
  "grpc.health.v1.Health/List": { request: () => ({}) },
  "grpc.health.v1.Health/Watch": { request: () => ({}) },
  "grpc.reflection.v1.ServerReflection/ServerReflectionInfo": { request: () => ({ listServices: "" }) },
  "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": { request: () => ({ listServices: "" }) },
};

type Outcome = "UNAUTHENTICATED" | "PERMISSION_DENIED" | "allowed";
const outcomeOf = (code: grpc.status): Outcome =>
  code === grpc.status.UNAUTHENTICATED ? "UNAUTHENTICATED" : code === grpc.status.PERMISSION_DENIED ? "PERMISSION_DENIED" : "allowed";

function expected(access: Access, kind: TokenKind, row: Row): Outcome {
  if (access === "public") return "allowed";
  if (kind === "none") return "UNAUTHENTICATED";
  if (access === "any") return "allowed";
  if (ROLE_OF[kind] !== access) return "PERMISSION_DENIED";
  if (!LIMITED.has(kind)) return "allowed";
  return row.limited?.outcome === "allowed" ? "allowed" : "PERMISSION_DENIED";
}

/** Calls any kind of method and resolves with the status code it ended with (OK once a stream answers). */
function callCode(
  client: grpc.Client,
  method: string,
  kind: "unary" | "server_streaming" | "client_streaming" | "bidi_streaming",
  req: object,
  token?: string,
): Promise<{ code: grpc.status; details: string }> {
  const fn = (client as unknown as Record<string, Function>)[method]!;
  if (kind === "unary") return unary(client, method, req, token).then(([err]) => ({ code: err ? err.code : grpc.status.OK, details: err?.details ?? "" }));
  return new Promise((resolve) => {
    let settled = false;
    const stream: grpc.ClientReadableStream<unknown> & Partial<grpc.ClientDuplexStream<unknown, unknown>> =
      kind === "server_streaming" ? fn.call(client, req, metadata(token)) : fn.call(client, metadata(token));
    const settle = (code: grpc.status, details = "") => {
      if (settled) return;
      settled = true;
      resolve({ code, details });
      stream.cancel();
    };
    stream.on("data", () => settle(grpc.status.OK));
    stream.on("error", (err: grpc.ServiceError) => settle(err.code, err.details));
    stream.on("end", () => settle(grpc.status.OK));
    if (kind !== "server_streaming") stream.write!(req);
  });
}

// Every method is called once without a token: more than the default --auth-failure-limit from one address in a minute.
const fx = useTestDaemon({ label: "authz", config: () => ({ tokens: grants(), authFailureLimit: 1_000 }) });
let daemon: Daemon;
const clients = new Map<string, grpc.Client>();
const fixture = {} as Fixture;

const clientOf = (typeName: string) => clients.get(typeName)!;

beforeAll(async () => {
  daemon = fx.daemon;
  for (const { service, proto } of SERVICES) {
    const Client = loadService(proto, service.typeName);
    clients.set(service.typeName, new Client(daemon.address, grpc.credentials.createInsecure()));
  }
  const agents = clientOf(AgentService.typeName);
  const queue = clientOf(QueueService.typeName);
  const must = async <T>(p: Promise<[grpc.ServiceError | null, T | undefined]>) => {
    const [err, res] = await p;
    if (err) throw err;
    return res!;
  };
  for (const name of [B, "b-dereg", "b-drain", "b-remove"])
    await must(unary(agents, "Register", { name, metadata: { tenants: ["tB"], engineKinds: ["dag"] } }, TOKEN.agent));
  const enqueue = async () =>
    (await must(unary<{ results: { id: string }[] }>(queue, "Enqueue", { tenantKey: "tB", items: [{ engineKind: "dag" }] }, TOKEN.engine))).results[0]!.id;
  const heldId = await enqueue();
  const claimed = await must(unary<{ items: { id: string; leaseToken: string }[] }>(agents, "Claim", { name: B, maxItems: 1 }, TOKEN.agent));
  expect(claimed.items.map((i) => i.id)).toEqual([heldId]);
  fixture.held = { id: heldId, token: claimed.items[0]!.leaseToken };
  // Kept pending by an engine kind no agent serves.
  const pending = async () =>
    (await must(unary<{ results: { id: string }[] }>(queue, "Enqueue", { tenantKey: "tB", items: [{ engineKind: "nobody" }] }, TOKEN.engine))).results[0]!.id;
  fixture.pending = await pending();
  fixture.cancelByEngine = await pending();
  fixture.cancelByOps = await pending();
}, 60_000);

afterAll(() => {
  for (const c of clients.values()) c.close();
});

describe("authorization matrix", () => {
  const methods = SERVICES.flatMap(({ service, access }) => service.methods.map((m) => ({ service, access, method: m, key: `${service.typeName}/${m.name}` })));

  it("has a row for every method of every served service, and none for methods that do not exist", () => {
    const missing = methods.filter((m) => !(m.key in TABLE)).map((m) => m.key);
    expect(missing, "add a row to TABLE for each new RPC").toEqual([]);
    expect(Object.keys(TABLE).filter((k) => !methods.some((m) => m.key === k))).toEqual([]);
  });

  it.each(methods.map((m) => [m.key, m] as const))("%s: each token gets what its role, tenants and agent names allow", async (key, m) => {
    const row = TABLE[key];
    expect(row, `no row for ${key}`).toBeDefined();
    const got: Record<string, string> = {};
    const want: Record<string, string> = {};
    for (const kind of KINDS) {
      const token = kind === "none" ? undefined : TOKEN[kind];
      const res = await callCode(clientOf(m.service.typeName), m.method.name, m.method.methodKind, row!.request(fixture), token);
      got[kind] = outcomeOf(res.code);
      want[kind] = expected(m.access, kind, row!);
      if (LIMITED.has(kind) && ROLE_OF[kind as Exclude<TokenKind, "none">] === m.access && row!.limited?.code !== undefined)
        expect(res.code, `${key} with ${kind}: ${res.details}`).toBe(row!.limited.code);
    }
    expect(got).toEqual(want);
  });
});
