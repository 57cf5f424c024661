/**
 * docs/configuration.md's settings tables, printed from the settings table itself (src/config/), so
 * the page lists every setting `aiflowd --help` knows, with the same flag, variables, default and
 * meaning. The page's prose is kept as written; only the part between the two markers is made here.
 *
 *   npx tsx scripts/config-doc.ts           print the page as it should be
 *   npx tsx scripts/config-doc.ts --write   write it to docs/configuration.md
 *
 * test/docs-config.test.ts fails when the committed page differs from what this prints.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath, pathToFileURL } from "node:url";
import { AREAS } from "../src/config/settings.js";
import type { Setting } from "../src/config/parsers.js";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
export const CONFIG_DOC = fileURLToPath(new URL("../docs/configuration.md", import.meta.url));
export const REGENERATE = "npx tsx scripts/config-doc.ts --write";
export const BEGIN = `<!-- Generated from src/config/ by scripts/config-doc.ts: edit the settings there, then run \`${REGENERATE}\`. -->`;
export const END = "<!-- End of the generated settings. -->";

/** Where each area's settings are explained at length. */
const SEE: Record<string, string> = {
  Serving:
    "[transport security](operations.md#transport-security), [HTTP endpoints](observability.md#http-endpoints), [metrics](observability.md#metrics), [web console](operations.md#web-console)",
  Database: "[running it](operations.md#running-it), [schema and migrations](operations.md#schema-migrations-and-upgrades)",
  Instance: "[tokens and roles](security.md#tokens-and-roles), [logs and the audit stream](observability.md#logs-and-the-audit-stream)",
  Queue:
    "[the work queue](queue.md#the-work-queue), [agents](queue.md#agents-registration-heartbeats-liveness), [affinity](queue.md#affinity-bindings), [resources](queue.md#resources-and-concurrency-keys), [fair share](queue.md#fair-share-aging-and-rate-limits)",
  Engines: "[DAG runs](engines.md#dag-runs), [graph runs and state machines](engines.md#graph-runs-and-state-machines)",
  Intake: "[enqueue quotas](security.md#limits-against-exhaustion), [triggers](engines.md#triggers-webhooks-and-cron)",
  Limits: "[limits against exhaustion](security.md#limits-against-exhaustion)",
};

/** Text for a table cell: pipes escaped, and nothing Markdown would read as emphasis or HTML. */
const cell = (text: string) => text.replace(/\\/g, "\\\\").replace(/\|/g, "\\|").replace(/\*/g, "\\*").replace(/</g, "&lt;");

/** A default as the page shows it: a path inside this checkout (the console's) relative to it. */
function shownDefault(s: Setting<unknown>): string {
  if (s.default === undefined || s.default === "") return "—";
  const value = s.default.startsWith(ROOT) ? s.default.slice(ROOT.length) : s.default;
  return `\`${value}\``;
}

function flagOf(s: Setting<unknown>): string {
  if (s.switch) return `\`${s.flag}\` (a switch)`;
  if (s.repeatable) return `\`${s.flag} SPEC\` (repeatable)`;
  return `\`${s.flag} VALUE\``;
}

/** The generated part: a table per area, every setting of it in --help's order. */
export function settingsMarkdown(): string {
  const out: string[] = [];
  for (const area of AREAS) {
    out.push(`### ${area.name}`, "", `${area.about} See ${SEE[area.name] ?? "the topic pages"}.`, "");
    out.push("| flag | environment | default | meaning |", "|---|---|---|---|");
    for (const s of Object.values(area.settings)) {
      const env = s.env.map((e) => `\`${e}\``).join(", ");
      out.push(`| ${flagOf(s)} | ${env} | ${shownDefault(s)} | ${cell(s.help)} |`);
    }
    out.push("");
  }
  return out.join("\n");
}

/** The page `current` should be: its text with the part between the markers made afresh. */
export function renderConfigDoc(current: string): string {
  const begin = current.indexOf(BEGIN);
  const end = current.indexOf(END);
  if (begin < 0 || end < begin) throw new Error(`docs/configuration.md lacks the markers of its generated part:\n${BEGIN}\n${END}`);
  return `${current.slice(0, begin)}${BEGIN}\n\n${settingsMarkdown()}\n${current.slice(end)}`;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const page = renderConfigDoc(readFileSync(CONFIG_DOC, "utf8"));
  if (process.argv.includes("--write")) writeFileSync(CONFIG_DOC, page);
  else process.stdout.write(page);
}
