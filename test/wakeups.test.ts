import pg from "pg";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { PgListener } from "../src/db/notify.js";
import { silentLogger } from "../src/log.js";
import { Wakeups } from "../src/queue/wakeups.js";
import { createTestDb, type TestDb } from "./support/db.js";
import { until } from "./support/kit.js";

let db: TestDb;
let wakeups: Wakeups;

beforeAll(async () => {
  db = await createTestDb({ migrate: false });
  wakeups = new Wakeups(db.pool, db.tables.channel("beacon_test"), "wakeups-test", 1, silentLogger());
});
afterAll(async () => {
  await wakeups?.stop();
  await db?.drop();
});

const never = new AbortController().signal;

describe("wake-ups", () => {
  it("a ring with a limit wakes only that many matching waiters, the longest-waiting first", async () => {
    const a = wakeups.arm(new Set(["t|k"]));
    const b = wakeups.arm(new Set(["t|k"]));
    const other = wakeups.arm(new Set(["t|other"]));
    wakeups.ring(["t|k"], 1);
    expect(await a.wait(1_000, [never])).toBe(true);
    // b and other were not rung: their waits end at the (short) timeout.
    expect(await b.wait(20, [never])).toBe(false);
    expect(await other.wait(20, [never])).toBe(false);
    for (const w of [a, b, other]) w.disarm();
  });

  it("a ring without a limit wakes every matching waiter, and only matching ones", async () => {
    const a = wakeups.arm(new Set(["t|k"]));
    const b = wakeups.arm(new Set(["t|k"]));
    const any = wakeups.arm(null);
    const other = wakeups.arm(new Set(["t|other"]));
    wakeups.ring(["t|k"]);
    expect(await a.wait(1_000, [never])).toBe(true);
    expect(await b.wait(1_000, [never])).toBe(true);
    expect(await any.wait(1_000, [never])).toBe(true);
    expect(await other.wait(20, [never])).toBe(false);
    for (const w of [a, b, any, other]) w.disarm();
  });

  it("a waiter woken from its wait counts for as many items as it takes: rings of the same tick go to it before others are woken", async () => {
    const k = new Set(["t|k"]);
    const a = wakeups.arm(k, 3);
    const b = wakeups.arm(k, 3);
    const c = wakeups.arm(k, 3);
    const [wa, wb, wc] = [a.wait(1_000, [never]), b.wait(1_000, [never]), c.wait(50, [never])];
    // Five single-item rings: a takes three, b the other two; c sleeps on.
    for (let i = 0; i < 5; i++) wakeups.ring(["t|k"], 1);
    expect(await wa).toBe(true);
    expect(await wb).toBe(true);
    expect(await wc).toBe(false);
    for (const w of [a, b, c]) w.disarm();
  });

  it("a waiter rung while it looks counts for one item (its look may have missed them), so the next ring wakes another", async () => {
    const k = new Set(["t|k"]);
    const looking = wakeups.arm(k, 10);
    const waiting = wakeups.arm(k, 10);
    const w = waiting.wait(50, [never]);
    wakeups.ring(["t|k"], 1);
    expect(await w).toBe(false);
    const again = waiting.wait(1_000, [never]);
    wakeups.ring(["t|k"], 1);
    expect(await again).toBe(true);
    expect(await looking.wait(0, [never])).toBe(true);
    for (const x of [looking, waiting]) x.disarm();
  });

  it("a ring that lands between arming and waiting is not lost", async () => {
    const a = wakeups.arm(new Set(["t|k"]));
    wakeups.ring(["t|k"], 1);
    expect(await a.wait(0, [never])).toBe(true);
    a.disarm();
  });

  it("a disarmed waiter's wait ends at once, also when it was disarmed before it began waiting, and rings pass it by", async () => {
    const k = new Set(["t|k"]);
    const early = wakeups.arm(k);
    const later = wakeups.arm(k);
    early.disarm();
    // A 10-minute wait that must end now: nothing would wake a waiter that is no longer armed.
    expect(await early.wait(600_000, [never])).toBe(false);
    wakeups.ring(["t|k"], 1);
    expect(await later.wait(1_000, [never])).toBe(true);
    later.disarm();
  });
});

describe("beacons of several daemons", () => {
  it("a lone daemon's rings send no NOTIFY; once another announces itself, rings reach its waiters", async () => {
    const channel = db.tables.channel("beacon_peers");
    const heard: { from: string; keys: string[] }[] = [];
    const watcher = new pg.Client({ connectionString: db.url });
    await watcher.connect();
    await watcher.query(`LISTEN ${pg.escapeIdentifier(channel)}`);
    let marker: () => void = () => {};
    watcher.on("notification", (n) => (n.payload === "marker" ? marker() : heard.push(JSON.parse(n.payload!))));
    const listeners = [new PgListener(db.url, silentLogger()), new PgListener(db.url, silentLogger())];
    await Promise.all(listeners.map((l) => l.start()));
    const a = new Wakeups(db.pool, channel, "daemon-a", 1, silentLogger());
    const b = new Wakeups(db.pool, channel, "daemon-b", 1, silentLogger());
    try {
      await a.start(listeners[0]!);
      expect(a.hasPeers).toBe(false);
      a.ring(["t|k"]);
      // Everything a sent commits before the marker, so the watcher has it all once the marker arrives.
      await a.stop();
      await new Promise<void>((resolve) => {
        marker = resolve;
        void watcher.query(`NOTIFY ${pg.escapeIdentifier(channel)}, 'marker'`);
      });
      expect(heard.map((m) => m.keys)).toEqual([[]]);
      expect(heard[0]!.from).toMatch(/^daemon-a\//);

      const a2 = new Wakeups(db.pool, channel, "daemon-a", 1, silentLogger());
      await a2.start(listeners[0]!);
      await b.start(listeners[1]!);
      await until("daemon a has heard daemon b announce itself", () => a2.hasPeers);
      const waiter = b.arm(new Set(["t|k"]));
      a2.ring(["t|k"]);
      expect(await waiter.wait(5_000, [never])).toBe(true);
      waiter.disarm();
      await a2.stop();
    } finally {
      await b.stop();
      await Promise.all(listeners.map((l) => l.stop()));
      await watcher.end();
    }
  });

  it("a daemon that starts later hears of the ones already running at once (they answer its announcement), so its rings reach them", async () => {
    const channel = db.tables.channel("beacon_late");
    const listeners = [new PgListener(db.url, silentLogger()), new PgListener(db.url, silentLogger())];
    await Promise.all(listeners.map((l) => l.start()));
    // The daemons' pings (every 5 s) run on intervals that never fire here: the early daemon's
    // answer to the late one's announcement is all the late one can hear.
    vi.useFakeTimers({ toFake: ["setInterval", "clearInterval"] });
    const early = new Wakeups(db.pool, channel, "daemon-early", 1, silentLogger());
    const late = new Wakeups(db.pool, channel, "daemon-late", 1, silentLogger());
    try {
      await early.start(listeners[0]!);
      await late.start(listeners[1]!);
      await until("the late daemon has heard of the early one", () => late.hasPeers);
      const waiter = early.arm(new Set(["t|k"]));
      late.ring(["t|k"]);
      expect(await waiter.wait(5_000, [never])).toBe(true);
      waiter.disarm();
    } finally {
      await late.stop();
      await early.stop();
      vi.useRealTimers();
      await Promise.all(listeners.map((l) => l.stop()));
    }
  });
});
