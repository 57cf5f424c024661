/**
 * Child process: a graphile-worker pool (bench/graphile.ts), in a process of its own as the raw
 * baseline's workers are, so that what it costs is this process's CPU and the parent's watching
 * stays out of it. argv: url schema concurrency mode [items warmup].
 *
 * steady: starts at once and prints {"ready":true}; on SIGTERM prints {handled, latencies} (enqueue
 * call issued → handler started, for jobs whose payload does not say measure:false), as the raw
 * baseline's child does.
 *
 * drain: first runs the `warmup` jobs the parent added before starting it (uncounted, as our
 * drain's agents take a warm-up first: these are long-running processes, not freshly compiled
 * ones) and stops that pool; prints {"ready":true}. On the IPC message "go" it starts a fresh pool
 * on the backlog added since and, once `items` jobs have run and its jobs table is empty (every
 * completion committed), prints {drained, start_ms, end_ms}: from the pool started (its first
 * fetch of jobs is issued as it starts) to the last completion seen committed (a probe every 2 ms,
 * only once the last handler has run, so the probing costs the drain nothing). Then waits for SIGTERM.
 */
import pg from "pg";
import type { Runner } from "graphile-worker";
import { nowMs } from "./clock.js";
import { exitWith } from "./child-exit.js";
import { graphileEmpty, startGraphileWorkers } from "./graphile.js";

const [url, schema, concurrencyRaw, mode, itemsRaw, warmupRaw] = process.argv.slice(2) as [string, string, string, string, string?, string?];
const concurrency = Number(concurrencyRaw);
const latencies: number[] = [];
let handled = 0;
let target = 0;
let firstJobAt: number | undefined;
let reached: () => void = () => {};
let runner: Runner | undefined;

const onItem = (payload: unknown) => {
  handled++;
  firstJobAt ??= nowMs();
  const p = payload as { sentAt?: number; measure?: boolean } | null;
  if (mode === "steady" && p?.sentAt !== undefined && p.measure !== false) latencies.push(nowMs() - p.sentAt);
  if (handled === target) reached();
};

/** Resolves once `n` more jobs have started (n > 0). */
function untilHandled(n: number): Promise<void> {
  handled = 0;
  target = n;
  return new Promise((resolve) => (reached = resolve));
}

process.once("SIGTERM", async () => {
  await runner?.stop().catch(() => {});
  exitWith({ handled, latencies });
});

if (mode === "steady") {
  runner = await startGraphileWorkers(url, schema, concurrency, onItem);
  console.log(JSON.stringify({ ready: true }));
} else {
  const items = Number(itemsRaw);
  const warmup = Number(warmupRaw ?? 0);
  if (warmup > 0) {
    const warmed = untilHandled(warmup);
    runner = await startGraphileWorkers(url, schema, concurrency, onItem);
    await warmed;
    // A graceful stop commits the batched completions before it resolves.
    await runner.stop();
    runner = undefined;
  }
  // The probe's connection is opened now, not inside the measured window.
  const probe = new pg.Client({ connectionString: url });
  await probe.connect();
  process.once("message", async (msg) => {
    if (msg !== "go") return;
    const allRun = untilHandled(items);
    firstJobAt = undefined;
    const startedAt = nowMs();
    runner = await startGraphileWorkers(url, schema, concurrency, onItem);
    // run() resolves once its pool is up and fetching; should a job start first, it starts the span.
    const start = Math.min(firstJobAt ?? Number.POSITIVE_INFINITY, nowMs());
    await allRun;
    while (!(await graphileEmpty(probe, schema))) await new Promise((r) => setTimeout(r, 2));
    const end = nowMs();
    await probe.end();
    console.log(JSON.stringify({ drained: handled, start_ms: start, end_ms: end, boot_ms: start - startedAt }));
  });
  console.log(JSON.stringify({ ready: true }));
}
