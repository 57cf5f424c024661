import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { silentLogger } from "../src/log.js";
import { Beacon } from "../src/services/beacon.js";
import { createTestDb, type TestDb } from "./support/db.js";

let db: TestDb;
let beacon: Beacon;

beforeAll(async () => {
  db = await createTestDb({ migrate: false });
  beacon = new Beacon(db.pool, db.tables.channel("beacon_test"), "beacon-test", 1, silentLogger());
});
afterAll(async () => {
  await beacon?.stop();
  await db?.drop();
});

const never = new AbortController().signal;

describe("beacon", () => {
  it("a ring with a limit wakes only that many matching waiters, the longest-waiting first", async () => {
    const a = beacon.arm(new Set(["t|k"]));
    const b = beacon.arm(new Set(["t|k"]));
    const other = beacon.arm(new Set(["t|other"]));
    beacon.ring(["t|k"], 1);
    expect(await a.wait(1_000, [never])).toBe(true);
    // b and other were not rung: their waits end at the (short) timeout.
    expect(await b.wait(20, [never])).toBe(false);
    expect(await other.wait(20, [never])).toBe(false);
    for (const w of [a, b, other]) w.disarm();
  });

  it("a ring without a limit wakes every matching waiter, and only matching ones", async () => {
    const a = beacon.arm(new Set(["t|k"]));
    const b = beacon.arm(new Set(["t|k"]));
    const any = beacon.arm(null);
    const other = beacon.arm(new Set(["t|other"]));
    beacon.ring(["t|k"]);
    expect(await a.wait(1_000, [never])).toBe(true);
    expect(await b.wait(1_000, [never])).toBe(true);
    expect(await any.wait(1_000, [never])).toBe(true);
    expect(await other.wait(20, [never])).toBe(false);
    for (const w of [a, b, any, other]) w.disarm();
  });

  it("a ring that lands between arming and waiting is not lost", async () => {
    const a = beacon.arm(new Set(["t|k"]));
    beacon.ring(["t|k"], 1);
    expect(await a.wait(0, [never])).toBe(true);
    a.disarm();
  });
});
