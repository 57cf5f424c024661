/** Conversions between stored values and wire enums/messages, shared by the services. */
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { DirectiveSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import type { AgentStatus as StoredStatus } from "../../store/agents.js";
import type { DirectiveMessage } from "../../fleet/directives.js";

const STATUS: Record<StoredStatus, AgentStatus> = {
  active: AgentStatus.ACTIVE,
  draining: AgentStatus.DRAINING,
  inactive: AgentStatus.INACTIVE,
};

export const agentStatusToWire = (s: StoredStatus | null): AgentStatus => (s ? STATUS[s] : AgentStatus.UNSPECIFIED);

export function agentStatusFromWire(s: AgentStatus): StoredStatus | undefined {
  return (Object.entries(STATUS) as [StoredStatus, AgentStatus][]).find(([, w]) => w === s)?.[0];
}

export function directiveToWire(d: DirectiveMessage): MessageInitShape<typeof DirectiveSchema> {
  if (d.kind === "status")
    return {
      kind: {
        case: "status",
        value: {
          status: agentStatusToWire(d.status),
          reason: d.reason,
          drainDeadline: d.drainDeadline === null ? undefined : timestampFromMs(d.drainDeadline),
        },
      },
    };
  return { kind: { case: "cancel", value: { workItemId: d.workItemId, leaseToken: d.leaseToken, reason: d.reason } } };
}
