/**
 * Child process: one agent built with the SDK, running a no-op handler. Items whose payload carries
 * sentAt (and measure:true) record the dispatch latency: from the producer issuing Enqueue to this
 * handler starting. Prints {"ready":true}; on SIGTERM stops the agent and prints its figures.
 */
import { pino } from "pino";
import { createAgent } from "../agent-sdk/src/index.js";
import { nowMs } from "./clock.js";

const [address, token, name, slotsRaw, tenant, kind] = process.argv.slice(2);
const latencies: number[] = [];
let handled = 0;
const agent = createAgent({
  address: address!,
  token,
  name: name!,
  tenants: [tenant!],
  engineKinds: [kind!],
  slots: Number(slotsRaw),
  logger: pino({ level: "warn" }),
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
console.log(JSON.stringify({ ready: true }));
process.once("SIGTERM", async () => {
  await agent.stop();
  console.log(JSON.stringify({ handled, latencies }));
  process.exit(0);
});
