/**
 * Liveness of agents and of daemon instances (aiflow_engine), as maintenance tasks.
 */
import type { AuditLog } from "../audit.js";
import type { Config } from "../config.js";
import type { Logger } from "../log.js";
import type { AgentStore } from "../store/agents.js";
import type { EngineStore } from "../store/engines.js";
import type { DirectiveHub } from "./directives.js";
import type { MaintenanceTask } from "../maintenance.js";

/** Agents whose last heartbeat is older than livenessIntervals × heartbeatInterval go inactive. */
export function agentLivenessTask(deps: {
  config: Config;
  agents: AgentStore;
  hub: DirectiveHub;
  audit: AuditLog;
  log: Logger;
  onAgentGone?: (name: string) => Promise<void>;
}): MaintenanceTask {
  const window = deps.config.livenessIntervals * deps.config.heartbeatInterval;
  return {
    name: "agent-liveness",
    async run(now) {
      const gone = await deps.agents.markStaleInactive(now, now - window);
      if (gone.length === 0) return;
      deps.log.warn({ agents: gone.map((g) => g.name), missedForMs: window }, "agents missed their heartbeats: marked inactive");
      deps.audit.record({ table: "agent", action: "update", ids: gone.map((g) => g.id), fields: ["status", "updatedby", "updatedon"], by: "liveness-sweep", at: now });
      for (const g of gone) {
        await deps.hub.publish(g.name, { kind: "status", status: "inactive", reason: "missed heartbeats", drainDeadline: null });
        await deps.onAgentGone?.(g.name);
      }
    },
  };
}

/** Keeps this instance's aiflow_engine rows alive, and finds other instances that stopped doing so. */
export function engineLivenessTask(deps: { config: Config; engines: EngineStore; log: Logger }): MaintenanceTask {
  const { config } = deps;
  const window = config.livenessIntervals * config.heartbeatInterval;
  let lastKeepAlive = Number.NEGATIVE_INFINITY;
  return {
    name: "engine-liveness",
    async run(now) {
      if (now - lastKeepAlive >= config.heartbeatInterval) {
        await deps.engines.keepAlive(config.instanceId, config.tenants, now);
        lastKeepAlive = now;
      }
      const stale = await deps.engines.markStale(now, now - window, config.instanceId);
      if (stale.length > 0) deps.log.warn({ engines: [...new Set(stale.map((s) => s.engineid))] }, "daemon instances stopped keeping alive: marked stale");
    },
  };
}
