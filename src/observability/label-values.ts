/**
 * Label values that callers choose — tenant keys and engine kinds, which any Enqueue, DAG node or
 * registration may name — bounded per label, so that /metrics keeps a bounded number of series
 * however many a caller invents (20,000 engine kinds made 40,000 series before).
 *
 * What must stay true:
 * - A value keeps the label it was first given for the daemon's life: a counter's or a histogram's
 *   series cannot move to another label value, so the first `max` values seen keep their own and
 *   every later one is counted under OTHER.
 * - Every metric with a tenant or engine_kind label maps its values through the same bound (one per
 *   label, per daemon), so a value is itself or OTHER alike in the counters, histograms and gauges.
 */

/** The label value every value past the bound is counted under. */
export const OTHER = "other";

/** The values of one label: the first `max` seen are shown as they are, the rest as OTHER. */
export class BoundedLabel {
  readonly #kept = new Set<string>();

  constructor(readonly max: number) {}

  /** The value as the label shows it. */
  of(value: string): string {
    if (this.#kept.has(value)) return value;
    if (this.#kept.size >= this.max) return OTHER;
    this.#kept.add(value);
    return value;
  }
}

/** The bounded labels of one daemon's metrics. */
export interface MetricLabels {
  tenant: BoundedLabel;
  engineKind: BoundedLabel;
}

/** --metrics-max-label-values' default. */
export const DEFAULT_MAX_LABEL_VALUES = 100;

export const metricLabels = (max = DEFAULT_MAX_LABEL_VALUES): MetricLabels => ({ tenant: new BoundedLabel(max), engineKind: new BoundedLabel(max) });
