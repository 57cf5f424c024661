/** aiflowctl --json: an ISO 8601 companion beside each epoch-nanosecond time (src/cli/ctl/json-times.ts). */
import { describe, expect, it } from "vitest";
import { isoKeyOf, withIsoTimes } from "../src/cli/ctl/json-times.js";

describe("ISO times beside epoch nanoseconds", () => {
  it("names the companion of each epoch-nanosecond key, and of no other", () => {
    expect(["dispatchedAtNs", "leaseExpiresAtNs", "endedOn", "firedOn", "createdOn", "waitNs", "retryCount"].map(isoKeyOf)).toEqual([
      "dispatchedAt",
      "leaseExpiresAt",
      "endedAt",
      "firedAt",
      undefined,
      undefined,
      undefined,
    ]);
  });

  it("adds them at any depth, null for an unset time, and keeps every key and value it had", () => {
    const ns = String(BigInt(Date.UTC(2026, 11, 7, 12, 30, 1, 250)) * 1_000_000n + 17n);
    const reply = { items: [{ id: "a", dispatchedAtNs: ns, completedAtNs: "0", createdOn: "2026-12-07T12:30:00Z" }], run: { endedOn: ns }, count: "3" };
    expect(withIsoTimes(reply)).toEqual({
      items: [
        { id: "a", dispatchedAtNs: ns, dispatchedAt: "2026-12-07T12:30:01.250Z", completedAtNs: "0", completedAt: null, createdOn: "2026-12-07T12:30:00Z" },
      ],
      run: { endedOn: ns, endedAt: "2026-12-07T12:30:01.250Z" },
      count: "3",
    });
  });

  it("leaves a key alone when the reply already has its companion, or its value is not a time", () => {
    expect(withIsoTimes({ firedOn: "5000000000", firedAt: "kept" })).toEqual({ firedOn: "5000000000", firedAt: "kept" });
    expect(withIsoTimes({ endedOn: null })).toEqual({ endedOn: null });
  });
});
