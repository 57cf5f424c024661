/**
 * docs/configuration.md is the settings table: its generated part is what scripts/config-doc.ts
 * prints from src/config/ now, and every flag `aiflowd --help` prints is on the page. A setting
 * added, removed or reworded without the page regenerated fails here, naming the command that
 * regenerates it.
 */
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { settingsHelp } from "../src/config.js";
import { AREAS, SETTINGS } from "../src/config/settings.js";
import { BEGIN, CONFIG_DOC, END, REGENERATE, renderConfigDoc } from "../scripts/config-doc.js";

const run = promisify(execFile);
const page = () => readFileSync(CONFIG_DOC, "utf8");

describe("docs/configuration.md", () => {
  it("is what scripts/config-doc.ts generates from the settings table", () => {
    const current = page();
    const expected = renderConfigDoc(current);
    if (current !== expected) {
      const a = current.split("\n");
      const b = expected.split("\n");
      const line = a.findIndex((l, i) => l !== b[i]);
      expect.fail(
        `docs/configuration.md is not what scripts/config-doc.ts generates from src/config/ (first difference at line ${line + 1}:\n` +
          `  page:      ${a[line] ?? "(end of file)"}\n  generated: ${b[line] ?? "(end of file)"})\n` +
          `run \`${REGENERATE}\` and commit docs/configuration.md`,
      );
    }
    expect(current.indexOf(BEGIN)).toBeLessThan(current.indexOf(END));
  });

  it("groups every setting under exactly one area", () => {
    const inAreas = AREAS.flatMap((a) => Object.values(a.settings).map((s) => s.flag));
    expect(inAreas.sort()).toEqual(
      Object.values(SETTINGS)
        .map((s) => s.flag)
        .sort(),
    );
    expect(new Set(inAreas).size).toBe(inAreas.length);
  });

  it("names every flag `aiflowd --help` prints, with its variables", async () => {
    const { stdout } = await run(process.execPath, ["bin/aiflowd.js", "--help"], { env: { PATH: process.env.PATH, NO_COLOR: "1" } });
    // The compiled daemon's help is the settings table's too (global setup builds it).
    expect(stdout).toContain(settingsHelp());
    const flags = [...new Set(stdout.match(/(?<![\w-])--[a-z0-9][a-z0-9-]*/g) ?? [])];
    expect(flags.length).toBeGreaterThan(80);
    const text = page();
    const missing = flags.filter((f) => !new RegExp("`" + f + "[` =]").test(text));
    expect(missing, `flags aiflowd --help prints that docs/configuration.md does not name: run \`${REGENERATE}\``).toEqual([]);
    const vars = [...new Set(stdout.match(/\b(?:AIFLOW_[A-Z0-9_]+|DATABASE_URL)\b/g) ?? [])];
    expect(vars.filter((v) => !text.includes("`" + v + "`"))).toEqual([]);
  });
});
