/**
 * The triggers section of `npm run bench` (`triggers`): what a webhook that starts a run costs
 * next to the StartRun call it stands for, on one daemon and one database of their own, in one run.
 * The definition is one wait node, so a start is the whole run's work until the bench ends it: no
 * agent runs, and what is measured is the trigger's path (HTTP/1.1, signature, the firing's row and
 * the delivery id in the run's transaction) against gRPC's.
 *
 *  - baseline: --trigger-starts StartRun calls by stored definition id, 16 in flight;
 *  - webhooks: as many signed deliveries, each with its own delivery id, 16 in flight on keep-alive
 *    connections.
 *
 * Figures: starts per second, and the daemon's CPU (and its Postgres backends', where the section
 * has a database of its own) per start; their ratios, webhook over baseline.
 */
import { createHmac } from "node:crypto";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { DagService, NodeKind } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { Action, TriggerService, TriggerType } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { freePort, openOwnDatabase, startDaemonProc, TENANT, TOKENS, type Database } from "./env.js";
import { backendCpuMeter, sql } from "./pg.js";
import { cpuMeter } from "./proc.js";
import type { Options } from "./sections.js";
import { ratio, round } from "./stats.js";

type Figures = Record<string, number | string>;
const IN_FLIGHT = 16;
const SECRET = "bench-webhook-secret-0123456789";
const headers = { authorization: `Bearer ${TOKENS.runs}` };

export async function triggersSection(db: Database, o: Options, emit: (name: string, f: Figures) => void, progress: (msg: string) => void): Promise<void> {
  const own = await openOwnDatabase(db);
  const where: Database = own ?? {
    ...db,
    schema: `${db.schema}_triggers`,
    close: async () => void (await sql(db.url, `DROP SCHEMA IF EXISTS "${db.schema}_triggers" CASCADE`)),
  };
  const httpPort = await freePort();
  const daemon = await startDaemonProc(where, 600, { AIFLOW_HTTP_LISTEN: `127.0.0.1:${httpPort}`, AIFLOW_AUTH_FAILURE_LIMIT: "1000000" });
  try {
    const transport = createGrpcTransport({ baseUrl: daemon.url });
    const dag = createClient(DagService, transport);
    const triggers = createClient(TriggerService, transport);
    await dag.putDefinition({ tenantKey: TENANT, definition: { id: "bench-wait", nodes: [{ name: "w", kind: NodeKind.WAIT, event: "never" }] } }, { headers });
    await triggers.putTrigger(
      { tenantKey: TENANT, trigger: { name: "bench-hook", type: TriggerType.WEBHOOK, action: Action.START, definitionId: "bench-wait", secret: SECRET } },
      { headers },
    );
    const hook = `http://127.0.0.1:${httpPort}/hooks/${TENANT}/bench-hook`;
    const startRun = () =>
      dag.startRun({ tenantKey: TENANT, source: { case: "definitionId", value: "bench-wait" }, contextJson: '{"ref":"main"}' }, { headers });
    const deliver = async (i: number) => {
      const body = `{"ref":"main","i":${i}}`;
      const res = await fetch(hook, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          "x-delivery-id": `bench-${i}`,
          "x-hub-signature-256": `sha256=${createHmac("sha256", SECRET).update(body).digest("hex")}`,
        },
        body,
      });
      await res.arrayBuffer();
      if (res.status !== 202) throw new Error(`webhook answered ${res.status}`);
    };
    const n = o.triggerStarts;
    const warm = Math.min(200, n);
    progress(`triggers: warm-up, ${warm} of each`);
    await inFlight(warm, () => startRun());
    await inFlight(warm, (i) => deliver(-1 - i));
    progress(`triggers: ${n} StartRun calls, then ${n} webhook deliveries, ${IN_FLIGHT} in flight`);
    const base = await measure(own !== undefined ? where : undefined, daemon.child.pid, n, () => inFlight(n, () => startRun()));
    const hooks = await measure(own !== undefined ? where : undefined, daemon.child.pid, n, () => inFlight(n, (i) => deliver(i)));
    emit("triggers_startrun", base);
    emit("triggers_webhook", hooks);
    emit("triggers_ratio", {
      webhook_starts_per_s_over_startrun: ratio(Number(hooks.starts_per_s), Number(base.starts_per_s)),
      webhook_daemon_cpu_over_startrun: ratio(Number(hooks.daemon_cpu_us_per_start), Number(base.daemon_cpu_us_per_start)),
      ...(own ? { webhook_postgres_cpu_over_startrun: ratio(Number(hooks.postgres_cpu_us_per_start), Number(base.postgres_cpu_us_per_start)) } : {}),
    });
  } finally {
    await daemon.child.stop();
    await where.close();
  }
}

/** Runs `n` calls of `call(i)`, IN_FLIGHT at a time. */
async function inFlight(n: number, call: (i: number) => Promise<unknown>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(IN_FLIGHT, n) }, async () => {
      while (next < n) await call(next++);
    }),
  );
}

async function measure(ownDb: Database | undefined, daemonPid: number, n: number, run: () => Promise<void>): Promise<Figures> {
  const cpu = cpuMeter({ daemon: [daemonPid] });
  const pg = ownDb ? await backendCpuMeter(ownDb.url) : undefined;
  await run();
  const use = cpu();
  const pgMs = pg ? await pg() : undefined;
  return {
    starts: n,
    starts_per_s: round((n * 1000) / use.wallMs, 1),
    daemon_cpu_us_per_start: round((use.groupMs.daemon! * 1000) / n, 1),
    ...(use.machineMs !== null ? { machine_cpu_us_per_start: round((use.machineMs * 1000) / n, 1) } : {}),
    ...(pgMs !== undefined && pgMs !== null ? { postgres_cpu_us_per_start: round((pgMs * 1000) / n, 1) } : {}),
  };
}
