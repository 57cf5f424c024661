/**
 * AgentService (role `agent`): registration by name, coalesced heartbeats, directive push, clean
 * deregistration. Handlers validate, call the store, and shape the reply; nothing else.
 */
import type { ServiceImpl } from "@connectrpc/connect";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import type { AuditLog } from "../../audit.js";
import type { Clock } from "../../clock.js";
import type { Config } from "../../config.js";
import { invalidArgument, notFound, permissionDenied } from "../../domain/errors.js";
import { type AgentService, AgentType, type AgentMetrics, type RegisterRequest } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { assertAgentTenants, callerOf, tenantsOutside, type Identity } from "../caller.js";
import { REGISTER_FIELDS, type AgentStore, type RegisterInput } from "../../store/agents.js";
import { agentStatusToWire, directiveToWire } from "./messages.js";
import type { AgentScope, DirectiveHub, DirectiveMessage, KnownAgent } from "../../fleet/directives.js";
import type { HeartbeatBuffer } from "../../fleet/heartbeat-buffer.js";
import { identifier, identifiers, inRange, optionalText, withinBytes } from "../../domain/input.js";
import { agentName } from "../input/validate.js";
import { pushStream } from "../../util/push-stream.js";
import { capacityOf } from "../../domain/resource-input.js";
import type { Capacity } from "../../domain/resources.js";

export interface AgentServiceDeps {
  config: Config;
  clock: Clock;
  agents: AgentStore;
  hub: DirectiveHub;
  heartbeats: HeartbeatBuffer;
  audit: AuditLog;
  draining: AbortSignal;
  /** Called after an agent deregistered, so the queue can release its work at once. */
  onAgentGone?: (name: string) => Promise<void>;
}

/**
 * The agent's last known state: from the hub's cache, else the database (then cached). A cached
 * `inactive` is re-read: the agent may have registered again through another daemon, which tells
 * no other daemon, and an inactive agent is expected to do little more than register.
 */
export function knownAgentLoader(agents: AgentStore, hub: DirectiveHub): (name: string) => Promise<KnownAgent> {
  return async (name) => {
    const cached = hub.known(name);
    if (cached && cached.status !== "inactive") return cached;
    const row = await agents.status(name);
    if (!row) throw notFound(`agent '${name}' is not registered: call Register first`);
    const state = { status: row.status, drain: row.drain };
    hub.remember(name, state);
    return state;
  };
}

/** How long a cached scope is trusted without a status directive dropping it (see DirectiveHub). */
const SCOPE_TTL_MS = 5_000;

/**
 * The agent's work scope: from the hub's cache, else the database (then cached). NOT_FOUND when the
 * agent is not registered.
 */
export function agentScopeLoader(hub: DirectiveHub, load: (name: string) => Promise<AgentScope | null>): (name: string) => Promise<AgentScope> {
  return async (name) => {
    const cached = hub.scope(name, SCOPE_TTL_MS);
    if (cached) return cached;
    const scope = await load(name);
    if (!scope) throw notFound(`agent '${name}' is not registered: call Register first`);
    hub.rememberScope(name, scope);
    return scope;
  };
}

/**
 * Refuses a call for an agent that serves a tenant the caller's token is not limited to: such a
 * token may not act as an agent of other tenants, whatever the agent's name. Free for tokens
 * without a tenant limit (no lookup).
 */
export async function assertAgentWithin(caller: Identity, name: string, scopeOf: (name: string) => Promise<AgentScope>): Promise<void> {
  if (!caller.tenants) return;
  assertScopeWithin(caller, name, await scopeOf(name));
}

export function assertScopeWithin(caller: Identity, name: string, scope: AgentScope): void {
  assertAgentTenants(caller, name, scope.tenants);
}

const quoted = (xs: readonly string[]) => xs.map((x) => `'${x}'`).join(", ");

