/**
 * Statements built once per shape (src/db/statement-shapes.ts): later calls reuse the text and bind
 * their own values in the recorded positions, against a real Postgres; a build that would freeze a
 * parameter into the text or the values is refused at the first call.
 */
import { sql } from "slonik";
import { afterAll, beforeAll, expect, it } from "vitest";
import { z } from "zod";
import { PreparedQueries } from "../src/db/prepared.js";
import { StatementShapes } from "../src/db/statement-shapes.js";
import { tsAt, tsSeconds } from "../src/db/values.js";
import { databaseUrl } from "./support/database-url.js";

let hot: PreparedQueries;
beforeAll(() => {
  hot = new PreparedQueries(databaseUrl(), 1);
});
afterAll(async () => {
  await hot?.end();
});

const row = z.object({ name: z.string(), n: z.string(), ids: z.array(z.string()), at: z.number(), flag: z.boolean(), k: z.string() });

it("builds a shape once and binds each call's values where its markers were, repeated and array parameters included", async () => {
  const shapes = new StatementShapes();
  let builds = 0;
  const run = (name: string, n: bigint, ids: string[], atMs: number, flag: boolean, limit: number) =>
    hot.any(
      shapes.token(`probe:${limit}`, { name, n, ids, at: tsSeconds(atMs), flag }, (p) => {
        builds++;
        return sql.type(row)`
          SELECT ${p.name}::text || '/' || ${p.name}::text AS name, (${p.n}::int8 + 1)::text AS n, ${sql.array(p.ids, "text")} AS ids,
                 (extract(epoch FROM ${tsAt(p.at)}) * 1000)::float8 AS at, ${p.flag}::bool AS flag, ${"constant"}::text AS k
           LIMIT ${sql.literalValue(String(limit))}`;
      }),
    );
  expect(await run("a", 1n, ["x", "y"], 1_700_000_000_123, true, 1)).toEqual([
    { name: "a/a", n: "2", ids: ["x", "y"], at: 1_700_000_000_123, flag: true, k: "constant" },
  ]);
  expect(await run("b", 41n, [], 1_800_000_000_000, false, 1)).toEqual([{ name: "b/b", n: "42", ids: [], at: 1_800_000_000_000, flag: false, k: "constant" }]);
  expect(builds).toBe(1);
  // Another key is another shape.
  expect(await run("c", 0n, ["z"], 0, true, 2)).toEqual([{ name: "c/c", n: "1", ids: ["z"], at: 0, flag: true, k: "constant" }]);
  expect(builds).toBe(2);
  expect(shapes.size).toBe(2);
});

it("refuses a build that uses a parameter in an expression, or binds one nowhere", () => {
  const shapes = new StatementShapes();
  expect(() => shapes.token("concat", { a: "x" }, (p) => sql.unsafe`SELECT ${`${p.a}!`}`)).toThrow(/parameter was used in an expression/);
  expect(() => shapes.token("arith", { n: 1 }, (p) => sql.unsafe`SELECT ${Number(p.n) + 1}`)).toThrow(/parameter was used in an expression/);
  expect(() => shapes.token("array", { ids: ["a"] }, (p) => sql.unsafe`SELECT ${sql.array([...p.ids, "b"], "text")}`)).toThrow(
    /parameter was used in an expression/,
  );
  expect(() => shapes.token("unused", { a: "x", b: "y" }, (p) => sql.unsafe`SELECT ${p.a}`)).toThrow(/parameters b are bound nowhere/);
  // A refused build records nothing: the same key builds again (and fails again) rather than running wrong.
  expect(() => shapes.token("unused", { a: "x", b: "y" }, (p) => sql.unsafe`SELECT ${p.a}`)).toThrow(/bound nowhere/);
  expect(shapes.size).toBe(0);
});
