/**
 * Waiters on the daemon's one shutdown signal (long-poll claims and Wait calls through Wakeups,
 * directive and health streams through pushStream) cost that signal one listener between them, so
 * that hundreds of connected agents raise no MaxListenersExceededWarning and leave nothing behind.
 */
import { getEventListeners } from "node:events";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { silentLogger } from "../src/log.js";
import { Wakeups } from "../src/queue/wakeups.js";
import { onAbort } from "../src/util/on-abort.js";
import { pushStream } from "../src/util/push-stream.js";
import { createTestDb, type TestDb } from "./support/db.js";

const listeners = (s: AbortSignal) => getEventListeners(s, "abort").length;

const warnings: Error[] = [];
const onWarning = (w: Error) => {
  if (w.name === "MaxListenersExceededWarning") warnings.push(w);
};
beforeAll(() => {
  process.on("warning", onWarning);
});
afterAll(() => {
  process.off("warning", onWarning);
});
afterEach(() => {
  expect(warnings).toEqual([]);
});

describe("onAbort", () => {
  it("adds one listener to a signal for any number of callbacks, calls each once on abort, and then none is left", () => {
    const shutdown = new AbortController();
    const called: number[] = [];
    for (let i = 0; i < 200; i++) onAbort(shutdown.signal, () => called.push(i));
    expect(listeners(shutdown.signal)).toBe(1);
    shutdown.abort();
    shutdown.abort();
    expect(called).toHaveLength(200);
    expect(new Set(called).size).toBe(200);
    expect(listeners(shutdown.signal)).toBe(0);
  });

  it("unregistering the last callback removes the listener; an unregistered callback is not called", () => {
    const shutdown = new AbortController();
    const called: string[] = [];
    const offA = onAbort(shutdown.signal, () => called.push("a"));
    const offB = onAbort(shutdown.signal, () => called.push("b"));
    offA();
    offA();
    expect(listeners(shutdown.signal)).toBe(1);
    offB();
    expect(listeners(shutdown.signal)).toBe(0);
    onAbort(shutdown.signal, () => called.push("c"));
    expect(listeners(shutdown.signal)).toBe(1);
    shutdown.abort();
    expect(called).toEqual(["c"]);
  });
});

describe("waiters on one shutdown signal", () => {
  let db: TestDb;
  let wakeups: Wakeups;
  beforeAll(async () => {
    db = await createTestDb({ migrate: false });
    wakeups = new Wakeups(db.pool, db.tables.channel("on_abort_test"), "on-abort-test", 1, silentLogger());
  });
  afterAll(async () => {
    await wakeups?.stop();
    await db?.drop();
  });

  it("300 long-poll waiters add one listener to it, and its abort ends every one of them", async () => {
    const shutdown = new AbortController();
    const waits = Array.from({ length: 300 }, (_, i) => wakeups.arm(new Set([`t|k${i}`])).wait(60_000, [shutdown.signal]));
    expect(listeners(shutdown.signal)).toBe(1);
    shutdown.abort();
    expect(await Promise.all(waits)).toEqual(Array(300).fill(false));
    expect(listeners(shutdown.signal)).toBe(0);
  });

  it("a waiter woken by a ring lets go of its registration", async () => {
    const shutdown = new AbortController();
    const other = wakeups.arm(new Set(["t|other"])).wait(60_000, [shutdown.signal]);
    const waiting = wakeups.arm(new Set(["t|rung"])).wait(60_000, [shutdown.signal]);
    wakeups.ring(["t|rung"]);
    expect(await waiting).toBe(true);
    expect(listeners(shutdown.signal)).toBe(1);
    shutdown.abort();
    expect(await other).toBe(false);
    expect(listeners(shutdown.signal)).toBe(0);
  });

  it("300 server streams add one listener to it, and its abort ends every one of them", async () => {
    const shutdown = new AbortController();
    const streams = Array.from({ length: 300 }, () => pushStream<number>(() => () => {}, [new AbortController().signal, shutdown.signal]));
    // A generator's body runs, up to its first wait, within its first next(): registered by now.
    const ends = streams.map((s) => s.next());
    expect(listeners(shutdown.signal)).toBe(1);
    shutdown.abort();
    expect((await Promise.all(ends)).every((r) => r.done)).toBe(true);
    expect(listeners(shutdown.signal)).toBe(0);
  });
});
