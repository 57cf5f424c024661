/** The daemon's ULIDs: valid, unique, ascending in creation order, and dated now. */
import { decodeTime } from "ulid";
import { describe, expect, it } from "vitest";
import { newId } from "../src/util/ids.js";

describe("newId", () => {
  it("makes valid, unique ULIDs that ascend in creation order across and within milliseconds", () => {
    const now = Date.now();
    // More than the randomness pool holds, over many milliseconds (each draws fresh randomness).
    const ids = Array.from({ length: 5_000 }, (_, i) => newId(now + Math.floor(i / 3)));
    expect(ids.every((id) => /^[0-9A-HJKMNP-TV-Z]{26}$/.test(id))).toBe(true);
    expect(new Set(ids).size).toBe(ids.length);
    expect([...ids].sort()).toEqual(ids);
    expect(decodeTime(ids[0]!)).toBe(now);
    // The random part is not constant: ids of different milliseconds differ beyond their time.
    expect(new Set(ids.filter((_, i) => i % 3 === 0).map((id) => id.slice(10))).size).toBeGreaterThan(1_600);
  });
});
