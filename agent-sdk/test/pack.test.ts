/**
 * The compiled SDK as a worker binary outside this repository uses it: built with the package's own
 * build (tsconfig.build.json and its manifest), installed under node_modules by name, imported from
 * plain JavaScript and run on plain `node`, without a TypeScript loader.
 */
import { execFile } from "node:child_process";
import { once } from "node:events";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { agentRow } from "../../test/support/agents.js";
import { TOKENS } from "../../test/support/daemon.js";
import { agentName, until, WorkItemStatus } from "./support.js";
import { workerProcessFixture } from "./worker-process.js";

const run = promisify(execFile);
const SDK = fileURLToPath(new URL("..", import.meta.url));
const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const f = workerProcessFixture("sdkbuild");
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
  // Inside the repository, so that the package's dependencies resolve from its node_modules.
  mkdirSync(join(ROOT, ".tmp"), { recursive: true });
  scratch = mkdtempSync(join(ROOT, ".tmp", "sdk-build-"));
});
afterAll(() => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe("the compiled SDK", () => {
  it("builds to a package that a plain-JavaScript worker imports by name and runs on plain node", { timeout: 120_000 }, async () => {
    const pkg = join(scratch, "node_modules", "@aiflow", "agent-sdk");
    await run(process.execPath, [join(ROOT, "node_modules", "typescript", "bin", "tsc"), "-p", join(SDK, "tsconfig.build.json"), "--outDir", pkg]);
    await run(process.execPath, [join(SDK, "scripts", "dist-manifest.mjs"), pkg]);
    const manifest = JSON.parse(readFileSync(join(pkg, "package.json"), "utf8")) as { exports: Record<string, { default: string }> };
    expect(manifest.exports["."]?.default).toBe("./index.js");
    // The heartbeat thread (plain JavaScript, loaded by URL) travels with it.
    expect(readFileSync(join(pkg, "liveness", "thread.js"), "utf8").length).toBeGreaterThan(0);

    writeFileSync(join(scratch, "worker.mjs"), WORKER);
    const name = agentName("built");
    // No --import tsx: if anything in the compiled package still needed TypeScript, this would fail.
    const worker = f.spawnWorker([join(scratch, "worker.mjs"), f.daemon.address, TOKENS.agent, name], scratch);
    await until("the built worker registered", async () => (await agentRow(f.db, name))?.status === "active", 30_000);

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
  });
});
