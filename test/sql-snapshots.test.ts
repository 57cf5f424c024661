/**
 * The printed SQL under docs/sql/ stays what runs (issue 53 part 4): the current body of every SQL
 * function and trigger (which otherwise sits in whichever forward-only migration touched it last),
 * and the claim and enqueue statements the store builds, in each shape. All are regenerated from a
 * freshly migrated schema (test/support/sql-docs.ts) and compared with the committed files; with
 * UPDATE_SQL_DOCS=1 the files are rewritten instead.
 */
import { mkdirSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, expect, it } from "vitest";
import { createTestDb, type TestDb } from "./support/db.js";
import { PRINTED_BY, readCommitted, serverMajor, SQL_DOCS_DIR, sqlDocs, UPDATE_HINT } from "./support/sql-docs.js";

let db: TestDb;
beforeAll(async () => {
  db = await createTestDb({ label: "sqldocs" });
});
afterAll(async () => {
  await db?.drop();
});

/** The first line where two texts differ, for a message a reader can act on. */
function firstDifference(committed: string, current: string): string {
  const a = committed.split("\n");
  const b = current.split("\n");
  for (let i = 0; i < Math.max(a.length, b.length); i++)
    if (a[i] !== b[i]) return `line ${i + 1}:\n  committed: ${a[i] ?? "(end of file)"}\n  current:   ${b[i] ?? "(end of file)"}`;
  return "no line differs";
}

it("docs/sql/ holds the SQL functions and the claim and enqueue statements as they are now", async () => {
  const docs = await sqlDocs(db);
  const dir = fileURLToPath(SQL_DOCS_DIR);
  const committedFiles = readdirSync(dir).filter((f) => f.endsWith(".sql"));
  if (process.env.UPDATE_SQL_DOCS === "1") {
    mkdirSync(dir, { recursive: true });
    for (const f of committedFiles) if (!docs.has(f)) rmSync(dir + f);
    for (const [file, text] of docs) writeFileSync(dir + file, text);
    return;
  }
  // Postgres prints a function's definition its own way per major version: functions.sql is compared
  // on the major that printed it (its header says which); the statements, our own text, always.
  const committedFunctions = readCommitted("functions.sql");
  const printedOn = Number(committedFunctions?.match(new RegExp(`${PRINTED_BY}(\\d+)`))?.[1]);
  if (committedFunctions !== null && printedOn !== (await serverMajor(db))) docs.delete("functions.sql");
  const problems: string[] = [];
  for (const f of committedFiles) if (!docs.has(f) && f !== "functions.sql") problems.push(`docs/sql/${f} is no longer generated`);
  for (const [file, text] of docs) {
    const committed = readCommitted(file);
    if (committed === null) problems.push(`docs/sql/${file} is missing`);
    else if (committed !== text) problems.push(`docs/sql/${file} differs from what the code builds now, first at ${firstDifference(committed, text)}`);
  }
  expect(problems, `${problems.join("\n")}\nIf the change is meant, rewrite the files with\n  ${UPDATE_HINT}\nand commit them with the change.`).toEqual([]);
});
