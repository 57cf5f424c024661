/**
 * The gauges only the database knows: the queue's depth and age, and the fleet's agents with what
 * their heartbeats last said. Every daemon of a deployment reports the same values (they share the
 * tables), which is why the dashboard takes `max` over instances.
 *
 * What must stay true: a scrape never costs a query of its own. The first scrape after the
 * snapshot is older than --metrics-refresh (by the daemon's clock) reads a new one, with one
 * statement per table, and every scrape meanwhile shares it, as do the gauges of one scrape and
 * scrapes that arrive while it is read. When the database does not answer (within
 * SNAPSHOT_TIMEOUT_MS, or at all), the scrape answers without these series rather than with stale
 * values or late: the rest of /metrics still describes the daemon, and /readyz says why.
 *
 * Per-agent series are bounded by --metrics-max-agents (the first agents by name that are active
 * or draining); aiflow_agents_unlisted counts those left out, which still count in aiflow_agents.
 * The tenant and engine_kind labels are bounded as the daemon's counters' are (./label-values.ts,
 * the same bound): the values past it are summed under "other" (their oldest age is the oldest of
 * them), and a snapshot meets the values it has not seen yet busiest first, so that those keep
 * their own series.
 */
import { Gauge, type Registry } from "prom-client";
import type { Clock } from "../clock.js";
import { OutageLog } from "../db/outage-log.js";
import type { Logger } from "../log.js";
import { LATE, within } from "../util/within.js";
import type { AgentGaugeRow, AgentStatus } from "../store/agents.js";
import type { QueueGaugeRow } from "../store/work-item-stats.js";
import { metricLabels, type MetricLabels } from "./label-values.js";

/** How long a scrape waits for a snapshot before answering without it. */
export const SNAPSHOT_TIMEOUT_MS = 5_000;

export interface GaugeSources {
  queue(nowMs: number): Promise<readonly QueueGaugeRow[]>;
  fleet(limit: number): Promise<{ byStatus: readonly { status: AgentStatus; n: number }[]; agents: readonly AgentGaugeRow[] }>;
}

/** A queue row with its tenant and engine kind as the labels show them. */
type LabelledRow = QueueGaugeRow & { tenant: string; kind: string };

interface Snapshot {
  atMs: number;
  queue: readonly LabelledRow[];
  byStatus: ReadonlyMap<AgentStatus, number>;
  agents: readonly AgentGaugeRow[];
}

/** The parts of aiflow_agent.metrics (written by registration.ts from a heartbeat) that become gauges. */
interface HeartbeatMetrics {
  cpu?: { utilization?: number };
  memory?: { used?: number; total?: number };
  gpus?: { index?: number; utilization?: number; memory?: { used?: number; total?: number } }[];
}

const num = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);

/** The queue's rows with their tenant and engine kind as the labels show them, the busiest rows meeting the bound first. */
function labelled(rows: readonly QueueGaugeRow[], labels: MetricLabels): LabelledRow[] {
  return [...rows].sort((a, b) => b.n - a.n).map((r) => ({ ...r, tenant: labels.tenant.of(r.tenant_key), kind: labels.engineKind.of(r.engine_kind) }));
}

export class FleetGauges {
  #snapshot: Snapshot | undefined;
  #reading: Promise<Snapshot | undefined> | undefined;
  /** How the database's absence is logged: a line a second at most, however often scrapes come. */
  readonly #outage: OutageLog;
  readonly #labels: MetricLabels;

