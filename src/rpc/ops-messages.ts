/** Registry rows as operators see them on the wire. */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { JsonObject } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromMs } from "@bufbuild/protobuf/wkt";
import { AgentType } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import type { AgentSummarySchema, DrainProgressSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { drainSchema, type AgentWithLoad, type DrainState } from "../store/agents.js";
import { agentStatusToWire } from "./agent-service/messages.js";

const TYPES: Record<string, AgentType> = { remote: AgentType.REMOTE, local: AgentType.LOCAL };

export function drainOf(metadata: Record<string, unknown> | null): (DrainState & { releasedAtDeadline: number }) | null {
  const parsed = drainSchema.extend({ releasedAtDeadline: drainSchema.shape.inFlightAtStart.optional() }).safeParse(metadata?.drain);
  return parsed.success ? { ...parsed.data, releasedAtDeadline: parsed.data.releasedAtDeadline ?? 0 } : null;
}

export function drainProgress(metadata: Record<string, unknown> | null, inFlight: number): MessageInitShape<typeof DrainProgressSchema> | undefined {
  const d = drainOf(metadata);
  if (!d) return undefined;
  return {
    reason: d.reason,
    startedAt: timestampFromMs(d.startedAt),
    deadline: d.deadline === null ? undefined : timestampFromMs(d.deadline),
    inFlightAtStart: d.inFlightAtStart,
    inFlightNow: inFlight,
    complete: inFlight === 0,
    releasedAtDeadline: d.releasedAtDeadline,
  };
}

export function agentSummary(r: AgentWithLoad, nowMs: number): MessageInitShape<typeof AgentSummarySchema> {
  const m = (r.metadata ?? {}) as { tags?: Record<string, string>; slots?: number; tenants?: string[]; engineKinds?: string[]; models?: string[] };
  const lastSeen = r.updatedon ?? r.createdon;
  return {
    id: r.id,
    name: r.name,
    status: agentStatusToWire(r.status),
    agentVersion: r.agentversion ?? "",
    agentType: TYPES[r.agenttype ?? ""] ?? AgentType.UNSPECIFIED,
    metadata: { tags: m.tags ?? {}, slots: m.slots ?? 0, tenants: m.tenants ?? [], engineKinds: m.engineKinds ?? [], models: m.models ?? [] },
    metrics: (r.metrics ?? undefined) as JsonObject | undefined,
    lastSeenAge: durationFromMs(Math.max(0, nowMs - lastSeen)),
    inFlight: r.in_flight,
    drain: r.status === "draining" || r.status === "inactive" ? drainProgress(r.metadata, r.in_flight) : undefined,
    httpAddress: r.http_address ?? "",
    grpcAddress: r.grpc_address ?? "",
    infraAddress: r.infra_address ?? "",
    createdOn: timestampFromMs(r.createdon),
  };
}
