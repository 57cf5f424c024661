/**
 * Child process: one agent built with the SDK, running a no-op handler (a DAG split node's, whose
 * payload is {"split": N}, returns the list 0..N-1 as `items`). Items whose payload carries
 * sentAt (and measure:true) record the dispatch latency: from the producer issuing Enqueue to this
 * handler starting. Prints {"ready":true}; on SIGTERM stops the agent and prints its figures, with
 * its garbage-collection pauses from the first measured item on (all since the last reset when none
 * was measured): on two shared cores, one process's pause stalls the others too.
 */
import { PerformanceObserver, performance } from "node:perf_hooks";
import type { Interceptor } from "@connectrpc/connect";
import { pino } from "pino";
import { createAgent } from "../agent-sdk/src/index.js";
import { nowMs } from "./clock.js";
import { exitWith } from "./child-exit.js";

// `tenants`: a comma list (the tenants section's agents serve ten, and claim by fair share).
const [address, token, name, slotsRaw, tenants, kind, prefetchRaw, transport, path] = process.argv.slice(2);
const latencies: number[] = [];
let handled = 0;
/** Each GC pause: when it started (wall ms) and how long it took (ms). */
const gcPauses: [number, number][] = [];
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) gcPauses.push([performance.timeOrigin + e.startTime, e.duration]);
}).observe({ entryTypes: ["gc"] });
let firstMeasuredAt: number | undefined;
/** Per-RPC call counts, total milliseconds and items, so a slow drain shows where its time went. */
const rpcs: Record<string, { calls: number; ms: number; items: number }> = {};
/** Counts a stream's messages and the items or reports they carry under `key` (pushes: items; sent: completions). */
async function* counted<T>(messages: AsyncIterable<T>, key: string, items: (m: T) => number): AsyncIterable<T> {
  for await (const m of messages) {
    const r = (rpcs[key] ??= { calls: 0, ms: 0, items: 0 });
    r.calls++;
    r.items += items(m);
    yield m;
  }
}
type StreamMessage = { items?: unknown[]; completions?: unknown[] };
const timing: Interceptor = (next) => async (req) => {
  const started = nowMs();
  if (req.stream && req.method.localName === "connect") {
    const res = await next({ ...req, message: counted(req.message, "streamSent", (m) => ((m as StreamMessage).completions ?? []).length) });
    return res.stream ? { ...res, message: counted(res.message, "streamPushed", (m) => ((m as StreamMessage).items ?? []).length) } : res;
  }
  const res = await next(req);
  const r = (rpcs[req.method.localName] ??= { calls: 0, ms: 0, items: 0 });
  r.calls++;
  r.ms += nowMs() - started;
  if (!res.stream)
    r.items += ((res.message as { items?: unknown[]; outcomes?: unknown[] }).items ?? (res.message as { outcomes?: unknown[] }).outcomes ?? []).length;
  return res;
};
// The mixed section's simulated GPUs (GB each): registered as capacity and reported free by every heartbeat.
const gpus = (process.env.BENCH_GPUS ?? "").split(",").filter(Boolean).map(Number);
const simulated =
  gpus.length === 0
    ? {}
    : {
        capacity: { gpus: gpus.map((gb, index) => ({ index, model: "bench", memoryMb: gb * 1024 })) },
        heartbeatMetrics: { gpus: gpus.map((gb, index) => ({ index, model: "bench", memoryUsedMb: 0, memoryTotalMb: gb * 1024 })) },
      };
const agent = createAgent({
  ...simulated,
  address: address!,
  token,
  name: name!,
  tenants: tenants!.split(","),
  engineKinds: [kind!],
  slots: Number(slotsRaw),
  prefetch: prefetchRaw ? Number(prefetchRaw) : undefined,
  logger: pino({ level: "warn" }),
  interceptors: [timing],
  // "fast" or "slow" set the SDK's fastTransport; anything else leaves the SDK's default.
  fastTransport: transport === "fast" ? true : transport === "slow" ? false : undefined,
  stream: path !== "unary",
  // Over TLS (npm run bench -- --tls): the address is https:// and this is the CA to trust.
  tls: process.env.BENCH_TLS_CA ? { ca: process.env.BENCH_TLS_CA } : undefined,
  handlers: {
    [kind!]: async (item) => {
      const started = nowMs();
      handled++;
      const p = item.payload as { sentAt?: number; measure?: boolean; split?: number } | null;
      if (p?.sentAt !== undefined && p.measure) {
        latencies.push(started - p.sentAt);
        firstMeasuredAt ??= started;
      }
      // The DAG section's split node: its result is the list its fan-out node runs over.
      if (typeof p?.split === "number") return { items: Array.from({ length: p.split }, (_, i) => i) };
      return null;
    },
  },
});
await agent.start();
// "reset" (over IPC) starts the figures afresh, so a warm-up's calls are not counted with the drain.
process.on("message", (m) => {
  if (m !== "reset") return;
  handled = 0;
  latencies.length = 0;
  gcPauses.length = 0;
  firstMeasuredAt = undefined;
  for (const k of Object.keys(rpcs)) delete rpcs[k];
  console.log(JSON.stringify({ reset: true }));
});
process.once("SIGTERM", async () => {
  await agent.stop();
  const gc = gcPauses.filter(([at]) => at >= (firstMeasuredAt ?? 0)).map(([, ms]) => ms);
  exitWith({ handled, latencies, rpcs, gc });
});
console.log(JSON.stringify({ ready: true }));
