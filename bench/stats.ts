/** The benchmark's arithmetic: percentiles, summaries and ratios. Pure, unit-tested. */

/** Nearest-rank percentile of an ascending array (p in 0..100). */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  if (p <= 0) return sorted[0]!;
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length, rank) - 1]!;
}

export interface Summary {
  count: number;
  mean: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
}

export function summarize(values: readonly number[]): Summary {
  const sorted = [...values].sort((a, b) => a - b);
  const mean = sorted.length ? sorted.reduce((s, v) => s + v, 0) / sorted.length : Number.NaN;
  return {
    count: sorted.length,
    mean,
    p50: percentile(sorted, 50),
    p90: percentile(sorted, 90),
    p99: percentile(sorted, 99),
    max: sorted.at(-1) ?? Number.NaN,
  };
}

/** ours ÷ baseline, rounded; NaN when either side is missing or the baseline is zero. */
export function ratio(ours: number, baseline: number): number {
  if (!Number.isFinite(ours) || !Number.isFinite(baseline) || baseline === 0) return Number.NaN;
  return Math.round((ours / baseline) * 1000) / 1000;
}

/** A steady-rate median past this is a backlog growing through the window, not a dispatch latency. */
export const BACKLOG_P50_MS = 1000;

/**
 * The steady section's ratios against one baseline, its figures named by `name` ("baseline": the raw
 * SQL queue; "graphile": graphile-worker). When the baseline did not keep up with the rate (on a
 * host with slow commits the raw producer's notifying inserts serialise, and its median reads
 * 10–20 s), there is no latency to compare with: the ratios are NaN and <name>_kept_up is 0.
 */
export function latencyRatio(ours: { p50: number; p99: number }, baseline: { p50: number; p99: number }, name = "baseline"): Record<string, number> {
  const keptUp = baseline.p50 <= BACKLOG_P50_MS;
  return {
    ours_p50_ms: ours.p50,
    [`${name}_p50_ms`]: baseline.p50,
    [`p50_ours_over_${name}`]: keptUp ? ratio(ours.p50, baseline.p50) : Number.NaN,
    [`p99_ours_over_${name}`]: keptUp ? ratio(ours.p99, baseline.p99) : Number.NaN,
    [`${name}_kept_up`]: keptUp ? 1 : 0,
  };
}

/** A drain's two headline figures: items per second, and the machine's CPU per item (µs, all processes). */
export interface DrainHeadline {
  itemsPerS: number;
  cpuUsPerItem: number;
}

/**
 * The drain's ratios: ours ÷ each baseline (keyed by name, as latencyRatio), in items per second
 * (above 1: ours drains faster) and in machine CPU per item (below 1: ours costs the machine less).
 */
export function drainRatio(ours: DrainHeadline, baselines: Readonly<Record<string, DrainHeadline>>): Record<string, number> {
  const out: Record<string, number> = { ours_items_per_s: ours.itemsPerS };
  for (const [name, b] of Object.entries(baselines)) {
    out[`${name}_items_per_s`] = b.itemsPerS;
    out[`ours_over_${name}`] = ratio(ours.itemsPerS, b.itemsPerS);
  }
  out.ours_cpu_us_per_item = ours.cpuUsPerItem;
  for (const [name, b] of Object.entries(baselines)) {
    out[`${name}_cpu_us_per_item`] = b.cpuUsPerItem;
    out[`cpu_ours_over_${name}`] = ratio(ours.cpuUsPerItem, b.cpuUsPerItem);
  }
  return out;
}

/** Items per second over a span in nanoseconds. */
export function perSecond(count: number, spanNs: bigint): number {
  if (spanNs <= 0n) return Number.NaN;
  return count / (Number(spanNs) / 1e9);
}

export const round = (v: number, digits = 2) => (Number.isFinite(v) ? Math.round(v * 10 ** digits) / 10 ** digits : v);

/**
 * Garbage-collection pauses of a group of processes: how many, their total and the longest (ms).
 * Nothing when the group reported none (an older child, or one that died): not zeros.
 */
export function gcFigures(group: string, pauses: readonly number[] | undefined): Record<string, number> {
  if (!pauses) return {};
  return {
    [`${group}_gc_pauses`]: pauses.length,
    [`${group}_gc_ms`]: round(
      pauses.reduce((s, v) => s + v, 0),
      1,
    ),
    [`${group}_gc_max_ms`]: round(pauses.length ? Math.max(...pauses) : 0, 1),
  };
}

/** The tenants section's shares over the stretch where every tenant had a backlog (`tenantShares`). */
export interface TenantShares {
  /** Dispatches in the stretch: from the first to the first tenant's last. */
  dispatches: number;
  /** The tenant whose last item ended the stretch. */
  firstOut: string;
  /** Each tenant's share of the stretch's dispatches, and its weight ÷ the sum of the weights. */
  shares: Record<string, { measured: number; expected: number }>;
  /** The largest |measured − expected| over the tenants. */
  maxAbsDiff: number;
}

/**
 * Tenants' shares of dispatches while all of them still had a backlog. `order` is every
 * dispatched item's tenant in dispatch order; a tenant's backlog is how often it appears there.
 * The stretch runs from the first dispatch to the one that took the first tenant's last item
 * (inclusive). `weights` names every tenant (a tenant absent from `order` had no backlog: left out).
 */
export function tenantShares(order: readonly string[], weights: Readonly<Record<string, number>>): TenantShares {
  const backlog: Record<string, number> = {};
  for (const t of order) backlog[t] = (backlog[t] ?? 0) + 1;
  const tenants = Object.keys(weights).filter((t) => (backlog[t] ?? 0) > 0);
  const seen: Record<string, number> = Object.fromEntries(tenants.map((t) => [t, 0]));
  let firstOut = "";
  for (const t of order) {
    if (!(t in seen)) continue;
    if (++seen[t]! === backlog[t]) {
      firstOut = t;
      break;
    }
  }
  const total = tenants.reduce((s, t) => s + weights[t]!, 0);
  const dispatches = tenants.reduce((s, t) => s + seen[t]!, 0);
  const shares: TenantShares["shares"] = {};
  let maxAbsDiff = 0;
  for (const t of tenants) {
    const measured = dispatches === 0 ? Number.NaN : seen[t]! / dispatches;
    const expected = weights[t]! / total;
    shares[t] = { measured, expected };
    maxAbsDiff = Math.max(maxAbsDiff, Math.abs(measured - expected));
  }
  return { dispatches, firstOut, shares, maxAbsDiff };
}
