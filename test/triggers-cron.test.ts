/**
 * Cron triggers on two daemons sharing one database and one fake clock: each tick fires exactly
 * once however the daemons' sweeps race, with the tick's own time as fired_on; ticks that came due
 * while no daemon ran fire after a restart when they are within --cron-catch-up, and older ones are
 * recorded as one refused firing that counts them. Time zones move the tick's instant.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { Action, TriggerType } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { RunStatus } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { FakeClock, msToNs } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { DagClient, definition } from "./support/dag.js";
import { useTestDb } from "./support/kit.js";
import { TriggerClient } from "./support/triggers.js";

const MIN = 60_000;
const T0 = Date.UTC(2026, 11, 1, 0, 1);
const clock = new FakeClock(T0);
const fx = useTestDb("cron");
const CATCH_UP = 60 * MIN;
const config = { sweepInterval: 3_600_000, cronCatchUp: CATCH_UP };
let A: Daemon;
let B: Daemon;
let triggers: TriggerClient;
let dag: DagClient;

const firingsTable = () => fx.db.tables.qualified("trigger_firing");
const firings = (name: string) =>
  fx.db.raw<{ fired_on: string; outcome: string; run_id: string | null; error: string | null; payload: string }>(
    `SELECT fired_on::text AS fired_on, outcome, run_id, error, payload FROM ${firingsTable()} WHERE trigger_name = $1 ORDER BY fired_on, id`,
    [name],
  );
const ticks = (fromMs: number, n: number, everyMs: number) => Array.from({ length: n }, (_, i) => msToNs(fromMs + i * everyMs).toString());
/** Both daemons sweep at once, as their timers would. */
const sweepBoth = () => Promise.all([A.maintenance.runOnce(), B.maintenance.runOnce()]);

beforeAll(async () => {
  A = await fx.startDaemon({ clock, config });
  B = await fx.startDaemon({ clock, config });
  triggers = fx.closers.add(new TriggerClient(A.address));
  dag = fx.closers.add(new DagClient(A.address));
  await dag.dag.putDefinition({ tenantKey: "t", definition: definition([{ name: "tick", wait: true, event: "never" }], { id: "report" }) });
});

