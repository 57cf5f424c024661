/**
 * An example worker for DAG runs: it serves one engine kind (default `dag`) and runs a node by its
 * name. DagService hands it nodes as ordinary work items, task name = the node (`square[7]` for an
 * iteration of a fan-out node), payload = the node's rendered template, so nothing here is
 * DAG-specific beyond choosing the handler by name:
 *
 *   split   {"n": 100}                      -> {"items": [1, …, n]}
 *   square  {"x": 7}     (one iteration)    -> {"value": 49}
 *   sum     {"squares": [{"value": 1}, …]}  -> {"total": …, "count": …}
 *   flaky   {"total": …}                    -> fails the first time it runs for a run, then {"checked": total}
 *   report  {"text": "…"}                   -> {"text": "…"}
 *
 * `flaky` fails with NonRetryableError, so its item dead-letters at once and its run fails; a
 * ResumeRun runs it again, and that time it succeeds. Which runs it has failed for is kept as one
 * empty file per run id in --flaky-dir, so several worker processes sharing the directory fail it
 * exactly once per run between them (without the flag: in this process's memory).
 *
 * Each node run logs one info line, {"msg":"node ran","node":"square","task":"square[7]","run":…},
 * before its handler's work, so counting those lines counts the runs.
 *
 *   npx tsx agent-sdk/examples/dag-worker.ts --address 127.0.0.1:7400 --token "$AIFLOW_AGENT_TOKEN" \
 *     --name dag-worker-1 --tenants acme --flaky-dir /tmp/flaky
 *
 * Flags: USAGE below. SIGTERM or SIGINT drains and exits 0; exit code 1 means the daemon refused
 * the agent, 2 a bad flag.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { pino } from "pino";
import { createAgent, NonRetryableError, type Handler, type WorkItem } from "@aiflow/agent-sdk";

const VERSION = "dag-example-1.0.0";

const USAGE = `dag example worker — runs the nodes of the demo DAG (split, square, sum, flaky, report)

Usage: dag-worker [flags]

Every flag has an environment variable; flags win:
  --address ADDR       AIFLOW_ADDRESS        daemon host:port (or https://host:port); repeat or separate by commas to fail over
  --tls-ca FILE        AIFLOW_TLS_CA         PEM CA the daemon's certificate chains to: speak TLS
  --tls-cert FILE      AIFLOW_TLS_CERT       PEM client certificate, for mutual TLS
  --tls-key FILE       AIFLOW_TLS_KEY        its PEM key
  --token TOKEN        AIFLOW_AGENT_TOKEN    bearer token with the agent role
  --name NAME          AIFLOW_AGENT_NAME     the agent's stable name (default: dag-<host name>)
  --tenants A,B        AIFLOW_TENANTS        tenant keys to take work from (default: default)
  --engine-kind KIND   AIFLOW_ENGINE_KIND    the engine kind of the DAG's nodes (default: dag)
  --slots N            AIFLOW_SLOTS          nodes run at once (default: 8)
  --flaky-dir DIR      AIFLOW_FLAKY_DIR      where 'flaky' records the runs it has failed for (default: memory)
  --grace MS           AIFLOW_GRACE_MS       drain time on SIGTERM/SIGINT (default: 30000)
  --log-level LEVEL    AIFLOW_LOG_LEVEL      pino level (default: info; the per-node lines are info)
  --help               this text
  --version            the version
`;

type NodeHandler = (payload: Record<string, unknown>, item: WorkItem) => unknown;

const num = (v: unknown, what: string): number => {
  if (typeof v !== "number" || !Number.isFinite(v)) throw new NonRetryableError(`${what} must be a number, got ${JSON.stringify(v)}`);
  return v;
};

/** The runs `flaky` has failed for: it fails the first time it sees a run, and only then. */
function firstTimeFor(dir: string | undefined): (runId: string) => boolean {
  const seen = new Set<string>();
  if (dir === undefined)
    return (runId) => {
      if (seen.has(runId)) return false;
      seen.add(runId);
      return true;
    };
  mkdirSync(dir, { recursive: true });
  return (runId) => {
    try {
      // "wx" creates or fails: of several workers sharing the directory, exactly one is first.
      writeFileSync(join(dir, runId.replace(/[^A-Za-z0-9_-]/g, "_")), "", { flag: "wx" });
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "EEXIST") return false;
      throw err;
    }
  };
}

