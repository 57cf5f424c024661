/**
 * What a maintenance run tells its tasks of this daemon's hold on the database: since when it has
 * reached it without a break (its first run, or its first run after a run that the database's
 * absence failed), and whether this run is the first of that stretch. The liveness sweep and the
 * lease expiry judge agents by it (src/fleet/liveness.ts, src/queue/work-queue.ts), so a daemon
 * that just started or just got the database back judges nobody on evidence it could not gather.
 */
import { describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import { AppError } from "../src/domain/errors.js";
import { silentLogger } from "../src/log.js";
import { Maintenance, type MaintenanceRun } from "../src/maintenance.js";

const T = Date.UTC(2026, 8, 1);

/** A Maintenance whose one failing task throws what `fails` holds, and a task that records what each run said. */
function harness() {
  const clock = new FakeClock(T);
  const m = new Maintenance(clock, silentLogger());
  const state: { fails: unknown } = { fails: null };
  const seen: MaintenanceRun[] = [];
  m.add({
    name: "database",
    run: async () => {
      if (state.fails) throw state.fails;
    },
  });
  m.add({
    name: "record",
    run: async (_now, run) => {
      if (!run) throw new Error("Maintenance passes every task what it knows of the run");
      seen.push({ ...run });
    },
  });
  const runAt = async (offsetMs: number) => {
    clock.set(T + offsetMs);
    await m.runOnce();
    return seen.at(-1);
  };
  return { state, runAt };
}

const away = () => new AppError("unavailable", "database unavailable, retry shortly");

describe("Maintenance: since when this daemon has reached the database", () => {
  it("from its first run, and again from the first run after runs the database's absence failed", async () => {
    const { state, runAt } = harness();
    expect(await runAt(0)).toEqual({ reachedSinceMs: T, justReached: true });
    expect(await runAt(1_000)).toEqual({ reachedSinceMs: T, justReached: false });

    // The run the outage starts in was begun with the database reached: it says so.
    state.fails = away();
    expect(await runAt(2_000)).toEqual({ reachedSinceMs: T, justReached: false });
    // Runs during the outage each start a stretch that their own failure ends.
    expect(await runAt(3_000)).toEqual({ reachedSinceMs: T + 3_000, justReached: true });

    state.fails = null;
    expect(await runAt(4_000)).toEqual({ reachedSinceMs: T + 4_000, justReached: true });
    expect(await runAt(5_000)).toEqual({ reachedSinceMs: T + 4_000, justReached: false });
  });

  it("a task failing for any other reason (a bug, a refusal) is no break", async () => {
    const { state, runAt } = harness();
    await runAt(0);
    state.fails = new Error("a bug");
    await runAt(1_000);
    expect(await runAt(2_000)).toEqual({ reachedSinceMs: T, justReached: false });
  });
});
