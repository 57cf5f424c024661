/**
 * mulberry32: a small seeded PRNG (32-bit state, full period), so that a seed replays the same
 * choices — a chaos run's fault schedule, a fuzz case, a property test's inputs. Not for secrets.
 */
export function mulberry32(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
