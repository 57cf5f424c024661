/**
 * The registration: what the agent tells the daemon it is (its name, addresses, slots, tenants and
 * the capacity start() detected: every registration sends the same, the first and each one after
 * reconnecting, link.ts), and what the daemon's answer tells the agent (its id, the heartbeat
 * interval and the lease TTL to keep, and its status).
 */
import { durationMs } from "@bufbuild/protobuf/wkt";
import { AgentType } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { capacityToWire, type Capacity } from "./liveness/capacity.js";
import type { AgentClient } from "./link.js";
import type { ResolvedOptions } from "./options.js";
import { statusFromWire, type DaemonStatus } from "./wire.js";

/** What a registration told the agent. */
export interface Registration {
  /** The agent's id (a ULID), stable across registrations of its name. */
  id: string;
  /** The daemon it registered with. */
  address: string;
  /** True when this registration created the agent. */
  created: boolean;
  heartbeatIntervalMs: number;
  leaseTtlMs: number;
  /** The daemon's view of the agent: `draining` when a drain survived a reconnect. */
  status: DaemonStatus;
}

export const DEFAULT_HEARTBEAT_MS = 5_000;
const DEFAULT_LEASE_TTL_MS = 30_000;

/** Registers with the daemon at `address`, bounded by rpcTimeoutMs; rejects with the call's error. */
export async function register(client: AgentClient, address: string, o: ResolvedOptions, detected: Capacity | undefined): Promise<Registration> {
  const capacity = detected ? { capacity: capacityToWire(detected) } : {};
  const res = await client.register(
    {
      name: o.name,
      httpAddress: o.advertise.http,
      grpcAddress: o.advertise.grpc,
      infraAddress: o.advertise.infra,
      agentVersion: o.agentVersion,
      binaryPath: o.binaryPath,
      agentType: o.agentType === "local" ? AgentType.LOCAL : AgentType.REMOTE,
      metadata: { tags: o.tags, slots: o.slots, tenants: o.tenants, engineKinds: o.engineKinds, models: o.models, ...capacity },
    },
    { timeoutMs: o.rpcTimeoutMs },
  );
  return {
    id: res.id,
    address,
    created: res.created,
    heartbeatIntervalMs: res.heartbeatInterval ? durationMs(res.heartbeatInterval) : DEFAULT_HEARTBEAT_MS,
    leaseTtlMs: res.leaseTtl ? durationMs(res.leaseTtl) : DEFAULT_LEASE_TTL_MS,
    status: statusFromWire(res.status),
  };
}
