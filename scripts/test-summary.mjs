// Prints vitest's JSON reports as the plain closing line CI reads: "N passed, N failed",
// summed over every report named (.ci/run names one per tier: the fast one and the slow one).
import { readFileSync } from "node:fs";

const files = process.argv.length > 2 ? process.argv.slice(2) : [".tmp/vitest.json"];
let passed = 0;
let failed = 0;
let skipped = 0;
for (const file of files) {
  let report;
  try {
    report = JSON.parse(readFileSync(file, "utf8"));
  } catch (err) {
    // A tier that wrote no report (vitest did not start, or died) counts as one failure.
    console.log(`no test report at ${file}: ${err.message}`);
    failed += 1;
    continue;
  }
  skipped += (report.numPendingTests ?? 0) + (report.numTodoTests ?? 0);
  // A file that failed with no failed test counts as one failure: it failed to load, or a hook
  // failed (a beforeAll's failure leaves the file's tests skipped, not failed).
  const brokenFiles = (report.testResults ?? []).filter((r) => r.status === "failed" && !(r.assertionResults ?? []).some((a) => a.status === "failed")).length;
  passed += report.numPassedTests ?? 0;
  failed += (report.numFailedTests ?? 0) + brokenFiles;
}
// Skipped tests are said on a line of their own: the last line is exactly "N passed, N failed".
if (skipped > 0) console.log(`${skipped} skipped`);
console.log(`${passed} passed, ${failed} failed`);
