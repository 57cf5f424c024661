/**
 * Cron triggers, fired from the maintenance sweep that every daemon runs.
 *
 * What must stay true:
 * - Exactly one firing per tick across daemons: a trigger's next_fire_ns is the tick not yet fired;
 *   a daemon fires it only holding the trigger's row lock while next_fire_ns is still that tick, and
 *   moves it on in the transaction that records the firing (./firer.ts, TickHold). A daemon that
 *   dies before the commit leaves the tick due for the next sweep, on any daemon.
 * - No tick is lost across a restart or an outage shorter than --cron-catch-up: the ticks that came
 *   due meanwhile are fired one by one, each with its own time as fired_on. Ticks older than that
 *   window are not run; one refused firing says how many were missed and from when to when.
 * - The time is the daemon's clock at the sweep, so tests move a FakeClock and call the sweep.
 */
import type { DatabasePool, DatabaseTransactionConnection } from "slonik";
import { msToNs } from "../clock.js";
import type { Tables } from "../db/tables.js";
import type { Logger } from "../log.js";
import type { MaintenanceTask } from "../maintenance.js";
import { TriggerStore, type TriggerRow } from "../store/triggers.js";
import { cronOf, nextTick } from "./definition.js";
import { TickTaken, type TickHold, type TriggerFirer } from "./firer.js";

/** Firings one sweep makes at most; the rest wait for the next sweep. */
const SWEEP_FIRINGS = 1_000;
/** Missed ticks counted at most in a refusal's words. */
const COUNT_MISSED = 10_000;
const NS_PER_MS = 1_000_000n;

export interface CronDeps {
  pool: DatabasePool;
  tables: Tables;
  firer: TriggerFirer;
  log: Logger;
  /** --cron-catch-up: how old a tick may be and still fire. */
  catchUpMs: number;
}

export function cronTask(d: CronDeps): MaintenanceTask {
  return { name: "cron-triggers", run: (nowMs) => fireDueTicks(d, nowMs) };
}

/** Fires every cron tick due at `nowMs` that no other daemon fires; returns how many it fired or refused. */
export async function fireDueTicks(d: CronDeps, nowMs: number): Promise<number> {
  const store = new TriggerStore(d.pool, d.tables);
  let fired = 0;
  const taken = new Set<string>();
  while (fired < SWEEP_FIRINGS) {
    const due = (await store.dueCron(msToNs(nowMs), 100)).filter((t) => !taken.has(`${t.id}@${t.next_fire_ns}`));
    if (due.length === 0) return fired;
    for (const t of due) {
      try {
        await fireTick(d, t, nowMs);
        fired++;
      } catch (err) {
        // Another daemon holds or fired this tick: passed over for the rest of this sweep.
        if (!(err instanceof TickTaken)) throw err;
        taken.add(`${t.id}@${t.next_fire_ns}`);
      }
    }
  }
  return fired;
}

async function fireTick(d: CronDeps, t: TriggerRow, nowMs: number): Promise<void> {
  const tickNs = t.next_fire_ns!;
  const tickMs = Number(tickNs / NS_PER_MS);
  const cron = cronOf(t.schedule!, t.time_zone);
  const oldest = nowMs - d.catchUpMs;
  const hold = (nextMs: number | null): TickHold => ({
    take: async (tx: DatabaseTransactionConnection) => {
      if (!(await new TriggerStore(tx, d.tables).lockTick(t.id, tickNs))) throw new TickTaken();
    },
    consume: (tx: DatabaseTransactionConnection) => new TriggerStore(tx, d.tables).moveCron(t.id, nextMs === null ? null : msToNs(nextMs)),
  });
  if (tickMs < oldest) return missTicks(d, t, cron, tickMs, oldest, hold);
  const iso = new Date(tickMs).toISOString();
  const payload = { schedule: t.schedule, time_zone: t.time_zone ?? "UTC", tick: iso };
  await d.firer.fire({ trigger: t, payloadText: JSON.stringify(payload), payload, firedOnNs: tickNs, replayKeys: [] }, hold(nextTick(cron, tickMs)));
}

/** Skips the ticks older than the catch-up window, recording one refused firing that counts them. */
async function missTicks(
  d: CronDeps,
  t: TriggerRow,
  cron: ReturnType<typeof cronOf>,
  firstMs: number,
  oldestMs: number,
  hold: (nextMs: number | null) => TickHold,
): Promise<void> {
  let missed = 0;
  let lastMs = firstMs;
  for (let at: number | null = firstMs; at !== null && at < oldestMs && missed < COUNT_MISSED; at = nextTick(cron, at)) {
    missed++;
    lastMs = at;
  }
  const resume = nextTick(cron, oldestMs - 1);
  const count = missed >= COUNT_MISSED ? `${COUNT_MISSED} or more ticks` : missed === 1 ? "1 tick" : `${missed} ticks`;
  const error = `${count} from ${new Date(firstMs).toISOString()} to ${new Date(lastMs).toISOString()} were missed: older than --cron-catch-up (${d.catchUpMs} ms) when a daemon next swept`;
  await d.firer.record(
    {
      tenantKey: t.tenant_key,
      triggerName: t.name,
      triggerType: "cron",
      payload: JSON.stringify({
        schedule: t.schedule,
        time_zone: t.time_zone ?? "UTC",
        missed,
        from: new Date(firstMs).toISOString(),
        to: new Date(lastMs).toISOString(),
      }),
      action: t.action,
      definitionId: t.definition_id,
      event: t.event,
      runId: null,
      outcome: "refused",
      error,
      firedOn: msToNs(firstMs),
    },
    hold(resume),
  );
  d.log.warn({ trigger: t.name, tenant: t.tenant_key, missed }, "cron ticks older than --cron-catch-up were not fired");
}
