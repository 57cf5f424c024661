// Prints vitest's JSON report as the plain closing line CI reads: "N passed, N failed[, N skipped]".
import { readFileSync } from "node:fs";

const file = process.argv[2] ?? ".tmp/vitest.json";
let report;
try {
  report = JSON.parse(readFileSync(file, "utf8"));
} catch (err) {
  console.log(`no test report at ${file}: ${err.message}`);
  console.log("0 passed, 1 failed");
  process.exit(0);
}
const skipped = (report.numPendingTests ?? 0) + (report.numTodoTests ?? 0);
// A file that failed to load counts as a failure even though it ran no test.
const brokenFiles = (report.testResults ?? []).filter((r) => r.status === "failed" && (r.assertionResults ?? []).length === 0).length;
const line = `${report.numPassedTests} passed, ${report.numFailedTests + brokenFiles} failed`;
console.log(skipped > 0 ? `${line}, ${skipped} skipped` : line);
