/**
 * Child process: one agent built with the SDK, running a no-op handler. Items whose payload carries
 * sentAt (and measure:true) record the dispatch latency: from the producer issuing Enqueue to this
 * handler starting. Prints {"ready":true}; on SIGTERM stops the agent and prints its figures.
 */
import type { Interceptor } from "@connectrpc/connect";
import { pino } from "pino";
import { createAgent } from "../agent-sdk/src/index.js";
import { nowMs } from "./clock.js";

const [address, token, name, slotsRaw, tenant, kind] = process.argv.slice(2);
const latencies: number[] = [];
let handled = 0;
/** Per-RPC call counts, total milliseconds and items, so a slow drain shows where its time went. */
const rpcs: Record<string, { calls: number; ms: number; items: number }> = {};
const timing: Interceptor = (next) => async (req) => {
  const started = nowMs();
  const res = await next(req);
  const r = (rpcs[req.method.localName] ??= { calls: 0, ms: 0, items: 0 });
  r.calls++;
  r.ms += nowMs() - started;
  if (!res.stream) r.items += ((res.message as { items?: unknown[]; outcomes?: unknown[] }).items ?? (res.message as { outcomes?: unknown[] }).outcomes ?? []).length;
  return res;
};
const agent = createAgent({
  address: address!,
  token,
  name: name!,
  tenants: [tenant!],
  engineKinds: [kind!],
  slots: Number(slotsRaw),
  logger: pino({ level: "warn" }),
  interceptors: [timing],
  handlers: {
    [kind!]: async (item) => {
      const started = nowMs();
      handled++;
      const p = item.payload as { sentAt?: number; measure?: boolean } | null;
      if (p?.sentAt !== undefined && p.measure) latencies.push(started - p.sentAt);
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
  for (const k of Object.keys(rpcs)) delete rpcs[k];
  console.log(JSON.stringify({ reset: true }));
});
process.once("SIGTERM", async () => {
  await agent.stop();
  console.log(JSON.stringify({ handled, latencies, rpcs }));
  process.exit(0);
});
console.log(JSON.stringify({ ready: true }));
