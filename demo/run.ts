/**
 * npm run demo — the whole system on the embedded database: a daemon, three example agents (the
 * copyable worker in agent-sdk/examples) and, where Debian's Python with grpcio is present, one
 * Python agent (agent-sdk/python/examples/worker.py), 10,000 items across two tenants, a live progress bar, one
 * agent drained half-way (its work finishes or moves; nothing is lost), and a summary. Then a DAG
 * run (demo/dag.ts): the demo DAG fails at its flaky node, is resumed, and completes without
 * running again what had completed. It runs over mutual TLS with development certificates
 * (scripts/dev-certs.sh): no bearer tokens, every caller is named by its client certificate. It
 * stops everything it started.
 */
import { mkdtempSync, readFileSync, rmSync, chmodSync } from "node:fs";
import { get as httpsGet } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { pino } from "pino";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { startEmbeddedPostgres } from "../src/db/embedded.js";
import { freePort, makeBenchTls } from "../bench/env.js";
import { sql } from "../bench/pg.js";
import { startChild, type Child } from "../bench/proc.js";
import { pythonAvailable } from "../bench/python.js";
import { table } from "../src/cli/ctl/format.js";
import { Bar } from "./bar.js";
import { dagDemo } from "./dag.js";

const ITEMS = Number(process.env.DEMO_ITEMS ?? 10_000);
const TENANTS = ["acme", "globex"];
const say = (msg: string) => process.stderr.write(`demo: ${msg}\n`);