export function agentServiceImpl(d: AgentServiceDeps): Pick<ServiceImpl<typeof AgentService>, "register" | "heartbeat" | "watchDirectives" | "deregister"> {
  const known = knownAgentLoader(d.agents, d.hub);
  const scopeOf = agentScopeLoader(d.hub, (name) => d.agents.workScope(name));

  const statusDirective = (s: KnownAgent): DirectiveMessage => ({
    kind: "status",
    status: s.status,
    reason: s.drain?.reason ?? "",
    drainDeadline: s.status === "draining" ? (s.drain?.deadline ?? null) : null,
  });

  return {
    async register(req, ctx) {
      const caller = callerOf(ctx);
      const input = registerInput(req, caller, d.config.metadataMaxBytes);
      const now = d.clock.nowMs();
      // A token limited to some tenants may not take over an agent registered for others: the
      // statement leaves such a row alone and answers nothing.
      const res = await d.agents.register(input, now, caller.principal, caller.tenants ? [...caller.tenants] : null);
      d.hub.forgetScope(input.name);
      const row = await d.agents.status(input.name);
      d.hub.remember(input.name, { status: res.status, drain: row?.drain ?? null });
      // Other daemons' caches and directive streams learn the new status at once.
      if (!res.created)
        await d.hub.publish(input.name, { kind: "status", status: res.status, reason: "registered", drainDeadline: row?.drain?.deadline ?? null });
      d.audit.record({
        table: "agent",
        action: res.created ? "create" : "update",
        ids: [res.id],
        fields: res.created ? ["id", "name", "createdby", "createdon", ...REGISTER_FIELDS] : REGISTER_FIELDS,
        by: caller.principal,
        at: now,
      });
      return {
        id: res.id,
        status: agentStatusToWire(res.status),
        heartbeatInterval: durationFromMs(d.config.heartbeatInterval),
        leaseTtl: durationFromMs(d.config.leaseTtl),
        created: res.created,
      };
    },

    async heartbeat(req, ctx) {
      const name = agentName(req.name, ctx);
      const at = d.clock.nowMs();
      const metrics = metricsJson(req.metrics, req.inFlight, at);
      await assertAgentWithin(callerOf(ctx), name, scopeOf);
      const state = await known(name);
      d.heartbeats.add({ name, metrics, at });
      return { status: agentStatusToWire(state.status), directives: d.hub.takePending(name).map(directiveToWire) };
    },

    async *watchDirectives(req, ctx) {
      const name = agentName(req.name, ctx);
      await assertAgentWithin(callerOf(ctx), name, scopeOf);
      // Subscribe before reading the status: a directive that arrives while it is read is queued
      // here and follows the status message, instead of being lost.
      const early: DirectiveMessage[] = [];
      let deliver: (m: DirectiveMessage) => void = (m) => void early.push(m);
      const unsubscribe = d.hub.subscribe(name, (m) => deliver(m));
      try {
        const state = await known(name);
        yield { directive: directiveToWire(statusDirective(state)) };
        const handOver = (push: (m: DirectiveMessage) => void) => {
          for (const m of early.splice(0)) push(m);
          deliver = push;
          return () => {};
        };
        for await (const directive of pushStream<DirectiveMessage>(handOver, [ctx.signal, d.draining])) yield { directive: directiveToWire(directive) };
      } finally {
        unsubscribe();
      }
    },

    async deregister(req, ctx) {
      const caller = callerOf(ctx);
      const name = agentName(req.name, ctx);
      await assertAgentWithin(caller, name, scopeOf);
      const now = d.clock.nowMs();
      d.heartbeats.discard(name);
      const row = await d.agents.deregister(name, now, caller.principal);
      if (!row) throw notFound(`agent '${name}' is not registered`);
      const prev = d.hub.known(name);
      d.hub.remember(name, { status: "inactive", drain: prev?.drain ?? null });
      d.audit.record({ table: "agent", action: "update", ids: [row.id], fields: ["status", "updatedby", "updatedon"], by: caller.principal, at: now });
      // Every daemon caches the agent's status and may hold its stream: tell them all.
      await d.hub.publish(name, { kind: "status", status: "inactive", reason: "deregistered", drainDeadline: null });
      await d.onAgentGone?.(name);
      return {};
    },
  };
}

const AGENT_TYPES: Record<AgentType, string | null> = { [AgentType.UNSPECIFIED]: null, [AgentType.REMOTE]: "remote", [AgentType.LOCAL]: "local" };

