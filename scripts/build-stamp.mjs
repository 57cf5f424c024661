/**
 * Whether dist/ is the build of the sources as they are now, without building: `scripts/build.mjs
 * daemon` writes OUT/.build-stamp when it finishes, a fingerprint of every file the build reads (the
 * path, size and modification time of each, so an edit, a new file, a deleted one, a rename or a
 * checkout all change it), and the test setup rebuilds only when the fingerprint it computes now
 * differs. A failed build leaves no stamp, so the next run builds again.
 *
 * The fingerprint takes a few milliseconds; even an incremental build with nothing to do takes
 * several seconds (tsc twice, then Vite for the console).
 */
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { join, relative, sep } from "node:path";

/** What `scripts/build.mjs daemon` reads, relative to the repository root: folders are walked. */
export const DAEMON_INPUTS = [
  "src",
  "wire/src",
  "wire/package.json",
  "wire/tsconfig.build.json",
  "console",
  "tsconfig.json",
  "tsconfig.build.json",
  "package-lock.json",
  "scripts/build.mjs",
  "scripts/build-stamp.mjs",
];

/** Files of the build that must be there for a stamp to count (a stamp outlives a hand-deleted file). */
const OUTPUTS = ["cli/aiflowd.js", "cli/aiflowctl.js", "console/index.html", "wire/codec/index.js"];

const STAMP = ".build-stamp";

/** The fingerprint of `inputs` under `root`: a hex digest over each file's path, size and mtime. */
export function fingerprint(root, inputs = DAEMON_INPUTS) {
  const hash = createHash("sha256");
  const visit = (path) => {
    let st;
    try {
      st = statSync(path);
    } catch {
      hash.update(`missing ${relative(root, path)}\n`);
      return;
    }
    if (st.isDirectory()) {
      for (const name of readdirSync(path).sort()) if (name !== "node_modules") visit(join(path, name));
    } else {
      hash.update(`${relative(root, path).split(sep).join("/")} ${st.size} ${st.mtimeMs}\n`);
    }
  };
  for (const input of inputs) visit(join(root, input));
  return hash.digest("hex");
}

/** Forgets that `out` is current (before a build that may not finish). */
export function clearStamp(out) {
  rmSync(join(out, STAMP), { force: true });
}

/** Records that `out` is the build of sources whose fingerprint was `print`. */
export function writeStamp(out, print) {
  writeFileSync(join(out, STAMP), `${print}\n`);
}

/** True when `out` holds a finished build of the sources under `root` as they are now. */
export function isCurrent(root, out) {
  const file = join(out, STAMP);
  if (!existsSync(file)) return false;
  if (!OUTPUTS.every((f) => existsSync(join(out, f)))) return false;
  return readFileSync(file, "utf8").trim() === fingerprint(root);
}
