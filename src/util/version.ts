/**
 * Compares dotted version strings numerically part by part (1.9.2 < 1.10.0); a non-numeric suffix
 * (1.2.0-rc1) sorts before the plain release. Returns <0, 0 or >0.
 */
export function compareVersions(a: string, b: string): number {
  const parse = (v: string) => {
    const [main = "", pre] = v.trim().replace(/^v/i, "").split("-", 2);
    return { parts: main.split(".").map((p) => Number.parseInt(p, 10) || 0), pre };
  };
  const x = parse(a);
  const y = parse(b);
  for (let i = 0; i < Math.max(x.parts.length, y.parts.length); i++) {
    const d = (x.parts[i] ?? 0) - (y.parts[i] ?? 0);
    if (d !== 0) return d;
  }
  if (x.pre === y.pre) return 0;
  if (x.pre === undefined) return 1;
  if (y.pre === undefined) return -1;
  return x.pre < y.pre ? -1 : 1;
}
