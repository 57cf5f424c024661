/**
 * The slow tier's global setup: builds the daemon (scripts/build.mjs daemon, incremental), because
 * its tests that run `bin/aiflowd.js` and `bin/aiflowctl.js` as operators do, and the console's,
 * run the compiled JavaScript in dist/ — but only when dist/ is not the build of the sources as they
 * are now (dist/.build-stamp, scripts/build-stamp.mjs): a build with nothing to do still takes
 * several seconds, and most runs change no source. The fast tier runs nothing from dist/ (its files
 * start no process: test/tiers.test.ts checks), so it does not build at all.
 */
import { execFileSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { isCurrent } from "../../scripts/build-stamp.mjs";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));

export default function setup(): void {
  if (isCurrent(ROOT, `${ROOT}dist`)) return;
  try {
    execFileSync(process.execPath, [`${ROOT}scripts/build.mjs`, "daemon"], { stdio: ["ignore", "ignore", "inherit"] });
  } catch {
    // tsc still emits what it can; the type errors it printed fail `npm run typecheck` (and CI).
    // Such a build leaves no stamp, so the next run builds again.
    process.stderr.write("build setup: the daemon's build reported errors (above); tests run what it emitted\n");
  }
}
