/**
 * Every test file is in exactly one tier (test/tiers.ts, vitest.config.ts): a file outside the
 * tiers' roots would never run, an entry of the slow list that names no file is a file renamed or
 * gone, and a file that starts processes belongs to the slow tier (the fast one builds no dist/, and
 * is what a developer runs after every change).
 */
import { readdirSync, readFileSync } from "node:fs";
import { join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import config from "../vitest.config.js";
import { ALL_TESTS, SLOW, TEST_ROOTS } from "./tiers.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const SKIP = new Set(["node_modules", ".git", ".tmp", "dist", "build", "__pycache__"]);

/** Every *.test.ts of the repository, relative to its root, with / between folders. */
function testFiles(dir = ROOT): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((d) => {
    if (SKIP.has(d.name)) return [];
    const path = join(dir, d.name);
    if (d.isDirectory()) return testFiles(path);
    return d.name.endsWith(".test.ts") ? [relative(ROOT, path).split(sep).join("/")] : [];
  });
}

const all = testFiles();
const slow = new Set(Object.keys(SLOW));
const fast = all.filter((f) => !slow.has(f));

/** What in a file's text starts a process, or runs what the build made. */
const STARTS_PROCESSES = /node:child_process|playwright|python-agent|daemon-process|worker-process|bench\/proc|bin\/aiflow|\bdist\//;

describe("test tiers", () => {
  it("every test file lies under a tier's root", () => {
    expect(all.filter((f) => !TEST_ROOTS.some((root) => f.startsWith(`${root}/`)))).toEqual([]);
  });

  it("every file of the slow list is a test file", () => {
    expect([...slow].filter((f) => !all.includes(f))).toEqual([]);
  });

  it("vitest's projects are the two tiers: fast is every test file but the slow list, slow is the list", () => {
    const projects = (config.test?.projects ?? []) as { test: { name: string; include: string[]; exclude?: string[] } }[];
    expect(projects.map((p) => p.test.name)).toEqual(["fast", "slow"]);
    const [f, s] = projects.map((p) => p.test);
    expect(f!.include).toEqual(ALL_TESTS);
    expect(f!.exclude).toEqual(expect.arrayContaining([...slow]));
    expect([...s!.include].sort()).toEqual([...slow].sort());
  });

  it("no fast file starts a process or runs dist/", () => {
    const self = relative(ROOT, fileURLToPath(import.meta.url))
      .split(sep)
      .join("/");
    const starting = fast.filter((f) => f !== self && STARTS_PROCESSES.test(readFileSync(join(ROOT, f), "utf8")));
    expect(starting, "move these to the slow list in test/tiers.ts").toEqual([]);
  });

  it("both tiers have files", () => {
    expect(fast.length).toBeGreaterThan(0);
    expect(slow.size).toBeGreaterThan(0);
  });
});
