/**
 * Liveness of agents and of daemon instances (aiflow_engine), as maintenance tasks.
 *
 * An agent is judged by the heartbeats that reached any daemon, including those a daemon holds
 * because it cannot write them. What must stay true:
 *
 * - A daemon's keepalive (aiflow_engine.updatedon) is a time before which every heartbeat it
 *   received is written: it flushes them first and keeps alive only when that worked. So a daemon
 *   the database is away from stops moving its keepalive, and one that comes back writes what it
 *   holds before it says so, and before its own agent sweep runs (the next task).
 * - An agent goes inactive only when its last beat is older than the window AND no daemon that may
 *   hold a newer one is behind: every daemon has kept alive since the agent's deadline, or is
 *   stopped, or is presumed dead. When the sweeping daemon wrote the agent's last beat itself (it
 *   remembers: HeartbeatBuffer.ownBeatsBefore), it alone may hold a newer one, since an agent moves
 *   to another daemon by registering there, which rewrites its row.
 * - A daemon judges no agent until it has reached the database for a full window: since its first
 *   maintenance run, or since its first run after one the database's absence failed (Maintenance's
 *   reachedSinceMs). Before that, agents have not had a window to reach it (they were beating to
 *   the daemon it replaced, or to none while every daemon was down or cut off), and the daemons
 *   that got the database back with it have not all written what they held. So a restart costs
 *   nothing (the first run, before the server serves, marks no one), and after an outage of the
 *   database itself the first daemon back does not judge agents whose last write is a
 *   registration (judged by its time alone, below) while the daemon holding their beats is still
 *   on its way back. An agent silent for the whole window goes inactive at its end, as ever.
 *
 * Why this way: of "no sweep until every live instance has flushed" and "the sweep's clock stops
 * while the database was unreachable", the first is the rule, because it needs no guess of how long
 * the database was away from whom: a daemon's keepalive says exactly what it has written. Asked of
 * the sweeping daemon alone for the agents whose beats it wrote, it costs nothing when all is well,
 * and a daemon that is cut off holds back only the agents whose beats came from elsewhere. The
 * second serves where the first cannot tell: a daemon cut off from the database and a dead one look
 * alike, so a daemon silent for SILENT_DAEMON_WINDOWS is presumed dead, its silence counted only
 * over time the sweeping daemon itself reached the database. After an outage of the database
 * itself, the daemons that come back first therefore give the others that long again to come back
 * and write what they hold.
 */
import type { AuditLog } from "../audit.js";
import type { Config } from "../config.js";
import type { Logger } from "../log.js";
import type { AgentStore } from "../store/agents.js";
import type { EngineStore } from "../store/engines.js";
import type { DirectiveHub } from "./directives.js";
import type { HeartbeatBuffer } from "./heartbeat-buffer.js";
import type { MaintenanceTask } from "../maintenance.js";

/**
 * Liveness windows a daemon instance may be silent before the sweep stops waiting for it. Up to
 * this, a daemon cut off from the database keeps the agents beating to it; past it, the agents of
 * a daemon that died (which cannot say so) go inactive instead of staying active forever.
 */
export const SILENT_DAEMON_WINDOWS = 4;

/**
 * Agents whose last heartbeat is older than livenessIntervals × heartbeatInterval go inactive,
 * unless a daemon may hold a newer one (see the file's opening comment).
 */
export function agentLivenessTask(deps: {
  config: Config;
  agents: AgentStore;
  hub: DirectiveHub;
  audit: AuditLog;
  heartbeats: Pick<HeartbeatBuffer, "ownBeatsBefore">;
  log: Logger;
  onAgentGone?: (name: string) => Promise<void>;
}): MaintenanceTask {
  const window = deps.config.livenessIntervals * deps.config.heartbeatInterval;
  const silentLimit = SILENT_DAEMON_WINDOWS * window;
  // This daemon has reached the database since `reachedSince` without a break: Maintenance says
  // so, and every sweep since then ran within a window of the one before. After a longer gap
  // (this process hung or paused) the count starts again too.
  let reachedSince = Number.NEGATIVE_INFINITY;
  let lastSweep = Number.NEGATIVE_INFINITY;
  return {
    name: "agent-liveness",
    async run(now, run) {
      const reached = run?.reachedSinceMs ?? Number.NEGATIVE_INFINITY;
      const since = Math.max(reached, now - lastSweep > window ? now : reachedSince);
      if (now - reached < window) {
        // Too soon to judge anyone (see the file's opening comment). Maintenance vouches for the
        // database since `reached`, so the stretch counts as swept.
        reachedSince = since;
        lastSweep = now;
        return;
      }
      const deadBefore = now - silentLimit;
      const gone = await deps.agents.markStaleInactive(now, now - window, {
        self: deps.config.instanceId,
        ownBeats: deps.heartbeats.ownBeatsBefore(now - window, deadBefore),
        presumedDeadBeforeMs: since <= deadBefore ? deadBefore : null,
      });
      reachedSince = since;
      lastSweep = now;
      if (gone.length === 0) return;
      deps.log.warn({ agents: gone.map((g) => g.name), missedForMs: window }, "agents missed their heartbeats: marked inactive");
      deps.audit.record({
        table: "agent",
        action: "update",
        ids: gone.map((g) => g.id),
        fields: ["status", "updatedby", "updatedon"],
        by: "liveness-sweep",
        at: now,
      });
      for (const g of gone) {
        await deps.hub.publish(g.name, { kind: "status", status: "inactive", reason: "missed heartbeats", drainDeadline: null });
        await deps.onAgentGone?.(g.name);
      }
    },
  };
}

/**
 * Keeps this instance's aiflow_engine rows alive on every run, once its buffered heartbeats are
 * written, and finds other instances that stopped doing so.
 */
export function engineLivenessTask(deps: { config: Config; engines: EngineStore; heartbeats: Pick<HeartbeatBuffer, "flush">; log: Logger }): MaintenanceTask {
  const { config } = deps;
  const window = config.livenessIntervals * config.heartbeatInterval;
  return {
    name: "engine-liveness",
    async run(now) {
      // The flush takes what is buffered after `now` was read, so every beat received before `now`
      // is written when it resolves; when it throws, the keepalive stays where it was.
      await deps.heartbeats.flush();
      await deps.engines.keepAlive(config.instanceId, config.tenants, now);
      const stale = await deps.engines.markStale(now - window, config.instanceId);
      if (stale.length > 0) deps.log.warn({ engines: [...new Set(stale.map((s) => s.engineid))] }, "daemon instances stopped keeping alive: marked stale");
    },
  };
}
