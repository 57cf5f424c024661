/**
 * /metrics keeps a bounded number of series however many tenant keys and engine kinds callers
 * invent (issue 51, item 12: 20,000 engine kinds made 40,000 series). With
 * --metrics-max-label-values 3, the first three values of each label keep their series and the
 * rest are counted under "other", alike in the queue gauges and the dispatch histograms, and
 * nothing is lost from the totals.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { useTestDaemon } from "./support/kit.js";
import { scrapeMetrics, type Exposition } from "./support/metrics.js";
import { Producer, TestAgent } from "./support/queue.js";

/** The label value past the bound (src/observability/label-values.ts). */
const OTHER = "other";
const clock = new FakeClock(Date.UTC(2026, 11, 1));
const fx = useTestDaemon({
  label: "hlabels",
  clock,
  config: { httpListen: { host: "127.0.0.1", port: 0 }, metricsRefresh: 0, metricsMaxLabelValues: 3, sweepInterval: 3_600_000 },
});
let D: Daemon;
let p: Producer;
beforeAll(() => {
  D = fx.daemon;
  p = fx.closers.add(new Producer(D.address));
});

const scrape = () => scrapeMetrics(D.httpUrl!);
const values = (m: Exposition, series: string, label: string) => [...new Set(m.labelSets(series).map((l) => l[label]!))].sort();

describe("engine_kind and tenant on /metrics", () => {
  it("take at most --metrics-max-label-values values each, the busiest first in the gauges, the rest summed under 'other'", async () => {
    // Six kinds in tenant ta, k0 the busiest (6 items) down to k5 (1 item); then one item in each of tb..te.
    const kinds = ["k0", "k1", "k2", "k3", "k4", "k5"];
    for (const [i, kind] of kinds.entries())
      await p.enqueue(
        "ta",
        Array.from({ length: 6 - i }, () => ({ engineKind: kind })),
      );
    for (const t of ["tb", "tc", "td", "te"]) await p.enqueue(t, [{ engineKind: "k0" }]);

    const gauges = await scrape();
    expect(values(gauges, "aiflow_queue_items", "engine_kind")).toEqual(["k0", "k1", "k2", OTHER].sort());
    expect(gauges.series("aiflow_queue_items", { tenant: "ta", engine_kind: OTHER, status: "pending" })).toBe(3 + 2 + 1);
    expect(gauges.series("aiflow_queue_items", { status: "pending" })).toBe(21 + 4);
    expect(values(gauges, "aiflow_queue_items", "tenant")).toHaveLength(4);
    expect(values(gauges, "aiflow_queue_items", "tenant")).toContain(OTHER);
    expect(values(gauges, "aiflow_queue_oldest_due_pending_age_seconds", "engine_kind")).toEqual(["k0", "k1", "k2", OTHER].sort());

    // The dispatch histogram labels the same values the same way.
    const agent = fx.closers.add(await TestAgent.register(D.address, "hlabels-a", { tenants: ["ta"], engineKinds: kinds, slots: 64 }));
    const claimed = await agent.claim(21);
    expect(claimed).toHaveLength(21);
    const after = await scrape();
    expect(values(after, "aiflow_queue_dispatch_wait_seconds_count", "engine_kind")).toEqual(["k0", "k1", "k2", OTHER].sort());
    const waits = (kind: string) => after.series("aiflow_queue_dispatch_wait_seconds_count", { tenant: "ta", engine_kind: kind });
    expect(kinds.slice(0, 3).map(waits)).toEqual([6, 5, 4]);
    expect(waits(OTHER)).toBe(6);
  });
});
