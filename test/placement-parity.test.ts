/**
 * The placement rule is written twice: in TypeScript (`fitsCapacity`, which the fleet's
 * "unplaceable" view asks: could this agent ever run this item?) and in PL/pgSQL (`place()`, which
 * the claim runs against what is free). On an agent with nothing running the two must agree, or
 * the view calls an item placeable that no claim will ever place (or the reverse). Random shapes,
 * as the validators let them in (../src/rpc/input/resources.ts), from a seeded PRNG: a failure
 * names its seed and case.
 */
import { describe, expect, it } from "vitest";
import type { TableName } from "../src/db/tables.js";
import { fitsCapacity, type Capacity, type Requirements } from "../src/domain/resources.js";
import { useTestDb } from "./support/kit.js";
import { mulberry32 } from "./support/prng.js";

const fx = useTestDb("placeparity");
const SEED = 20261207;
const CASES = 400;
const MODELS = ["A100-SXM4-80GB", "H100 80GB HBM3", "Tesla T4", "L4", ""];
const NEEDS = ["a100", "H100", "t4", "80GB", "V100"];
const MOUNTS = ["/", "/data", "/scratch"];

function shapes(rand: () => number): { c: Capacity; r: Requirements } {
  const int = (n: number) => Math.floor(rand() * n);
  const pick = <T>(xs: readonly T[]): T => xs[int(xs.length)]!;
  const some = (p: number) => rand() < p;
  const gpus = Array.from({ length: int(5) }, (_, index) => ({ index, model: pick(MODELS), memoryMb: pick([0, 1024, 16_384, 24_576, 81_920]) }));
  const disks = [...new Set(Array.from({ length: int(3) }, () => pick(MOUNTS)))].map((mount) => ({ mount, sizeMb: pick([0, 512, 10_240, 102_400]) }));
  const c: Capacity = { cpuMillis: pick([0, 1000, 4000, 16_000]), memoryMb: pick([0, 2048, 8192, 65_536]), gpus, disks };
  const r: Requirements = {};
  if (some(0.6)) {
    r.gpus = 1 + int(3);
    if (some(0.5)) r.gpuMemoryMb = pick([512, 16_384, 40_960, 81_920]);
    if (some(0.4)) r.gpuModel = pick(NEEDS);
  }
  if (some(0.5)) r.cpuMillis = pick([500, 2000, 8000, 32_000]);
  if (some(0.5)) r.memoryMb = pick([256, 4096, 16_384, 131_072]);
  if (some(0.4)) {
    r.diskMb = pick([100, 4096, 51_200]);
    if (some(0.5)) r.diskMount = pick(MOUNTS);
  }
  return { c, r };
}

describe("placement: TypeScript and SQL", () => {
  it(`agree on ${CASES} random agents and items, on an agent with nothing running`, async () => {
    const rand = mulberry32(SEED);
    const cases = Array.from({ length: CASES }, () => shapes(rand));
    // One statement for every case: place() of one item on the agent's whole capacity, free.
    const rows = await fx.db.raw<{ n: number; placed: boolean }>(
      `SELECT c.n::int AS n, EXISTS (
                SELECT 1 FROM ${fx.db.tables.qualified("place" as TableName)}(
                  ARRAY(SELECT (g ->> 'index')::int FROM jsonb_array_elements(c.cap -> 'gpus') g),
                  ARRAY(SELECT g ->> 'model' FROM jsonb_array_elements(c.cap -> 'gpus') g),
                  ARRAY(SELECT (g ->> 'memoryMb')::int8 FROM jsonb_array_elements(c.cap -> 'gpus') g),
                  ARRAY(SELECT (g ->> 'memoryMb')::int8 FROM jsonb_array_elements(c.cap -> 'gpus') g),
                  ARRAY(SELECT (g ->> 'memoryMb')::int8 FROM jsonb_array_elements(c.cap -> 'gpus') g),
                  ARRAY(SELECT d ->> 'mount' FROM jsonb_array_elements(c.cap -> 'disks') d),
                  ARRAY(SELECT (d ->> 'sizeMb')::int8 FROM jsonb_array_elements(c.cap -> 'disks') d),
                  (c.cap ->> 'cpuMillis')::int8, (c.cap ->> 'memoryMb')::int8,
                  jsonb_build_array(jsonb_build_object('id', 'x', 'r', c.req)))) AS placed
         FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS e(v, n), LATERAL (SELECT e.n, e.v -> 'c' AS cap, e.v -> 'r' AS req) c
        ORDER BY c.n`,
      [JSON.stringify(cases)],
    );
    const disagree = rows
      .map(({ n, placed }) => ({ n, sql: placed, ts: fitsCapacity(cases[n - 1]!.c, cases[n - 1]!.r), ...cases[n - 1]! }))
      .filter((x) => x.sql !== x.ts);
    expect(disagree.slice(0, 3), `seed ${SEED}: ${disagree.length} of ${CASES} cases disagree`).toEqual([]);
    // The cases are not all one answer: both outcomes are exercised.
    const fits = rows.filter((r) => r.placed).length;
    expect(fits).toBeGreaterThan(CASES / 10);
    expect(fits).toBeLessThan(CASES - CASES / 10);
  });
});
