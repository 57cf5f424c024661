/**
 * The heartbeat thread's lease renewal (src/liveness/renewals.js) on its own, against scripted
 * daemons and a fake clock: what each round sends, what it reports, and where it goes next.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { FromThread } from "../src/liveness/protocol.js";
import { MAX_BATCH, Renewals, type Daemon, type Outcome } from "../src/liveness/renewals.js";

const TTL_MS = 300;
const TICK_MS = TTL_MS / 3;

interface Scripted extends Daemon {
  /** The leases of each call, in order. */
  calls: { workItemId: string; leaseToken: string }[][];
}

/** A daemon that answers each call with `answer` (every lease held, by default). */
function daemon(
  address: string,
  answer: (leases: { workItemId: string; leaseToken: string }[]) => Outcome[] | Error = (ls) => ls.map((l) => held(l.workItemId)),
): Scripted {
  const calls: Scripted["calls"] = [];
  return {
    address,
    calls,
    async extendLease(leases) {
      calls.push(leases);
      const a = answer(leases);
      if (a instanceof Error) throw a;
      return a;
    },
  };
}
const held = (workItemId: string): Outcome => ({ workItemId, ok: true, message: "" });
const lost = (workItemId: string): Outcome => ({ workItemId, ok: false, message: "lease lost: held under another token" });

function renewals(daemons: Daemon[]) {
  const posted: FromThread[] = [];
  return { r: new Renewals(daemons, 10_000, (m) => posted.push(m)), posted };
}

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

