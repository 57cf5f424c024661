/**
 * The streams section of `npm run bench`: agents waiting on their agent streams, and what that costs
 * the daemon (bench/child-streams.ts holds the streams).
 */
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { committedTransactions, KIND, TENANT, TOKENS, type Database, type DaemonProc } from "./env.js";
import { pollUntil } from "./pg.js";
import { cpuMeter, sampleProc, startChild } from "./proc.js";
import type { Options } from "./sections.js";
import { round } from "./stats.js";

type Figures = Record<string, number | string>;

const headers = { authorization: `Bearer ${TOKENS.engine}` };

/**
 * The streams section: `streamAgents` simulated agents each hold an agent stream open with a credit,
 * waiting for work, on one daemon of its own (started with a long heartbeat interval, so that none
 * goes inactive in the window for want of heartbeats). What waiting costs: the daemon's RSS with
 * them and without, its CPU over an idle window with them and without, and the statements per
 * second meanwhile (a waiting stream holds no connection and runs nothing).
 */
export async function idleStreams(db: Database, daemon: DaemonProc, o: Options): Promise<Figures> {
  const pid = daemon.child.pid;
  const idle = async () => {
    const x0 = await committedTransactions(db.url);
    const meter = cpuMeter({ daemon: [pid] });
    await new Promise((r) => setTimeout(r, o.streamIdleMs));
    const cpu = meter();
    const x1 = await committedTransactions(db.url);
    return { cpuPct: (cpu.groupMs.daemon! / cpu.wallMs) * 100, statementsPerS: (x1 - x0 - 2) / (cpu.wallMs / 1000) };
  };
  // Each window opens after hbSettleMs: a backend publishes its statement counts up to ten seconds
  // after it goes idle (PGSTAT_IDLE_INTERVAL), and the daemon's start, the registrations and each
  // stream's first claim must be counted before the window, not in it.
  const settle = () => new Promise((r) => setTimeout(r, o.hbSettleMs));
  await settle();
  const quiet = await idle();
  const rssBefore = sampleProc(pid).rssBytes;
  const streams = startChild("bench/child-streams.ts", [daemon.address, TOKENS.agent, String(o.streamAgents), TENANT, `${KIND}-idle`], {
    ready: (l) => l.includes('"ready"'),
  });
  await streams.ready;
  await settle();
  const waiting = await idle();
  const rss = sampleProc(pid).rssBytes;
  // One item wakes one of them and is pushed to it: the waits are live, not merely open.
  const counted = new Promise<number>((resolve) =>
    streams.onLine((l) => (l.includes('"pushed"') ? resolve((JSON.parse(l) as { pushed: number }).pushed) : undefined)),
  );
  const queue = createClient(QueueService, createGrpcTransport({ baseUrl: daemon.url }));
  await queue.enqueue({ tenantKey: TENANT, items: [{ engineKind: `${KIND}-idle`, payloadJson: "{}" }] }, { headers });
  await pollUntil<{ n: number }>(
    db.url,
    `SELECT count(*)::int AS n FROM "${db.schema}".aiflow_work_item WHERE engine_kind = '${KIND}-idle' AND status = 'dispatched'`,
    (r) => r.n === 1,
    30_000,
    "the wake-up",
  );
  streams.proc.send("count");
  const pushed = await counted;
  await streams.stop();
  return {
    streams: o.streamAgents,
    seconds: round(o.streamIdleMs / 1000, 1),
    daemon_rss_mb: round(rss / 2 ** 20, 1),
    daemon_rss_mb_without: round(rssBefore / 2 ** 20, 1),
    rss_kb_per_stream: round((rss - rssBefore) / 1024 / o.streamAgents, 1),
    daemon_idle_cpu_pct: round(waiting.cpuPct, 2),
    daemon_idle_cpu_pct_without: round(quiet.cpuPct, 2),
    idle_statements_per_s: round(Math.max(0, waiting.statementsPerS), 1),
    idle_statements_per_s_without: round(Math.max(0, quiet.statementsPerS), 1),
    pushed_after_wake: pushed,
  };
}
