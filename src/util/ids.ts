/**
 * ULIDs for rows this process creates in bulk. A monotonic factory draws randomness once per
 * millisecond and increments after that, so ids ascend in creation order also within one millisecond
 * (items of equal priority and createdon are dispatched by id: this keeps a priority first-in-first-
 * out), and a batch of ids costs almost nothing (a plain ulid() draws 16 random characters each).
 *
 * The randomness comes from a pool refilled by one crypto.randomFillSync call per 1,024 draws:
 * ulid's own generator makes a crypto call per character, 16 per millisecond that has an id, which
 * was a visible share of a busy daemon's time.
 */
import { randomFillSync } from "node:crypto";
import { monotonicFactory } from "ulid";

const pool = new Uint32Array(1024);
let next = pool.length;

/** A uniform draw in [0, 1) from cryptographic randomness. */
function draw(): number {
  if (next === pool.length) {
    randomFillSync(pool);
    next = 0;
  }
  return pool[next++]! / 0x1_0000_0000;
}

export const newId = monotonicFactory(draw);
