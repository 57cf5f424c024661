/**
 * The Enqueue group commit and its pacing (src/queue/enqueue-group-commit.ts), over the real store on a
 * pool that counts its statements. Time is a fake PaceTimer: its clock moves only when a test moves
 * it, and a paced wait is a promise the test releases, so "waits the rest of the window" is asserted
 * as the wait the batcher asked for. A store whose inserts can be held lets a test add calls while a
 * statement is in flight, which is when pacing applies.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EnqueueGroupCommit, MAX_ROWS, type PaceTimer } from "../src/queue/enqueue-group-commit.js";
import { WorkItemStore, type EnqueueResult, type EnqueueRow, type HandoffInput } from "../src/store/work-items.js";
import { newId } from "../src/util/ids.js";
import { openCountingPool, type CountingPool } from "./support/counting-pool.js";
import { createTestDb, type TestDb } from "./support/db.js";
import { newItem } from "./support/queue.js";

let db: TestDb;
let counting: CountingPool;

beforeAll(async () => {
  db = await createTestDb({ label: "batcher" });
  counting = await openCountingPool(db.url);
});
afterAll(async () => {
  await counting?.end();
  await db?.drop();
});

/** A promise with its resolver, to wait on a signal rather than a sleep. */
function signal<T = void>() {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** Monotonic time that moves when told, and waits that end when released. */
class FakeTimer implements PaceTimer {
  t = 0;
  readonly waits: number[] = [];
  #asked = signal<number>();
  #release = signal();

  now = () => this.t;
  sleep = (ms: number) => {
    this.waits.push(ms);
    this.#asked.resolve(ms);
    return this.#release.promise;
  };
  /** Resolves with the next wait the batcher asks for. */
  asked(): Promise<number> {
    return this.#asked.promise;
  }
  /** Ends the wait in progress, moving the clock past it. */
  release(): void {
    this.t += this.waits.at(-1) ?? 0;
    const r = this.#release;
    this.#asked = signal<number>();
    this.#release = signal();
    r.resolve();
  }
}

/** The real store, with inserts that can be held in flight and a record of each statement's rows. */
class HeldStore extends WorkItemStore {
  readonly batches: string[][] = [];
  #gate: Promise<void> | undefined;
  #started = signal();

  hold(): () => void {
    const g = signal();
    this.#gate = g.promise;
    return () => {
      this.#gate = undefined;
      g.resolve();
    };
  }
  /** Resolves when the next insert has started (and is held, if a hold is on). */
  started(): Promise<void> {
    return this.#started.promise;
  }
  override async enqueueRows(rows: readonly EnqueueRow[], handoff?: HandoffInput): Promise<EnqueueResult[]> {
    this.batches.push(rows.map((r) => r.item.taskName ?? ""));
    const started = this.#started;
    this.#started = signal();
    started.resolve();
    if (this.#gate) await this.#gate;
    return super.enqueueRows(rows, handoff);
  }
}

const row = (name: string): EnqueueRow => ({
  id: newId(),
  tenant: "batcher",
  engineId: "engine-1",
  by: "test",
  nowMs: Date.UTC(2026, 5, 1),
  item: newItem({ taskName: name }),
});

const setup = (windowMs: number) => {
  const store = new HeldStore(counting.pool, db.tables, { baseMs: 1000, capMs: 60_000, jitter: false });
  const timer = new FakeTimer();
  counting.reset();
  return { store, timer, batcher: new EnqueueGroupCommit(store, undefined, { windowMs, timer }) };
};

const names = async (results: Promise<EnqueueResult[]>[]) => {
  const ids = (await Promise.all(results)).flat().map((r) => r.id);
  const rows = await db.raw<{ task_name: string }>(`SELECT task_name FROM ${db.tables.qualified("work_item")} WHERE id = ANY($1) ORDER BY id`, [ids]);
  return rows.map((r) => r.task_name);
};

describe("EnqueueGroupCommit", () => {
  it("writes a call that finds it idle at once, also right after the last statement (a producer awaiting each answer is not paced)", async () => {
    const { store, timer, batcher } = setup(8);
    const first = await batcher.submit([row("seq-1")]);
    const second = await batcher.submit([row("seq-2")]);
    expect(timer.waits).toEqual([]);
    expect(store.batches).toEqual([["seq-1"], ["seq-2"]]);
    expect(counting.statements).toHaveLength(2);
    expect(await names([Promise.resolve(first), Promise.resolve(second)])).toEqual(["seq-1", "seq-2"]);
  });

  it("under load waits out the rest of the window, and the calls that arrive meanwhile share one statement", async () => {
    const { store, timer, batcher } = setup(8);
    const release = store.hold();
    const a = batcher.submit([row("a")]);
    await store.started();
    // While the first statement is in flight, two calls arrive; the statement took 3 ms.
    const b = batcher.submit([row("b1"), row("b2")]);
    const c = batcher.submit([row("c")]);
    timer.t = 3;
    release();
    expect(await timer.asked()).toBe(5);
    expect((await a).map((r) => r.existing)).toEqual([false]);
    // During the wait nothing more is written, and a later call joins the waiting ones.
    const d = batcher.submit([row("d")]);
    expect(store.batches).toEqual([["a"]]);
    timer.release();
    expect(await names([b, c, d])).toEqual(["b1", "b2", "c", "d"]);
    expect(store.batches).toEqual([["a"], ["b1", "b2", "c", "d"]]);
    expect(counting.statements).toHaveLength(2);
    expect(timer.waits).toEqual([5]);
  });

  it("does not wait when the last statement took the whole window", async () => {
    const { store, timer, batcher } = setup(8);
    const release = store.hold();
    const a = batcher.submit([row("slow-a")]);
    await store.started();
    const b = batcher.submit([row("slow-b")]);
    timer.t = 8;
    release();
    expect(await names([a, b])).toEqual(["slow-a", "slow-b"]);
    expect(store.batches).toEqual([["slow-a"], ["slow-b"]]);
    expect(timer.waits).toEqual([]);
  });

  it("does not wait when the waiting calls already fill a statement", async () => {
    const { store, timer, batcher } = setup(8);
    const release = store.hold();
    const a = batcher.submit([row("full-a")]);
    await store.started();
    const big = Array.from({ length: MAX_ROWS }, (_, i) => row(`full-${i}`));
    const b = batcher.submit(big);
    release();
    expect((await b).length).toBe(MAX_ROWS);
    await a;
    expect(store.batches.map((s) => s.length)).toEqual([1, MAX_ROWS]);
    expect(timer.waits).toEqual([]);
  });

  it("with a window of 0 writes the waiting calls as soon as the last statement returns (no pacing)", async () => {
    const { store, timer, batcher } = setup(0);
    const release = store.hold();
    const a = batcher.submit([row("zero-a")]);
    await store.started();
    const b = batcher.submit([row("zero-b")]);
    const c = batcher.submit([row("zero-c")]);
    release();
    expect(await names([a, b, c])).toEqual(["zero-a", "zero-b", "zero-c"]);
    expect(store.batches).toEqual([["zero-a"], ["zero-b", "zero-c"]]);
    expect(timer.waits).toEqual([]);
  });
});