describe("cron triggers", () => {
  it("fire once per tick across two daemons, each run caused by its own firing", async () => {
    const put = await triggers.put("t", { name: "every-5", type: TriggerType.CRON, action: Action.START, definitionId: "report", schedule: "*/5 * * * *" });
    expect(timestampMs(put.nextFire!)).toBe(Date.UTC(2026, 11, 1, 0, 5));
    // Before the tick: nothing.
    clock.set(Date.UTC(2026, 11, 1, 0, 4, 59));
    await sweepBoth();
    expect(await firings("every-5")).toEqual([]);
    // Each step of the clock, both daemons sweep at once, several times.
    for (let m = 5; m <= 60; m += 5) {
      clock.set(Date.UTC(2026, 11, 1, 0, m));
      await Promise.all([sweepBoth(), sweepBoth()]);
    }
    const fired = await firings("every-5");
    expect(fired.map((f) => f.fired_on)).toEqual(ticks(Date.UTC(2026, 11, 1, 0, 5), 12, 5 * MIN));
    expect(fired.every((f) => f.outcome === "started" && f.run_id !== null)).toBe(true);
    expect(JSON.parse(fired[0]!.payload)).toEqual({ schedule: "*/5 * * * *", time_zone: "UTC", tick: "2026-12-01T00:05:00.000Z" });
    // One run per firing, its directory row pointing back at it.
    const dir = await fx.db.raw<{ n: string }>(
      `SELECT count(*) AS n FROM ${fx.db.tables.qualified("engine_run")} r JOIN ${firingsTable()} f ON f.id = r.trigger_firing_id WHERE r.triggered_by = 'every-5' AND f.run_id = r.run_id`,
    );
    expect(Number(dir[0]!.n)).toBe(12);
    const run = await dag.get("t", fired[0]!.run_id!);
    expect(run.status).toBe(RunStatus.RUNNING);
    expect(JSON.parse(run.contextJson).trigger).toMatchObject({ name: "every-5", fired_on: fired[0]!.fired_on });
    await triggers.triggers.deleteTrigger({ tenantKey: "t", name: "every-5" });
  });

  it("catch up after a restart: ticks within --cron-catch-up fire one by one, older ones are one refused firing", async () => {
    clock.set(Date.UTC(2026, 11, 2, 0, 0, 30));
    await triggers.put("t", { name: "quarter", type: TriggerType.CRON, action: Action.START, definitionId: "report", schedule: "*/15 * * * *" });
    await A.stop();
    await B.stop();
    // Down for 40 minutes: ticks 00:15, 00:30 and 00:45 came due meanwhile, all within the hour.
    clock.set(Date.UTC(2026, 11, 2, 0, 40, 10) + 5 * MIN);
    A = await fx.startDaemon({ clock, config });
    expect((await firings("quarter")).map((f) => [f.fired_on, f.outcome])).toEqual(ticks(Date.UTC(2026, 11, 2, 0, 15), 3, 15 * MIN).map((t) => [t, "started"]));
    await A.stop();
    // Down for three hours: 01:00 … 03:45 came due; those older than an hour are missed.
    clock.set(Date.UTC(2026, 11, 2, 3, 50));
    A = await fx.startDaemon({ clock, config });
    B = await fx.startDaemon({ clock, config });
    await sweepBoth();
    const after = (await firings("quarter")).slice(3);
    expect(after[0]).toMatchObject({ fired_on: msToNs(Date.UTC(2026, 11, 2, 1, 0)).toString(), outcome: "refused", run_id: null });
    expect(after[0]!.error).toBe(
      "8 ticks from 2026-12-02T01:00:00.000Z to 2026-12-02T02:45:00.000Z were missed: older than --cron-catch-up (3600000 ms) when a daemon next swept",
    );
    expect(after.slice(1).map((f) => [f.fired_on, f.outcome])).toEqual(ticks(Date.UTC(2026, 11, 2, 3, 0), 4, 15 * MIN).map((t) => [t, "started"]));
    triggers = fx.closers.add(new TriggerClient(A.address));
    const t = (await triggers.triggers.getTrigger({ tenantKey: "t", name: "quarter" })).trigger!;
    expect(timestampMs(t.nextFire!)).toBe(Date.UTC(2026, 11, 2, 4, 0));
  });

  it("read the schedule in the trigger's time zone, daylight saving included", async () => {
    clock.set(Date.UTC(2026, 11, 4, 15));
    const ny = await triggers.put("t", {
      name: "ny-9am",
      type: TriggerType.CRON,
      action: Action.START,
      definitionId: "report",
      schedule: "0 9 * * MON-FRI",
      timeZone: "America/New_York",
    });
    // Friday 4 December 2026, 10:00 in New York (EST, UTC-5): the next weekday 9:00 is Monday's.
    expect(timestampMs(ny.nextFire!)).toBe(Date.UTC(2026, 11, 7, 14));
    clock.set(Date.UTC(2027, 2, 27, 12));
    // Berlin skips 02:00-03:00 on 28 March 2027: the 02:30 tick fires at 03:00 local (01:00 UTC).
    const berlin = await triggers.put("t", {
      name: "berlin-0230",
      type: TriggerType.CRON,
      action: Action.START,
      definitionId: "report",
      schedule: "30 2 * * *",
      timeZone: "Europe/Berlin",
    });
    expect(timestampMs(berlin.nextFire!)).toBe(Date.UTC(2027, 2, 28, 1));
    // A replacement that keeps the schedule keeps its place; one that changes it is due at its own next tick.
    clock.set(Date.UTC(2027, 2, 27, 13));
    expect(
      timestampMs(
        (
          await triggers.put("t", {
            name: "berlin-0230",
            type: TriggerType.CRON,
            action: Action.START,
            definitionId: "report",
            schedule: "30 2 * * *",
            timeZone: "Europe/Berlin",
          })
        ).nextFire!,
      ),
    ).toBe(Date.UTC(2027, 2, 28, 1));
    expect(
      timestampMs(
        (
          await triggers.put("t", {
            name: "berlin-0230",
            type: TriggerType.CRON,
            action: Action.START,
            definitionId: "report",
            schedule: "0 15 * * *",
            timeZone: "Europe/Berlin",
          })
        ).nextFire!,
      ),
    ).toBe(Date.UTC(2027, 2, 27, 14));
    for (const name of ["ny-9am", "berlin-0230", "quarter"]) await triggers.triggers.deleteTrigger({ tenantKey: "t", name });
  });

  it("record a refused firing and move on when the definition is gone, so a bad trigger neither stalls nor repeats", async () => {
    clock.set(Date.UTC(2027, 3, 1, 0, 0, 30));
    // A trigger is put only for a stored definition; this one is then removed under it.
    await fx.closers
      .add(new DagClient(A.address))
      .dag.putDefinition({ tenantKey: "t", definition: definition([{ name: "tick", wait: true, event: "never" }], { id: "no-such-definition" }) });
    await triggers.put("t", { name: "orphan", type: TriggerType.CRON, action: Action.START, definitionId: "no-such-definition", schedule: "* * * * *" });
    await fx.db.raw(
      `DELETE FROM ${fx.db.tables.qualified("engine_definition")} WHERE engine_kind = 'dag' AND tenant_key = 't' AND definition_id = 'no-such-definition'`,
    );
    clock.set(Date.UTC(2027, 3, 1, 0, 2, 30));
    await sweepBoth();
    const fired = await firings("orphan");
    expect(fired.map((f) => [f.fired_on, f.outcome])).toEqual(ticks(Date.UTC(2027, 3, 1, 0, 1), 2, MIN).map((t) => [t, "refused"]));
    expect(fired[0]!.error).toMatch(/has no stored definition 'no-such-definition'/);
    await sweepBoth();
    expect(await firings("orphan")).toHaveLength(2);
  });
});