describe("thread-side lease renewal", () => {
  it("renews every lease it holds in one call each third of the TTL, with the tokens it was handed, and stops at 0", async () => {
    const d = daemon("a");
    const { r, posted } = renewals([d]);
    r.hold([
      { id: "i1", token: "t1" },
      { id: "i2", token: "t2" },
    ]);
    r.renewEvery(TTL_MS, 0);
    await vi.advanceTimersByTimeAsync(TICK_MS - 1);
    expect(d.calls).toEqual([]);
    await vi.advanceTimersByTimeAsync(1);
    expect(d.calls).toEqual([
      [
        { workItemId: "i1", leaseToken: "t1" },
        { workItemId: "i2", leaseToken: "t2" },
      ],
    ]);
    expect(posted).toEqual([{ type: "renewed", leases: 2 }]);
    await vi.advanceTimersByTimeAsync(TICK_MS);
    expect(d.calls).toHaveLength(2);

    r.renewEvery(0, 0);
    await vi.advanceTimersByTimeAsync(10 * TICK_MS);
    expect(d.calls).toHaveLength(2);
  });

  it("a lease dropped is renewed no more, but a drop naming an earlier dispatch leaves the newer one held", async () => {
    const d = daemon("a");
    const { r } = renewals([d]);
    r.hold([
      { id: "i1", token: "t1" },
      { id: "i2", token: "t2" },
    ]);
    // i2 dispatched again to this agent, then the drop of its first dispatch arrives.
    r.hold([{ id: "i2", token: "t2-again" }]);
    r.drop([
      { id: "i1", token: "t1" },
      { id: "i2", token: "t2" },
    ]);
    r.renewEvery(TTL_MS, 0);
    await vi.advanceTimersByTimeAsync(TICK_MS);
    expect(d.calls).toEqual([[{ workItemId: "i2", leaseToken: "t2-again" }]]);
  });

  it("a lease the daemon calls lost is reported with its token and the daemon's words, and renewed no more", async () => {
    const d = daemon("a", (ls) => ls.map((l) => (l.workItemId === "gone" ? lost(l.workItemId) : held(l.workItemId))));
    const { r, posted } = renewals([d]);
    r.hold([
      { id: "gone", token: "tg" },
      { id: "kept", token: "tk" },
    ]);
    r.renewEvery(TTL_MS, 0);
    await vi.advanceTimersByTimeAsync(TICK_MS);
    expect(posted).toEqual([
      { type: "lost", leases: [{ id: "gone", token: "tg", message: "lease lost: held under another token" }] },
      { type: "renewed", leases: 1 },
    ]);
    await vi.advanceTimersByTimeAsync(TICK_MS);
    expect(d.calls[1]).toEqual([{ workItemId: "kept", leaseToken: "tk" }]);
  });

  it("a loss answered for an earlier dispatch of an item leaves its newer dispatch held", async () => {
    let answer!: (outcomes: Outcome[]) => void;
    const d: Daemon = { address: "a", extendLease: () => new Promise((resolve) => (answer = resolve)) };
    const { r, posted } = renewals([d]);
    r.hold([{ id: "i1", token: "old" }]);
    r.renewEvery(TTL_MS, 0);
    await vi.advanceTimersByTimeAsync(TICK_MS);
    // While the round is out, the item comes back to this agent under a new token.
    r.hold([{ id: "i1", token: "new" }]);
    answer([lost("i1")]);
    await vi.advanceTimersByTimeAsync(0);
    expect(posted).toEqual([{ type: "lost", leases: [{ id: "i1", token: "old", message: "lease lost: held under another token" }] }]);
    const next = daemon("a");
    d.extendLease = next.extendLease;
    await vi.advanceTimersByTimeAsync(TICK_MS);
    expect(next.calls).toEqual([[{ workItemId: "i1", leaseToken: "new" }]]);
  });

  it("a round that fails is reported and retried next tick: at the next daemon when transient, at the same one otherwise", async () => {
    const a = daemon("a", () => new ConnectError("connection refused", Code.Unavailable));
    const b = daemon("b", () => new ConnectError("token lacks the agent role", Code.PermissionDenied));
    const { r, posted } = renewals([a, b]);
    r.hold([{ id: "i1", token: "t1" }]);
    r.renewEvery(TTL_MS, 0);
    await vi.advanceTimersByTimeAsync(TICK_MS);
    await vi.advanceTimersByTimeAsync(TICK_MS);
    await vi.advanceTimersByTimeAsync(TICK_MS);
    expect([a.calls.length, b.calls.length]).toEqual([1, 2]);
    expect(posted).toEqual([
      { type: "renewalFailed", code: Code.Unavailable, message: "connection refused", address: "a", leases: 1 },
      { type: "renewalFailed", code: Code.PermissionDenied, message: "token lacks the agent role", address: "b", leases: 1 },
      { type: "renewalFailed", code: Code.PermissionDenied, message: "token lacks the agent role", address: "b", leases: 1 },
    ]);
  });

  it("starts at the daemon it is told, and a round still out when a tick comes is not overlapped", async () => {
    let answer!: (outcomes: Outcome[]) => void;
    const a = daemon("a");
    const b: Scripted = { address: "b", calls: [], extendLease: (ls) => (b.calls.push(ls), new Promise((resolve) => (answer = resolve))) };
    const { r } = renewals([a, b]);
    r.hold([{ id: "i1", token: "t1" }]);
    r.renewEvery(TTL_MS, 1);
    await vi.advanceTimersByTimeAsync(5 * TICK_MS);
    expect([a.calls.length, b.calls.length]).toEqual([0, 1]);
    answer([held("i1")]);
    await vi.advanceTimersByTimeAsync(0);
    // The next round is due at once: its tick passed while the round was out.
    expect(b.calls).toHaveLength(2);
  });

  it("more leases than the daemon's batch limit go in calls of at most that many", async () => {
    const d = daemon("a");
    const { r, posted } = renewals([d]);
    r.hold(Array.from({ length: MAX_BATCH + 1 }, (_, i) => ({ id: `i${i}`, token: `t${i}` })));
    r.renewEvery(TTL_MS, 0);
    await vi.advanceTimersByTimeAsync(TICK_MS);
    expect(d.calls.map((c) => c.length)).toEqual([MAX_BATCH, 1]);
    expect(posted).toEqual([{ type: "renewed", leases: MAX_BATCH + 1 }]);
  });
});