const dir = mkdtempSync(join(tmpdir(), "aiflowd-demo-"));
chmodSync(dir, 0o755);
const children: Child[] = [];
let pgServer: Awaited<ReturnType<typeof startEmbeddedPostgres>> | undefined;
const certs = makeBenchTls();
try {
  say("starting an embedded Postgres");
  pgServer = await startEmbeddedPostgres({ dataDir: join(dir, "pg"), port: await freePort(), log: pino({ level: "warn" }) });
  const port = await freePort();
  const address = `127.0.0.1:${port}`;
  const metricsAddress = `127.0.0.1:${await freePort()}`;
  say(`starting aiflowd on https://${address} (mutual TLS: callers are named by their certificates)`);
  const daemon = startChild("bin/aiflowd.js", ["serve"], {
    env: {
      DATABASE_URL: pgServer.url,
      AIFLOW_LISTEN: address,
      AIFLOW_TLS_CERT: certs.cert,
      AIFLOW_TLS_KEY: certs.key,
      AIFLOW_TLS_CLIENT_CA: certs.ca,
      AIFLOW_HTTP_LISTEN: metricsAddress,
      AIFLOW_TENANTS: TENANTS.join(","),
      AIFLOW_LOG_LEVEL: "info",
      AIFLOW_HEARTBEAT_INTERVAL: "1s",
      NO_COLOR: "1",
    },
    ready: (l) => l.includes("aiflowd serving gRPC"),
  });
  children.push(daemon);
  await daemon.ready;

  const agentNames = ["demo-agent-1", "demo-agent-2", "demo-agent-3"];
  const python = pythonAvailable();
  if (python) agentNames.push("demo-agent-py");
  say(
    `starting ${agentNames.length} example agents (agent-sdk/examples/worker.ts${python ? ", and agent-sdk/python/examples/worker.py in Python" : "; no Python agent: Debian's python3-grpcio is not installed"})`,
  );
  for (const name of agentNames) {
    // The agent certificate (spiffe://aiflow/agent/*) is its identity: no token.
    const agentCert = certs.client("agent");
    const script = name.endsWith("-py") ? "agent-sdk/python/examples/worker.py" : "agent-sdk/examples/worker.ts";
    const agent = startChild(
      script,
      [
        "--address",
        address,
        "--tls-ca",
        certs.ca,
        "--tls-cert",
        agentCert.cert,
        "--tls-key",
        agentCert.key,
        "--name",
        name,
        "--tenants",
        TENANTS.join(","),
        "--slots",
        "16",
        "--grace",
        "10000",
      ],
      {
        env: { AIFLOW_LOG_LEVEL: "warn" },
        ready: () => true,
        stderr: "ignore",
      },
    );
    // Workers log pino JSON on stdout (at warn: next to nothing); nothing waits on a ready line from them.
    agent.ready.catch(() => {});
    children.push(agent);
  }

  // One client per role, each with that role's certificate (spiffe://aiflow/engine/producer, …/ops/operator, …/runs/orchestrator).
  const asRole = (role: "engine" | "ops" | "runs") => {
    const c = certs.client(role);
    return createGrpcTransport({ baseUrl: `https://${address}`, nodeOptions: { ca: certs.caPem, cert: readFileSync(c.cert), key: readFileSync(c.key) } });
  };
  const queue = createClient(QueueService, asRole("engine"));
  const ops = createClient(OpsService, asRole("ops"));

  // Wait until the three agents have registered.
  for (;;) {
    const { agents } = await ops.listAgents({});
    if (agents.filter((a) => agentNames.includes(a.name)).length === agentNames.length) break;
    await new Promise((r) => setTimeout(r, 100));
  }

  say(`enqueueing ${ITEMS} items across tenants ${TENANTS.join(", ")}`);
  const started = Date.now();
  for (let i = 0; i < ITEMS; i += 1000) {
    const n = Math.min(1000, ITEMS - i);
    const tenant = TENANTS[(i / 1000) % TENANTS.length]!;
    await queue.enqueue({
      tenantKey: tenant,
      items: Array.from({ length: n }, (_, j) => ({
        engineKind: "test",
        taskName: "wait",
        runId: `demo-run-${tenant}`,
        maxRetries: 3,
        payloadJson: JSON.stringify({ ms: 2 + ((i + j) % 9) }),
      })),
    });
  }

  const bar = new Bar(ITEMS);
  let drained: string | undefined;
  for (;;) {
    const stats = await ops.queueStats({});
    const finished = stats.depth.filter((d) => d.status >= 3).reduce((n, d) => n + Number(d.count), 0);
    const { agents } = await ops.listAgents({});
    const note = agents.map((a) => `${a.name.replace("demo-agent-", "#")}:${a.inFlight}${a.status === 2 ? "(draining)" : ""}`).join(" ");
    bar.update(finished, `in flight ${note}`);
    if (!drained && finished >= ITEMS / 2) {
      drained = agentNames[1]!;
      await ops.drainAgent({ name: drained, deadline: durationFromMs(5_000), reason: "demo: rolling deploy" });
      bar.log(`half-way: draining ${drained} (deadline 5s) — its work finishes or moves to the others`);
    }
    if (finished >= ITEMS) break;
    await new Promise((r) => setTimeout(r, 250));
  }
  bar.done();
  const seconds = (Date.now() - started) / 1000;

  const rows = await sql<{ agent_id: string | null; status: string; n: string; retries: string }>(
    pgServer.url,
    `SELECT agent_id, status, count(*) AS n, sum(retry_count) AS retries FROM public.aiflow_work_item GROUP BY 1, 2 ORDER BY 1, 2`,
  );
  const completed = rows.filter((r) => r.status === "completed").reduce((n, r) => n + Number(r.n), 0);
  const dead = rows.filter((r) => r.status === "failed").reduce((n, r) => n + Number(r.n), 0);
  const retries = rows.reduce((n, r) => n + Number(r.retries), 0);
  console.log("");
  console.log(
    table(
      ["AGENT", "COMPLETED", "NOTE"],
      agentNames.map((name) => [
        name,
        String(rows.filter((r) => r.agent_id === name && r.status === "completed").reduce((n, r) => n + Number(r.n), 0)),
        name === drained ? "drained half-way" : "",
      ]),
    ),
  );
  console.log("");
  console.log(
    table(
      ["ITEMS", "COMPLETED", "SECONDS", "ITEMS/S", "RETRIES", "DEAD LETTERS", "LOST"],
      [
        [
          String(ITEMS),
          String(completed),
          seconds.toFixed(1),
          (completed / seconds).toFixed(0),
          String(retries),
          String(dead),
          String(ITEMS - completed - dead),
        ],
      ],
    ),
  );
  // The same run as Prometheus sees it: /metrics over HTTPS, read with the ops certificate.
  const exposition = await scrape(`https://${metricsAddress}/metrics`, certs.caPem, certs.client("ops"));
  const sample = (name: string) =>
    exposition
      .split("\n")
      .filter((l) => l.startsWith(name))
      .reduce((n, l) => n + Number(l.slice(l.lastIndexOf(" ") + 1)), 0);
  console.log("");
  say(`/metrics at https://${metricsAddress}/metrics (ops certificate):`);
  console.log(
    table(
      ["RUNS COMPLETED", "DIRECT HAND-OFFS", "EMPTY CLAIMS", "REDELIVERIES", "gRPC CALLS"],
      [
        [
          String(sample('aiflow_queue_run_seconds_count{engine_kind="test",outcome="completed"}')),
          String(sample("aiflow_queue_direct_dispatches_total")),
          String(sample("aiflow_queue_empty_claims_total")),
          String(sample("aiflow_queue_redeliveries_total")),
          String(sample("grpc_server_handled_total")),
        ],
      ],
    ),
  );
  const queueOk = completed + dead === ITEMS;

  console.log("");
  const agentCert = certs.client("agent");
  const dagOk = await dagDemo({
    address,
    runs: asRole("runs"),
    tls: { ca: certs.ca, cert: agentCert.cert, key: agentCert.key },
    tenant: TENANTS[0]!,
    flakyDir: mkdtempSync(join(dir, "flaky-")),
    children,
    say,
  });
  process.exitCode = queueOk && dagOk ? 0 : 1;
} finally {
  say("stopping agents, daemon and Postgres");
  for (const c of children.slice(1).reverse()) await c.stop(15_000);
  if (children[0]) await children[0].stop(15_000);
  await pgServer?.stop();
  rmSync(dir, { recursive: true, force: true });
  certs.remove();
}

/** GET over HTTPS with a client certificate, as a Prometheus scrape under mutual TLS. */
function scrape(url: string, ca: Buffer, client: { cert: string; key: string }): Promise<string> {
  return new Promise((resolve, reject) => {
    const req = httpsGet(url, { ca, cert: readFileSync(client.cert), key: readFileSync(client.key) }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (body += c));
      res.on("end", () => (res.statusCode === 200 ? resolve(body) : reject(new Error(`${url} answered ${res.statusCode}: ${body}`))));
    });
    req.on("error", reject);
  });
}
