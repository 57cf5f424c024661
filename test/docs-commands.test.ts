/**
 * The shell blocks the README and docs/ mark ```sh runnable``` run, and pass: what they tell a reader
 * to type works against this build. Plain ```sh``` blocks are examples and are not run.
 *
 * Each block runs under `bash -euo pipefail` in a temporary directory that links the repository's
 * top-level entries (so `bin/`, `demo/` and `agent-sdk/` are where a block run from the repository
 * root expects them, and what it writes stays out of the checkout), against the built `bin/` (global
 * setup builds it) and the test Postgres: `DATABASE_URL`, a schema of its own in `AIFLOW_SCHEMA`,
 * dropped after. The daemon's documented addresses, 127.0.0.1:7400 (gRPC) and 127.0.0.1:9464
 * (HTTP), become free ports, in the block's text and in AIFLOW_LISTEN, AIFLOW_HTTP_LISTEN and
 * AIFLOW_ADDRESS, so a block that starts a daemon with its defaults and calls it at those addresses
 * runs beside anything else. Whatever a block leaves running in the background (a daemon, a worker)
 * is stopped after it: the block runs as a process group, sent SIGTERM and then SIGKILL.
 */
import { spawn } from "node:child_process";
import { readdirSync, readFileSync, symlinkSync, existsSync } from "node:fs";
import path from "node:path";
import pg from "pg";
import { describe, expect, inject, it } from "vitest";
import { uniqueSchema } from "./support/db.js";
import { freePort } from "./support/free-port.js";
import { makeTempDir, removeTempDir } from "./support/temp-dir.js";

const ROOT = path.resolve(import.meta.dirname, "..");
const BLOCK_TIMEOUT_MS = 90_000;

interface Block {
  file: string;
  line: number;
  text: string;
}

/** The README and every page of docs/. */
function pages(): string[] {
  const docs = readdirSync(path.join(ROOT, "docs"))
    .filter((f) => f.endsWith(".md"))
    .map((f) => `docs/${f}`);
  return ["README.md", ...docs.sort()];
}

/** Every ```sh runnable block of a page, with the line its fence opens on. */
function runnableBlocks(file: string, text: string): Block[] {
  const blocks: Block[] = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const open = /^(`{3,})(\S*)\s*(.*)$/.exec(lines[i]!);
    if (!open) continue;
    const fence = open[1]!;
    const end = lines.findIndex((l, j) => j > i && l.startsWith(fence) && l.trim() === fence);
    if (end < 0) throw new Error(`${file}:${i + 1}: a code block that is never closed`);
    if (open[2] === "sh" && open[3]!.split(/\s+/).includes("runnable")) blocks.push({ file, line: i + 1, text: lines.slice(i + 1, end).join("\n") });
    i = end;
  }
  return blocks;
}

interface Outcome {
  code: number | null;
  signal: NodeJS.Signals | null;
  output: string;
  timedOut: boolean;
}

/** Runs `script` as a process group; resolves when bash exits, leaving its background jobs running. */
function runGroup(script: string, cwd: string, env: NodeJS.ProcessEnv): { done: Promise<Outcome>; pid: number } {
  const child = spawn("bash", ["-euo", "pipefail", "-c", script], { cwd, env, detached: true, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  child.stdout.on("data", (d: Buffer) => (output += d.toString()));
  child.stderr.on("data", (d: Buffer) => (output += d.toString()));
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    signalGroup(child.pid!, "SIGKILL");
  }, BLOCK_TIMEOUT_MS);
  const done = new Promise<Outcome>((resolve) =>
    child.on("exit", (code, signal) => {
      clearTimeout(timer);
      // Give the pipes a moment to deliver what bash wrote last (background jobs may hold them open).
      setTimeout(() => resolve({ code, signal, output, timedOut }), 100);
    }),
  );
  return { done, pid: child.pid! };
}

function signalGroup(pid: number, signal: NodeJS.Signals | 0): boolean {
  try {
    process.kill(-pid, signal);
    return true;
  } catch {
    return false;
  }
}

/** Stops what the block left running: SIGTERM to its group, SIGKILL to whatever is left after 15 s. */
async function stopGroup(pid: number): Promise<void> {
  if (!signalGroup(pid, "SIGTERM")) return;
  for (let waited = 0; waited < 15_000; waited += 100) {
    await new Promise((r) => setTimeout(r, 100));
    if (!signalGroup(pid, 0)) return;
  }
  signalGroup(pid, "SIGKILL");
}

/** The block's logs (a block that backgrounds a daemon writes them under .tmp/), for a failure's message. */
function logsOf(dir: string): string {
  const out: string[] = [];
  for (const sub of [".", ".tmp"]) {
    const d = path.join(dir, sub);
    if (!existsSync(d)) continue;
    for (const f of readdirSync(d).filter((n) => n.endsWith(".log")))
      out.push(`--- ${sub}/${f} (last 40 lines)\n${readFileSync(path.join(d, f), "utf8").split("\n").slice(-40).join("\n")}`);
  }
  return out.join("\n");
}

async function runBlock(block: Block): Promise<void> {
  const dir = await makeTempDir("aiflowd-docs");
  for (const entry of readdirSync(ROOT)) if (!entry.startsWith(".")) symlinkSync(path.join(ROOT, entry), path.join(dir, entry));
  const [grpc, http] = [await freePort(), await freePort()];
  const schema = uniqueSchema("docs");
  const url = inject("databaseUrl");
  const env: NodeJS.ProcessEnv = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("AIFLOW_") && !k.startsWith("OTEL_")));
  Object.assign(env, {
    DATABASE_URL: url,
    AIFLOW_SCHEMA: schema,
    AIFLOW_LISTEN: `127.0.0.1:${grpc}`,
    AIFLOW_HTTP_LISTEN: `127.0.0.1:${http}`,
    AIFLOW_ADDRESS: `127.0.0.1:${grpc}`,
    AIFLOW_DATA_DIR: path.join(dir, "pg"),
    NO_COLOR: "1",
  });
  const script = block.text.replaceAll("127.0.0.1:7400", `127.0.0.1:${grpc}`).replaceAll("127.0.0.1:9464", `127.0.0.1:${http}`);
  const { done, pid } = runGroup(script, dir, env);
  try {
    const outcome = await done;
    await stopGroup(pid);
    if (outcome.code !== 0 || outcome.timedOut)
      expect.fail(
        `${block.file}:${block.line}: the runnable block ${outcome.timedOut ? `did not finish within ${BLOCK_TIMEOUT_MS / 1000} s` : `exited ${outcome.code ?? outcome.signal}`}\n` +
          `--- output\n${outcome.output}\n${logsOf(dir)}`,
      );
  } finally {
    await stopGroup(pid);
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    try {
      await c.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    } finally {
      await c.end();
    }
    await removeTempDir(dir);
  }
}

const blocks = pages().flatMap((file) => runnableBlocks(file, readFileSync(path.join(ROOT, file), "utf8")));

describe("runnable shell blocks of the README and docs/", () => {
  it("finds them: the README's tour and those of docs/", () => {
    expect(blocks.some((b) => b.file === "README.md" && b.text.includes("run start"))).toBe(true);
    expect(blocks.filter((b) => b.file.startsWith("docs/")).length).toBeGreaterThanOrEqual(3);
  });

  for (const block of blocks) it(`${block.file}:${block.line}`, () => runBlock(block), BLOCK_TIMEOUT_MS + 30_000);
});
