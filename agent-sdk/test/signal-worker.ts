/**
 * A worker process for signals.test.ts: an agent with `handleSignals` whose one handler says it
 * started and then never ends, ignoring its abort signal, so that a drain cannot finish by itself. Its log lines (pino,
 * JSON) go to stdout, where the test reads them.
 *
 *   node --import tsx agent-sdk/test/signal-worker.ts ADDRESS
 */
import { pino } from "pino";
import { createAgent } from "../src/index.js";

const [address] = process.argv.slice(2);
const agent = createAgent({
  address: address!,
  name: `signal-worker-${process.pid}`,
  tenants: ["t1"],
  engineKinds: ["k"],
  capacity: false,
  mounts: ["/"],
  handleSignals: true,
  logger: pino({ level: "info" }, pino.destination({ dest: 1, sync: true })),
  handlers: {
    k: (_item, ctx) => {
      ctx.log.info("handler started");
      return new Promise(() => {});
    },
  },
});
await agent.run();