function nodes(flakyDir: string | undefined): Record<string, NodeHandler> {
  const firstTime = firstTimeFor(flakyDir);
  return {
    split: (p) => {
      const n = p.n === undefined ? 100 : num(p.n, "payload.n");
      return { items: Array.from({ length: n }, (_, i) => i + 1) };
    },
    square: (p) => {
      const x = num(p.x, "payload.x");
      return { value: x * x };
    },
    sum: (p) => {
      if (!Array.isArray(p.squares)) throw new NonRetryableError("payload.squares must be the list of square's results");
      const values = p.squares.map((s: { value?: unknown } | null, i) => num(s?.value, `payload.squares[${i}].value`));
      return { total: values.reduce((a, b) => a + b, 0), count: values.length };
    },
    flaky: (p, item) => {
      if (item.runId === undefined) throw new NonRetryableError("flaky runs as a node of a DAG run: the item has no run id");
      if (firstTime(item.runId)) throw new NonRetryableError(`failing the first time for run ${item.runId} (resume the run to go on)`);
      return { checked: p.total ?? null };
    },
    report: (p) => ({ text: typeof p.text === "string" ? p.text : JSON.stringify(p) }),
  };
}

/** One handler for the engine kind: the node is the task name without an iteration's `[i]`. */
function dispatch(table: Record<string, NodeHandler>): Handler<Record<string, unknown>> {
  return async (item, ctx) => {
    const node = (item.taskName ?? "").replace(/\[\d+\]$/, "");
    const run = table[node];
    if (!run) throw new NonRetryableError(`no handler for node '${node}' (this worker runs ${Object.keys(table).join(", ")})`);
    ctx.log.info({ node, run: item.runId }, "node ran");
    const payload = item.payload !== null && typeof item.payload === "object" && !Array.isArray(item.payload) ? item.payload : {};
    return run(payload, item);
  };
}

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
      "flaky-dir": { type: "string" },
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
  const number = (flag: string, raw: string | undefined, dflt: number) => {
    const n = raw === undefined ? dflt : Number(raw);
    if (!Number.isInteger(n) || n < 0) throw new Error(`--${flag} must be a whole number, got '${raw}'`);
    return n;
  };
  const ca = values["tls-ca"] ?? env.AIFLOW_TLS_CA;
  const cert = values["tls-cert"] ?? env.AIFLOW_TLS_CERT;
  const key = values["tls-key"] ?? env.AIFLOW_TLS_KEY;
  return {
    help: values.help === true,
    version: values.version === true,
    addresses: list((values.address ?? []).join(",") || env.AIFLOW_ADDRESS || "127.0.0.1:7400"),
    token: values.token ?? env.AIFLOW_AGENT_TOKEN,
    tls: ca || cert || key ? { ca, cert, key } : undefined,
    name: values.name ?? env.AIFLOW_AGENT_NAME ?? `dag-${hostname()}`,
    tenants: list(values.tenants ?? env.AIFLOW_TENANTS ?? "default"),
    engineKind: values["engine-kind"] ?? env.AIFLOW_ENGINE_KIND ?? "dag",
    slots: number("slots", values.slots ?? env.AIFLOW_SLOTS, 8),
    flakyDir: values["flaky-dir"] ?? env.AIFLOW_FLAKY_DIR,
    graceMs: number("grace", values.grace ?? env.AIFLOW_GRACE_MS, 30_000),
    logLevel: values["log-level"] ?? env.AIFLOW_LOG_LEVEL ?? "info",
  };
}

async function main(): Promise<number> {
  let agent: ReturnType<typeof createAgent>;
  try {
    const c = config();
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
      handlers: { [c.engineKind]: dispatch(nodes(c.flakyDir)) },
      gracefulShutdownMs: c.graceMs,
      handleSignals: true,
      agentVersion: VERSION,
      logger: pino({ name: "dag-worker", level: c.logLevel }),
    });
  } catch (err) {
    process.stderr.write(`dag-worker: ${(err as Error).message}\n`);
    return 2;
  }
  try {
    await agent.run();
    return 0;
  } catch {
    return 1;
  }
}

process.exitCode = await main();
