/**
 * Prometheus exposition shared by the daemon's /metrics and the agent SDK's: prom-client's process
 * metrics, rendering a registry beside them in either format, and reading which format a scraper
 * asks for.
 *
 * What must stay true:
 * - prom-client's default process metrics are registered once per process, on a registry of their
 *   own that every endpoint serves beside its own metrics: some of those collectors (the GC
 *   observer, the event-loop delay monitor) hold process-wide resources that are never released,
 *   so registering them per daemon or per agent would leak one set for every one ever created, and
 *   they describe the process, which those share.
 * - One render at a time, process-wide. prom-client renders OpenMetrics by renaming every counter
 *   in place (it strips `_total` from the metric object's name); a Prometheus-text render that ran
 *   meanwhile would print the stripped names. So renders are serialised and each OpenMetrics
 *   render puts the names back before the next begins.
 */
import { collectDefaultMetrics, Registry, type OpenMetricsContentType } from "prom-client";

export const PROMETHEUS_CONTENT_TYPE = Registry.PROMETHEUS_CONTENT_TYPE;
export const OPENMETRICS_CONTENT_TYPE = Registry.OPENMETRICS_CONTENT_TYPE;

let processRegistry: Registry | undefined;

/** The default process metrics, registered on first use. */
export function processMetrics(): Registry {
  if (!processRegistry) {
    processRegistry = new Registry();
    collectDefaultMetrics({ register: processRegistry });
  }
  return processRegistry;
}

let rendering: Promise<unknown> = Promise.resolve();

/** The exposition of `registry` and the process metrics, in the format asked for; one render at a time. */
export function render(registry: Registry, openMetrics: boolean): Promise<string> {
  const next = rendering.then(async () => {
    const merged = Registry.merge([registry, processMetrics()]);
    if (!openMetrics) return merged.metrics();
    const names = merged.getMetricsAsArray().map((m) => [m, m.name] as const);
    (merged as unknown as Registry<OpenMetricsContentType>).setContentType(Registry.OPENMETRICS_CONTENT_TYPE);
    try {
      return await merged.metrics();
    } finally {
      for (const [m, name] of names) m.name = name;
    }
  });
  rendering = next.catch(() => undefined);
  return next;
}

/**
 * True when the Accept header prefers OpenMetrics to the Prometheus text format (as Prometheus
 * asks: `application/openmetrics-text;version=1.0.0,…,text/plain;version=0.0.4;q=0.5,*\/*;q=0.1`).
 */
export function wantsOpenMetrics(accept: string | undefined): boolean {
  if (!accept) return false;
  let om = 0;
  let text = 0;
  for (const part of accept.split(",")) {
    const [type = "", ...params] = part.split(";").map((s) => s.trim().toLowerCase());
    const qParam = params.find((p) => p.startsWith("q="));
    const q = qParam ? Number(qParam.slice(2)) : 1;
    if (!Number.isFinite(q)) continue;
    if (type === "application/openmetrics-text") om = Math.max(om, q);
    else if (type === "text/plain") text = Math.max(text, q);
  }
  return om > 0 && om >= text;
}
