/**
 * Every relative link of the README, docs/ and the SDKs' READMEs resolves: the file it names
 * exists, and an anchor names a heading of that page (GitHub's anchors: lower case, punctuation
 * dropped, spaces as hyphens, a repeated heading numbered). A section moved or renamed without its
 * links following fails here, naming the page, the line and the link.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import path from "node:path";
import { expect, it } from "vitest";

const ROOT = path.resolve(import.meta.dirname, "..");

function pages(): string[] {
  const docs = readdirSync(path.join(ROOT, "docs"), { recursive: true, encoding: "utf8" })
    .filter((f) => f.endsWith(".md"))
    .map((f) => `docs/${f}`);
  return ["README.md", "agent-sdk/README.md", "agent-sdk/python/README.md", ...docs.sort()];
}

/** The page without its fenced code blocks (their lines kept blank, so line numbers hold). */
function prose(text: string): string[] {
  let fence: string | null = null;
  return text.split("\n").map((line) => {
    const m = /^(`{3,}|~{3,})/.exec(line);
    if (fence === null && m) {
      fence = m[1]!;
      return "";
    }
    if (fence !== null) {
      if (line.trim() === fence) fence = null;
      return "";
    }
    return line;
  });
}

/** GitHub's anchor for a heading's text. */
function slug(heading: string): string {
  const text = heading
    .replace(/\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/[`*_]{1,2}([^`*_]+)[`*_]{1,2}/g, "$1")
    .trim()
    .toLowerCase();
  return text.replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, "").replace(/ /g, "-");
}

const anchorsCache = new Map<string, Set<string>>();
function anchorsOf(file: string): Set<string> {
  let anchors = anchorsCache.get(file);
  if (anchors) return anchors;
  anchors = new Set();
  const seen = new Map<string, number>();
  for (const line of prose(readFileSync(file, "utf8"))) {
    const m = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const base = slug(m[1]!);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  anchorsCache.set(file, anchors);
  return anchors;
}

it("resolves every relative link and anchor of the README, docs/ and the SDKs' READMEs", () => {
  const broken: string[] = [];
  let checked = 0;
  for (const page of pages()) {
    const abs = path.join(ROOT, page);
    prose(readFileSync(abs, "utf8")).forEach((line, i) => {
      const withoutCode = line.replace(/`[^`]*`/g, "");
      for (const m of withoutCode.matchAll(/\]\(([^)\s]*)(?:\s+"[^"]*")?\)/g)) {
        const target = m[1]!;
        if (target === "") {
          broken.push(`${page}:${i + 1}: an empty link`);
          continue;
        }
        if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue;
        checked++;
        const [file, anchor] = target.split("#", 2) as [string, string | undefined];
        const resolved = file === "" ? abs : path.resolve(path.dirname(abs), decodeURIComponent(file));
        const where = `${page}:${i + 1}: (${target})`;
        if (!resolved.startsWith(ROOT) || !existsSync(resolved)) {
          broken.push(`${where}: no such file`);
          continue;
        }
        if (anchor === undefined || anchor === "") continue;
        if (statSync(resolved).isDirectory() || !resolved.endsWith(".md")) {
          broken.push(`${where}: an anchor into something that is not a Markdown page`);
          continue;
        }
        if (!anchorsOf(resolved).has(anchor)) broken.push(`${where}: ${path.relative(ROOT, resolved)} has no heading #${anchor}`);
      }
    });
  }
  expect(checked).toBeGreaterThan(100);
  expect(broken).toEqual([]);
});