function registerInput(req: RegisterRequest, caller: Identity, metadataMaxBytes: number): RegisterInput {
  const name = agentName(req.name, caller);
  const m = req.metadata;
  const tags: Record<string, string> = {};
  for (const [k, v] of Object.entries(m?.tags ?? {})) tags[identifier(k, "metadata.tags key")] = optionalText(v, `metadata.tags[${k}]`, 256) ?? "";
  const tenants = identifiers(m?.tenants ?? [], "metadata.tenants");
  // An agent token limited to some tenants cannot register an agent that serves others.
  const outside = tenantsOutside(caller, tenants);
  if (outside.length > 0) throw permissionDenied(`token may not serve tenant(s) ${quoted(outside)}`);
  const metadata = {
    tags,
    slots: inRange(m?.slots ?? 0, "metadata.slots", 0, 100_000),
    tenants,
    engineKinds: identifiers(m?.engineKinds ?? [], "metadata.engine_kinds"),
    models: (m?.models ?? []).map((x, i) => optionalText(x, `metadata.models[${i}]`, 256) ?? "").filter(Boolean),
    ...capacityField(capacityOf(m?.capacity, "metadata.capacity")),
  };
  withinBytes(metadata, "metadata", metadataMaxBytes);
  const agentType = AGENT_TYPES[req.agentType];
  if (agentType === undefined) throw invalidArgument("agent_type", `unknown value ${req.agentType}`);
  return {
    name,
    httpAddress: optionalText(req.httpAddress, "http_address", 512),
    grpcAddress: optionalText(req.grpcAddress, "grpc_address", 512),
    infraAddress: optionalText(req.infraAddress, "infra_address", 512),
    agentVersion: optionalText(req.agentVersion, "agent_version", 128),
    binaryPath: optionalText(req.binaryPath, "binary_path", 1024),
    agentType,
    metadata,
  };
}

const capacityField = (c: Capacity | null) => (c ? { capacity: c } : {});

const PCT = (v: number, field: string) => inRange(v, field, 0, 100);

/**
 * Validates heartbeat metrics and shapes them for aiflow_agent.metrics, with `at`, the epoch ms the
 * heartbeat arrived: the claim trusts what it reports free only while it is younger than the
 * liveness window, and counts as unseen by it the items dispatched after it (placement.ts).
 */
export function metricsJson(m: AgentMetrics | undefined, inFlight: number, at: number): Record<string, unknown> {
  const bytes = (used: bigint, total: bigint, field: string) => {
    plausibleBytes(field, used, total);
    if (used > total && total > 0n) throw invalidArgument(field, `used ${used} exceeds total ${total}`);
    return { used: Number(used), total: Number(total) };
  };
  if (m === undefined) return { inFlight, at };
  if ((m.disks?.length ?? 0) > 64 || (m.gpus?.length ?? 0) > 64) throw invalidArgument("metrics", "at most 64 disks and 64 GPUs");
  return {
    cpu: { utilization: PCT(m.cpuUtilization, "metrics.cpu_utilization") },
    memory: bytes(m.memoryUsedBytes, m.memoryTotalBytes, "metrics.memory"),
    disks: m.disks.map((x, i) => ({
      mount: optionalText(x.mount, `metrics.disks[${i}].mount`, 512),
      ...freeTotal(x.freeBytes, x.totalBytes, `metrics.disks[${i}]`),
    })),
    gpus: m.gpus.map((g, i) => ({
      index: g.index,
      model: optionalText(g.model, `metrics.gpus[${i}].model`, 256),
      utilization: PCT(g.utilization, `metrics.gpus[${i}].utilization`),
      memory: bytes(g.memoryUsedBytes, g.memoryTotalBytes, `metrics.gpus[${i}].memory`),
    })),
    inFlight,
    at,
  };
}

/**
 * uint64 cannot be negative on the wire: a client that sends -1 puts 2^64-1 there. Byte counts
 * beyond 2^53 (8 PiB) are such wrapped negatives or garbage, and would lose precision as JSON numbers.
 */
const MAX_BYTES = BigInt(Number.MAX_SAFE_INTEGER);
function plausibleBytes(field: string, ...values: bigint[]): void {
  for (const v of values) if (v > MAX_BYTES) throw invalidArgument(field, `${v} bytes is out of range (a negative number sent as uint64?)`);
}

function freeTotal(free: bigint, total: bigint, field: string) {
  plausibleBytes(field, free, total);
  if (free > total && total > 0n) throw invalidArgument(field, `free ${free} exceeds total ${total}`);
  return { free: Number(free), total: Number(total) };
}
