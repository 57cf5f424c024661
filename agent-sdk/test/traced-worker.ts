/**
 * A worker process whose agent traces (test/tracing.test.ts): the SDK, by its sources, with
 * OTEL_* in the environment, so that start() loads and registers the OpenTelemetry SDK itself.
 * Handlers: `traced` makes a span of its own inside the handler (it must nest under the handler's
 * span) and completes; `flaky` fails retryably on its first attempt and completes on the next.
 * Says `{"ready":true}` once running; SIGTERM drains it, and it exits once stopped.
 *
 *   node --import tsx agent-sdk/test/traced-worker.ts ADDRESS TOKEN NAME TENANT
 */
import { trace } from "@opentelemetry/api";
import { pino } from "pino";
import { createAgent, RetryableError } from "../src/index.js";

const [address, token, name, tenant] = process.argv.slice(2);
const agent = createAgent({
  address: address!,
  token,
  name: name!,
  tenants: [tenant!],
  logger: pino({ level: process.env.TEST_LOG_LEVEL ?? "error" }, pino.destination(2)),
  claimWaitMs: 2_000,
  handleSignals: true,
  handlers: {
    traced: async () => {
      trace.getTracer("traced-worker").startSpan("inside the handler").end();
      return { ok: true };
    },
    flaky: async (item) => {
      if (item.attempt === 1) throw new RetryableError("the first attempt fails", { retryDelayMs: 1 });
      return { attempt: item.attempt };
    },
  },
});
await agent.start();
console.log(JSON.stringify({ ready: true }));
await agent.run();
