/**
 * Agent versions as semantic versions, for the drain selector's `version_below`.
 *
 * Only what reads as a version is compared: MAJOR[.MINOR[.PATCH]] with missing parts 0 (so `1.10`
 * means 1.10.0), an optional leading `v`, an optional `-prerelease` and `+build`. Anything else
 * (`sim-1.1.0`, `latest`, `1.x`) is not a version: parseVersion answers null, and callers must
 * refuse it or leave it out, never guess. (An earlier parser read `sim-1.1.0` as 0.0.0 with a
 * prerelease, so `--version-below sim-1.1.0` drained every agent at `example-1.0.0`.)
 */

export interface Version {
  parts: readonly [number, number, number];
  /** Dot-separated prerelease identifiers; empty for a release. */
  pre: readonly string[];
}

const VERSION = /^v?(0|[1-9]\d*)(?:\.(0|[1-9]\d*))?(?:\.(0|[1-9]\d*))?(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$/;

/** The version `text` reads as, or null when it is not one (see above). Surrounding spaces are ignored. */
export function parseVersion(text: string): Version | null {
  const m = VERSION.exec(text.trim());
  if (!m) return null;
  const parts = [m[1], m[2], m[3]].map((p) => (p === undefined ? 0 : Number(p)));
  // Past 2^53 numbers stop being exact, and no real version gets there.
  if (!parts.every(Number.isSafeInteger)) return null;
  return { parts: parts as [number, number, number], pre: m[4] === undefined ? [] : m[4].split(".") };
}

/**
 * Why `text` cannot be a version selector, in the words the daemon refuses it with (the console says
 * the same before it asks).
 */
export const notAVersion = (text: string): string =>
  `'${text}' is not a version: give MAJOR[.MINOR[.PATCH]] with an optional -prerelease (1.10.0, v2, 2.0.0-rc.1); agents whose own version is not one are never matched by version_below`;

/** Semantic-version order (semver.org §11): <0, 0 or >0. Build metadata does not count. */
export function compareVersions(x: Version, y: Version): number {
  for (let i = 0; i < 3; i++) if (x.parts[i] !== y.parts[i]) return x.parts[i]! - y.parts[i]!;
  // A prerelease sorts before its release.
  if (x.pre.length === 0 || y.pre.length === 0) return y.pre.length - x.pre.length;
  for (let i = 0; i < Math.min(x.pre.length, y.pre.length); i++) {
    const d = comparePre(x.pre[i]!, y.pre[i]!);
    if (d !== 0) return d;
  }
  return x.pre.length - y.pre.length;
}

const NUMERIC = /^\d+$/;

/** Numeric identifiers compare as numbers and sort before alphanumeric ones, which compare in ASCII order. */
function comparePre(a: string, b: string): number {
  const an = NUMERIC.test(a);
  const bn = NUMERIC.test(b);
  if (an && bn) {
    // As numbers of any length: leading zeros dropped, then a longer one is larger.
    const [x, y] = [a.replace(/^0+(?=\d)/, ""), b.replace(/^0+(?=\d)/, "")];
    return x.length !== y.length ? x.length - y.length : x < y ? -1 : x > y ? 1 : 0;
  }
  if (an !== bn) return an ? -1 : 1;
  return a < b ? -1 : a > b ? 1 : 0;
}