  constructor(
    registry: Registry,
    private readonly sources: GaugeSources,
    private readonly opts: { clock: Clock; refreshMs: number; maxAgents: number; log: Logger; labels?: MetricLabels },
  ) {
    this.#labels = opts.labels ?? metricLabels();
    this.#outage = new OutageLog(opts.log, "database unavailable: /metrics answers without the queue and fleet gauges until it is back");
    const current = () => this.current();
    const gauge = (name: string, help: string, labelNames: readonly string[], fill: (g: Gauge, s: Snapshot) => void) =>
      new Gauge({
        name,
        help,
        labelNames,
        registers: [registry],
        async collect() {
          this.reset();
          const s = await current();
          if (s) fill(this, s);
        },
      });

    gauge(
      "aiflow_queue_items",
      "Work items by tenant, engine kind and status (finished ones too, until they are deleted)",
      ["tenant", "engine_kind", "status"],
      (g, s) => {
        const sums = new Map<string, { tenant: string; engine_kind: string; status: string; n: number }>();
        for (const r of s.queue) {
          const key = `${r.tenant}\0${r.kind}\0${r.status}`;
          const sum = sums.get(key) ?? { tenant: r.tenant, engine_kind: r.kind, status: r.status, n: 0 };
          sums.set(key, { ...sum, n: sum.n + r.n });
        }
        for (const { n, ...l } of sums.values()) g.set(l, n);
      },
    );
    gauge(
      "aiflow_queue_oldest_due_pending_age_seconds",
      "Seconds the pending item due longest ago has been due, per tenant and engine kind",
      ["tenant", "engine_kind"],
      (g, s) => {
        const oldest = new Map<string, { tenant: string; engine_kind: string; ns: bigint }>();
        for (const r of s.queue) {
          if (r.oldest_due_ns === null) continue;
          const key = `${r.tenant}\0${r.kind}`;
          const was = oldest.get(key);
          if (!was || r.oldest_due_ns < was.ns) oldest.set(key, { tenant: r.tenant, engine_kind: r.kind, ns: r.oldest_due_ns });
        }
        for (const { ns, ...l } of oldest.values()) g.set(l, Math.max(0, s.atMs - Number(ns / 1_000_000n)) / 1000);
      },
    );
    gauge("aiflow_agents", "Registered agents by status (removed ones left out)", ["status"], (g, s) => {
      for (const status of ["active", "draining", "inactive"] as const) g.set({ status }, s.byStatus.get(status) ?? 0);
    });
    gauge("aiflow_agents_unlisted", "Active and draining agents past --metrics-max-agents, which have no per-agent series", [], (g, s) => {
      g.set((s.byStatus.get("active") ?? 0) + (s.byStatus.get("draining") ?? 0) - s.agents.length);
    });
    const perAgent = (name: string, help: string, value: (m: HeartbeatMetrics, a: AgentGaugeRow) => number | undefined) =>
      gauge(name, help, ["agent"], (g, s) => {
        for (const a of s.agents) {
          const v = value((a.metrics ?? {}) as HeartbeatMetrics, a);
          if (num(v)) g.set({ agent: a.name }, v);
        }
      });
    perAgent("aiflow_agent_cpu_utilization_ratio", "CPU in use on the agent's host, 0-1 of all cores (its last heartbeat)", (m) =>
      num(m.cpu?.utilization) ? m.cpu.utilization / 100 : undefined,
    );
    perAgent("aiflow_agent_memory_used_bytes", "Memory in use on the agent's host (its last heartbeat)", (m) => m.memory?.used);
    perAgent("aiflow_agent_memory_total_bytes", "Memory of the agent's host (its last heartbeat)", (m) => m.memory?.total);
    perAgent("aiflow_agent_in_flight_items", "Items dispatched to the agent now", (_m, a) => a.in_flight);
    perAgent("aiflow_agent_drain_remaining_items", "Items a draining agent still holds (the drain is done at 0)", (_m, a) =>
      a.status === "draining" ? a.in_flight : undefined,
    );
    const perGpu = (name: string, help: string, value: (gpu: NonNullable<HeartbeatMetrics["gpus"]>[number]) => number | undefined) =>
      gauge(name, help, ["agent", "gpu"], (g, s) => {
        for (const a of s.agents) {
          const gpus = (a.metrics as HeartbeatMetrics | null)?.gpus;
          if (!Array.isArray(gpus)) continue;
          gpus.forEach((gpu, i) => {
            const v = value(gpu);
            if (num(v)) g.set({ agent: a.name, gpu: String(num(gpu.index) ? gpu.index : i) }, v);
          });
        }
      });
    perGpu("aiflow_agent_gpu_utilization_ratio", "Utilisation of each GPU of the agent's host, 0-1 (its last heartbeat)", (gpu) =>
      num(gpu.utilization) ? gpu.utilization / 100 : undefined,
    );
    perGpu("aiflow_agent_gpu_memory_used_bytes", "Memory in use on each GPU (its last heartbeat)", (gpu) => gpu.memory?.used);
    perGpu("aiflow_agent_gpu_memory_total_bytes", "Memory of each GPU (its last heartbeat)", (gpu) => gpu.memory?.total);
  }

  /** The snapshot, read anew when older than --metrics-refresh; undefined when the database did not answer in time. */
  current(): Promise<Snapshot | undefined> {
    const now = this.opts.clock.nowMs();
    if (this.#snapshot && now - this.#snapshot.atMs < this.opts.refreshMs) return Promise.resolve(this.#snapshot);
    const reading = (this.#reading ??= this.#read(now).finally(() => (this.#reading = undefined)));
    return within(reading, SNAPSHOT_TIMEOUT_MS).then((s) => (s === LATE ? undefined : s));
  }

  async #read(now: number): Promise<Snapshot | undefined> {
    try {
      const [queue, fleet] = await Promise.all([this.sources.queue(now), this.sources.fleet(this.opts.maxAgents)]);
      this.#snapshot = { atMs: now, queue: labelled(queue, this.#labels), byStatus: new Map(fleet.byStatus.map((r) => [r.status, r.n])), agents: fleet.agents };
      return this.#snapshot;
    } catch (err) {
      if (!this.#outage.note(err)) this.opts.log.error({ err }, "could not read the queue and fleet gauges; /metrics answers without them");
      this.#snapshot = undefined;
      return undefined;
    }
  }
}
