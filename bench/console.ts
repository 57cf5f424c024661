/**
 * The console section of `npm run bench` (`console`, only when named: it needs Debian's Chromium):
 * the web console at fleet scale, on a daemon and database of its own. --console-agents simulated
 * agents heartbeat once a second (bench/child-heartbeats.ts) over --console-items pending items;
 * then, in one run:
 *
 *  - closed: the daemon's CPU over --console-window with no console open;
 *  - first view: a fresh headless Chromium signs in and waits until the fleet table shows every
 *    agent counted and its first page of rows, then opens the queue view until its figures show;
 *  - open: the daemon's CPU over the same window with the console open on the fleet view (it reads
 *    ListAgents every 5 s and charts what it gets).
 *
 * Figures: the first views' milliseconds, and the daemon's CPU with the console open ÷ closed.
 */
import { launchChromium } from "../test/support/browser.js";
import { freePort, openOwnDatabase, startDaemonProc, TOKENS, type Database } from "./env.js";
import { sql } from "./pg.js";
import { cpuMeter, startChild } from "./proc.js";
import { enqueueRate, type Options } from "./sections.js";
import { ratio, round } from "./stats.js";

type Figures = Record<string, number | string>;

export async function consoleSection(db: Database, o: Options, emit: (name: string, f: Figures) => void, progress: (msg: string) => void): Promise<void> {
  const own = await openOwnDatabase(db);
  const where: Database = own ?? {
    ...db,
    schema: `${db.schema}_console`,
    close: async () => void (await sql(db.url, `DROP SCHEMA IF EXISTS "${db.schema}_console" CASCADE`)),
  };
  const httpPort = await freePort();
  const daemon = await startDaemonProc(where, 700, { AIFLOW_HTTP_LISTEN: `127.0.0.1:${httpPort}`, AIFLOW_METRICS_MAX_AGENTS: String(o.consoleAgents) });
  const window = o.consoleWindowMs;
  try {
    progress(`console: ${o.consoleItems} pending items, ${o.consoleAgents} heartbeating agents`);
    await enqueueRate([daemon], o.consoleItems);
    const beatFor = 10_000 + 2 * window + 60_000;
    const hb = startChild("bench/child-heartbeats.ts", [daemon.address, TOKENS.agent, String(o.consoleAgents), String(beatFor)], {
      ready: (l) => l.includes('"ready"'),
    });
    await hb.ready;
    // Let the registrations' writes settle before measuring.
    await new Promise((r) => setTimeout(r, 5_000));

    progress(`console: daemon CPU over ${window / 1000} s with no console open`);
    const closed = await daemonCpu(daemon.child.pid, window);

    const browser = await launchChromium();
    try {
      const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
      const base = `http://127.0.0.1:${httpPort}`;
      await page.goto(`${base}/console/`);
      await page.getByLabel("Ops token").fill(TOKENS.ops);
      const t0 = performance.now();
      await page.getByRole("button", { name: "Sign in" }).click();
      await page.locator(".count", { hasText: `${o.consoleAgents} agents` }).waitFor({ timeout: 60_000 });
      await page
        .locator("tr[data-agent]")
        .nth(Math.min(99, o.consoleAgents - 1))
        .waitFor();
      const fleetMs = performance.now() - t0;
      const t1 = performance.now();
      await page.getByRole("link", { name: "Queue" }).click();
      await page.locator('[data-figure="pending"]').waitFor({ timeout: 60_000 });
      const queueMs = performance.now() - t1;
      await page.getByRole("link", { name: "Fleet" }).click();
      await page.locator("tr[data-agent]").first().waitFor();

      progress(`console: daemon CPU over ${window / 1000} s with the console open on the fleet`);
      const open = await daemonCpu(daemon.child.pid, window);
      emit("console", {
        agents: o.consoleAgents,
        items: o.consoleItems,
        fleet_first_view_ms: round(fleetMs, 0),
        queue_first_view_ms: round(queueMs, 0),
        daemon_cpu_pct_closed: closed,
        daemon_cpu_pct_open: open,
        daemon_cpu_open_over_closed: ratio(open, closed),
        daemon_cpu_added_pct_of_a_core: round(open - closed, 1),
      });
    } finally {
      await browser.close();
      await hb.stop();
    }
  } finally {
    await daemon.child.stop();
    await where.close();
  }
}

async function daemonCpu(pid: number, ms: number): Promise<number> {
  const meter = cpuMeter({ daemon: [pid] });
  await new Promise((r) => setTimeout(r, ms));
  const use = meter();
  return round((use.groupMs.daemon! / use.wallMs) * 100, 1);
}
