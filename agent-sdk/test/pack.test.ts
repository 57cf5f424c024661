/**
 * The SDK as a worker binary outside this repository gets it: `npm pack` (whose prepack builds it),
 * the tarball unpacked into a scratch project's node_modules as npm installs it, and a worker in
 * plain JavaScript importing it by name and running on plain `node`, without a TypeScript loader.
 * The scratch project lives outside the repository and gets only the dependencies the packed
 * manifest declares (linked from this repository's node_modules, so no registry is needed): a file
 * the tarball lacks, or an undeclared dependency, fails the worker.
 */
import { execFile, spawn } from "node:child_process";
import { once } from "node:events";
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { agentRow } from "../../test/support/agents.js";
import { TOKENS } from "../../test/support/daemon.js";
import { agentName, until, WorkItemStatus } from "./support.js";
import { workerProcessFixture } from "./worker-process.js";

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const f = workerProcessFixture("sdkpack");
let scratch: string;

/** A worker binary in plain JavaScript: one handler, and SIGTERM drains it (handleSignals). */
const WORKER = `
import { createAgent, NonRetryableError } from "@aiflow/agent-sdk";
const [address, token, name] = process.argv.slice(2);
const agent = createAgent({
  address, token, name, tenants: ["t1"], slots: 2, handleSignals: true,
  handlers: {
    plain: async (item) => {
      if (typeof item.payload?.n !== "number") throw new NonRetryableError("payload.n is required");
      return { doubled: item.payload.n * 2, attempt: item.attempt };
    },
  },
});
await agent.run();
`;

beforeAll(() => {
  scratch = mkdtempSync(join(tmpdir(), "aiflow-sdk-pack-"));
});
afterAll(() => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

interface Manifest {
  name: string;
  exports: Record<string, { types: string; default: string }>;
  dependencies: Record<string, string>;
  files: string[];
}

describe("the packed SDK", () => {
  it("packs to a tarball that a plain-JavaScript worker installs, imports by name and runs on plain node", { timeout: 180_000 }, async () => {
    const npm = process.env.npm_execpath ? ([process.execPath, [process.env.npm_execpath]] as const) : (["npm", []] as const);
    const { stdout } = await run(npm[0], [...npm[1], "pack", "-w", "@aiflow/agent-sdk", "--pack-destination", scratch, "--json"], {
      cwd: ROOT,
      maxBuffer: 64 * 1024 * 1024,
    });
    const [packed] = JSON.parse(stdout.slice(stdout.indexOf("[\n  {"))) as { filename: string; files: { path: string }[] }[];
    const paths = packed!.files.map((f) => f.path);
    // Built files only: no TypeScript sources, no tests, the wire package bundled in, the heartbeat thread there.
    expect(paths.filter((p) => p.endsWith(".ts") && !p.endsWith(".d.ts"))).toEqual([]);
    expect(paths).toContain("README.md");
    expect(paths).toContain("dist/liveness/thread.js");
    expect(paths).toContain("dist/liveness/renewals.js");
    expect(paths).toContain("dist/wire/codec/index.js");
    expect(paths.some((p) => p.startsWith("dist/wire/server/"))).toBe(false);

    const pkg = join(scratch, "node_modules", "@aiflow", "agent-sdk");
    mkdirSync(pkg, { recursive: true });
    await run("tar", ["-xzf", join(scratch, packed!.filename), "-C", pkg, "--strip-components=1"]);
    const manifest = JSON.parse(readFileSync(join(pkg, "package.json"), "utf8")) as Manifest;
    expect(manifest.exports["."]).toEqual({ types: "./dist/index.d.ts", default: "./dist/index.js" });
    expect(Object.keys(manifest.dependencies)).not.toContain("@aiflow/wire");
    for (const dep of Object.keys(manifest.dependencies)) {
      mkdirSync(dirname(join(scratch, "node_modules", dep)), { recursive: true });
      symlinkSync(join(ROOT, "node_modules", dep), join(scratch, "node_modules", dep), "dir");
    }
    expect(readdirSync(join(pkg, "dist")).length).toBeGreaterThan(0);
    writeFileSync(join(scratch, "package.json"), JSON.stringify({ name: "scratch-worker", private: true, type: "module" }));

    writeFileSync(join(scratch, "worker.mjs"), WORKER);
    const name = agentName("packed");
    // Plain node: if anything in the package still needed TypeScript or this repository, this would fail.
    const worker = f.spawnWorker([join(scratch, "worker.mjs"), f.daemon.address, TOKENS.agent, name], scratch);
    await until("the packed worker registered", async () => (await agentRow(f.db, name))?.status === "active", 30_000);

    const [good, bad] = await f.producer.enqueue([
      { engineKind: "plain", payloadJson: JSON.stringify({ n: 21 }) },
      { engineKind: "plain", payloadJson: JSON.stringify({}) },
    ]);
    const done = await f.producer.waitDone([good!, bad!]);
    const result = done.find((i) => i.id === good)!;
    expect(result.status).toBe(WorkItemStatus.COMPLETED);
    expect(JSON.parse(result.resultJson)).toEqual({ doubled: 42, attempt: 1 });
    expect(done.find((i) => i.id === bad)?.status).toBe(WorkItemStatus.FAILED);

    worker.kill("SIGTERM");
    const [code] = (await once(worker, "exit")) as [number | null];
    expect(code).toBe(0);
    expect((await agentRow(f.db, name))?.status).toBe("inactive");

    // Asked to trace, without the optional OpenTelemetry packages (the manifest brings only the API):
    // one warning naming what to install, and the work runs untraced.
    const traced = agentName("packed-traced");
    const lines: string[] = [];
    const second = spawn(process.execPath, [join(scratch, "worker.mjs"), f.daemon.address, TOKENS.agent, traced], {
      cwd: scratch,
      stdio: ["ignore", "pipe", "inherit"],
      env: { ...process.env, OTEL_TRACES_EXPORTER: "otlp" },
    });
    createInterface({ input: second.stdout! }).on("line", (l) => lines.push(l));
    try {
      await until("the packed worker asked to trace registered", async () => (await agentRow(f.db, traced))?.status === "active", 30_000);
      const [id] = await f.producer.enqueue([{ engineKind: "plain", payloadJson: JSON.stringify({ n: 1 }) }]);
      expect((await f.producer.waitDone([id!]))[0]!.status).toBe(WorkItemStatus.COMPLETED);
    } finally {
      if (second.exitCode === null) {
        second.kill("SIGTERM");
        await once(second, "exit");
      }
    }
    const tracing = lines.map((l) => JSON.parse(l) as { level: number; msg: string }).filter((l) => l.msg.includes("tracing"));
    expect(tracing).toEqual([expect.objectContaining({ level: 40, msg: expect.stringContaining("npm install @opentelemetry/sdk-trace-node") })]);
  });
});
