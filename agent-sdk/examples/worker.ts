/**
 * An example worker binary: copy it and put your work in the handlers.
 *
 *   npx tsx agent-sdk/examples/worker.ts --address 127.0.0.1:7400 --token "$AIFLOW_AGENT_TOKEN" \
 *     --name worker-1 --tenants acme,globex --slots 4
 *
 * Flags and their environment variables: USAGE below (`--help` prints it).
 *
 * SIGTERM or SIGINT drains: nothing new is claimed, running items finish within the grace time,
 * then the agent deregisters and the process exits 0. A second signal stops at once. Exit code 1
 * means the daemon refused the agent (a wrong token, say), 2 a bad flag.
 */
import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { parseArgs } from "node:util";
import { pino } from "pino";
import { createAgent, NonRetryableError, type Handler } from "@aiflow/agent-sdk";

const VERSION = "example-1.0.0";

const USAGE = `example worker — runs aiflowd work items with the agent SDK

Usage: worker [flags]

Every flag has an environment variable; flags win:
  --address ADDR       AIFLOW_ADDRESS        daemon host:port (or https://host:port); repeat the flag or separate by commas to fail over
  --tls-ca FILE        AIFLOW_TLS_CA         PEM CA the daemon's certificate chains to: speak TLS (bare addresses become https://)
  --tls-cert FILE      AIFLOW_TLS_CERT       PEM client certificate, for mutual TLS (a spiffe://…/agent/NAME URI can stand in for --token)
  --tls-key FILE       AIFLOW_TLS_KEY        its PEM key
  --token TOKEN        AIFLOW_AGENT_TOKEN    bearer token with the agent role
  --name NAME          AIFLOW_AGENT_NAME     the agent's stable name (default: this host's name)
  --tenants A,B        AIFLOW_TENANTS        tenant keys to take work from (default: default)
  --engine-kind KIND   AIFLOW_ENGINE_KIND    engine kind these handlers run (default: test)
  --slots N            AIFLOW_SLOTS          items run at once (default: 4)
  --prefetch N         AIFLOW_PREFETCH       most items claimed ahead of free slots, for quick handlers; 0 = off (default: 3 × slots, at most 256 − slots)
  --grace MS           AIFLOW_GRACE_MS       drain time on SIGTERM/SIGINT before in-flight work is given back (default: 30000)
  --log-level LEVEL    AIFLOW_LOG_LEVEL      pino level (default: info)
  --help               this text
  --version            the version

Exit codes: 0 drained and stopped, 1 the daemon refused the agent, 2 a bad flag.
`;

/** `{ "text": "..." }` → the text, upper-cased. */
const shout: Handler<{ text?: unknown }> = async (item) => {
  if (typeof item.payload?.text !== "string") throw new NonRetryableError("payload.text must be a string");
  return { text: item.payload.text.toUpperCase() };
};

/** `{ "ms": 500 }` → waits that long; gives up as soon as the signal says so (lease lost, cancelled, drain deadline). */
const wait: Handler<{ ms?: number }> = async (item, ctx) => {
  const ms = item.payload?.ms ?? 1_000;
  ctx.log.info({ ms }, "waiting");
  await sleep(ms, undefined, { signal: ctx.signal });
  return { waitedMs: ms };
};

/** Anything else: echoes the payload back. */
const echo: Handler = async (item, ctx) => ({ echoed: item.payload, by: ctx.agent, attempt: item.attempt });

function config() {
  const { values } = parseArgs({
    options: {
      address: { type: "string", multiple: true },
      token: { type: "string" },
      "tls-ca": { type: "string" },
      "tls-cert": { type: "string" },
      "tls-key": { type: "string" },
      name: { type: "string" },
      tenants: { type: "string" },
      "engine-kind": { type: "string" },
      slots: { type: "string" },
      prefetch: { type: "string" },
      grace: { type: "string" },
      "log-level": { type: "string" },
      help: { type: "boolean", short: "h" },
      version: { type: "boolean" },
    },
  });
  const env = process.env;
  const list = (s: string | undefined) =>
    (s ?? "")
      .split(",")
      .map((x) => x.trim())
      .filter(Boolean);
  const addresses = list((values.address ?? []).join(",") || env.AIFLOW_ADDRESS || "127.0.0.1:7400");
  const number = (flag: string, raw: string | undefined, dflt: number) => {
    const n = raw === undefined ? dflt : Number(raw);
    if (!Number.isInteger(n) || n < 0) throw new Error(`--${flag} must be a whole number, got '${raw}'`);
    return n;
  };
  // Unset means the SDK's default, which depends on the slots.
  const prefetch = values.prefetch ?? env.AIFLOW_PREFETCH;
  // File paths: the SDK reads them, and reads them again when a rotated certificate changes them.
  const ca = values["tls-ca"] ?? env.AIFLOW_TLS_CA;
  const cert = values["tls-cert"] ?? env.AIFLOW_TLS_CERT;
  const key = values["tls-key"] ?? env.AIFLOW_TLS_KEY;
  return {
    help: values.help === true,
    version: values.version === true,
    addresses,
    token: values.token ?? env.AIFLOW_AGENT_TOKEN,
    tls: ca || cert || key ? { ca, cert, key } : undefined,
    name: values.name ?? env.AIFLOW_AGENT_NAME ?? hostname(),
    tenants: list(values.tenants ?? env.AIFLOW_TENANTS ?? "default"),
    engineKind: values["engine-kind"] ?? env.AIFLOW_ENGINE_KIND ?? "test",
    slots: number("slots", values.slots ?? env.AIFLOW_SLOTS, 4),
    prefetch: prefetch === undefined ? undefined : number("prefetch", prefetch, 0),
    graceMs: number("grace", values.grace ?? env.AIFLOW_GRACE_MS, 30_000),
    logLevel: values["log-level"] ?? env.AIFLOW_LOG_LEVEL ?? "info",
  };
}

async function main(): Promise<number> {
  let c: ReturnType<typeof config>;
  let agent: ReturnType<typeof createAgent>;
  try {
    c = config();
    if (c.help || c.version) {
      process.stdout.write(c.help ? USAGE : `${VERSION}\n`);
      return 0;
    }
    agent = createAgent({
      addresses: c.addresses,
      token: c.token,
      tls: c.tls,
      name: c.name,
      tenants: c.tenants,
      slots: c.slots,
      prefetch: c.prefetch,
      handlers: { [c.engineKind]: { shout, wait, "*": echo } },
      gracefulShutdownMs: c.graceMs,
      handleSignals: true,
      agentVersion: VERSION,
      logger: pino({ name: "example-worker", level: c.logLevel }),
    });
  } catch (err) {
    process.stderr.write(`worker: ${(err as Error).message}\n`);
    return 2;
  }
  try {
    // Resolves once the agent has drained and deregistered (after SIGTERM/SIGINT).
    await agent.run();
    return 0;
  } catch {
    // The agent logged why (agent.error); the daemon refused it for good.
    return 1;
  }
}

process.exitCode = await main();
