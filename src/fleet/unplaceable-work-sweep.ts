/**
 * Work no agent could ever run: pending items whose requirements no registered agent that serves
 * their tenant and engine kind has the capacity for (../domain/resources.ts decides, against
 * registered capacity, not what is free now). They are reported (QueueStats, ListItems, GetItem)
 * rather than left to wait silently; they still wait, since an agent that fits may register, unless
 * --unplaceable-grace is set: then the sweep makes those that waited that long dead letters, naming
 * why (and RedriveItems brings them back once the fleet fits them).
 */
import type { Config } from "../config.js";
import type { Logger } from "../log.js";
import type { MaintenanceTask } from "../maintenance.js";
import { unplaceableReason, type Capacity, type Requirements } from "../domain/resources.js";
import type { AgentStore } from "../store/agents.js";
import type { WorkItemStatsStore } from "../store/work-item-stats.js";
import type { WorkItemStore } from "../store/work-items.js";

export interface NeedOf {
  tenant_key: string;
  engine_kind: string;
  requirements: Record<string, unknown>;
}

/** The fleet as one read of the agents' capacities, asked of many items. */
export class FleetCapacity {
  private constructor(private readonly agents: readonly { tenants: string[]; kinds: string[]; capacity: Record<string, unknown> | null }[]) {}

  static async read(agents: AgentStore): Promise<FleetCapacity> {
    return new FleetCapacity(await agents.capacities());
  }

  /** Why no agent could run an item with these needs, or null when one could. */
  reason(n: NeedOf): string | null {
    const serving = this.agents.filter((a) => a.tenants.includes(n.tenant_key) && a.kinds.includes(n.engine_kind));
    return unplaceableReason(
      n.requirements as Requirements,
      serving.map((a) => a.capacity as Capacity | null),
    );
  }
}

/** The reason per item (in order), reading the fleet only when some item states requirements. */
export async function unplaceableReasons(
  agents: AgentStore,
  items: readonly { status: string; tenant_key: string; engine_kind: string; worker_params: Record<string, unknown> | null }[],
): Promise<(string | null)[]> {
  const needs = (i: (typeof items)[number]) => i.status === "pending" && i.worker_params?.requirements !== undefined;
  if (!items.some(needs)) return items.map(() => null);
  const fleet = await FleetCapacity.read(agents);
  return items.map((i) =>
    needs(i)
      ? fleet.reason({ tenant_key: i.tenant_key, engine_kind: i.engine_kind, requirements: i.worker_params!.requirements as Record<string, unknown> })
      : null,
  );
}

/** How many waiting items one sweep looks at. */
const SWEEP_BATCH = 500;

/** The dead-letter policy's sweep; a no-op while --unplaceable-grace is 0. */
export function unplaceableTask(d: {
  config: Pick<Config, "unplaceableGrace">;
  agents: AgentStore;
  stats: WorkItemStatsStore;
  store: WorkItemStore;
  log: Logger;
  onFailed: (rows: readonly { id: string; engine_kind: string }[]) => void;
}): MaintenanceTask {
  return {
    name: "unplaceable",
    run: async (now) => {
      if (d.config.unplaceableGrace <= 0) return;
      const waiting = await d.stats.waitingNeeds(now - d.config.unplaceableGrace, SWEEP_BATCH);
      if (waiting.length === 0) return;
      const fleet = await FleetCapacity.read(d.agents);
      const doomed = waiting.flatMap((w) => {
        const reason = fleet.reason(w);
        return reason === null ? [] : [{ id: w.id, reason }];
      });
      if (doomed.length === 0) return;
      const rows = await d.store.failUnplaceable(doomed, now, "unplaceable-sweep");
      if (rows.length === 0) return;
      d.log.warn({ items: rows.length, graceMs: d.config.unplaceableGrace }, "items no agent could run became dead letters");
      d.onFailed(rows);
    },
  };
}
