/**
 * aiflowctl definitions (list, get, put; --engine dag, graph or statemachine) as a person runs them:
 * `node bin/aiflowctl.js …` in a child process against a real daemon, with a `runs` token. Checked:
 * a definition put from a file comes back from get as the same protobuf JSON (so get > file, edit,
 * put round-trips), list pages by id and keeps tenants and engines apart, refusals are one line with
 * the documented exit code, and triggers put refuses a start of a definition nobody stored (issue
 * 52 item 10: it used to accept one, and its webhook then answered 404 at every delivery).
 */
import { execFile } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, it, vi } from "vitest";
import { TOKENS } from "./support/daemon.js";
import { useTestDaemon } from "./support/kit.js";
import { makeTempDir, removeTempDir } from "./support/temp-dir.js";

const CLI = fileURLToPath(new URL("../bin/aiflowctl.js", import.meta.url));
vi.setConfig({ testTimeout: 120_000 });
const fx = useTestDaemon({ label: "ctldefs", config: { instanceId: "ctl-defs", sweepInterval: 3_600_000, heartbeatInterval: 3_600_000 } });
let dir: string;

beforeAll(async () => {
  dir = await makeTempDir("ctl-defs");
  fx.closers.defer(() => removeTempDir(dir));
});

interface Result {
  code: number;
  stdout: string;
  stderr: string;
}

function ctl(args: readonly string[], token: string = TOKENS.runs): Promise<Result> {
  const env: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1" };
  for (const k of ["AIFLOW_ADDRESS", "AIFLOW_TOKEN", "AIFLOW_TLS_CA", "AIFLOW_TLS_CERT", "AIFLOW_TLS_KEY"]) delete env[k];
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [CLI, "--address", fx.address, "--token", token, ...args], { env, timeout: 60_000 }, (err, stdout, stderr) => {
      if (err && typeof err.code !== "number") return reject(Object.assign(err, { stdout, stderr }));
      resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
    });
  });
}

const file = (name: string, body: unknown) => {
  const path = join(dir, `${name}.json`);
  writeFileSync(path, JSON.stringify(body, null, 2));
  return path;
};

const DAG = {
  id: "build",
  nodes: [
    { name: "compile", engineKind: "cc", payloadJson: '{"ref":"{{ context.ref }}"}' },
    { name: "test", engineKind: "cc", dependsOn: ["compile"] },
  ],
};
const GRAPH = {
  id: "loop",
  start: "a",
  maxSteps: "5",
  nodes: [
    { name: "a", kind: "NODE_KIND_TASK", engineKind: "k" },
    { name: "z", kind: "NODE_KIND_END" },
  ],
  edges: [{ from: "a", to: "z" }],
};
const MACHINE = {
  id: "door",
  initial: "closed",
  states: [
    { name: "closed", transitions: [{ event: "open", to: "opened" }] },
    { name: "opened", terminal: true },
  ],
};
const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/;

describe("aiflowctl definitions", () => {
  it("put stores a definition of each engine, get prints it back as the same protobuf JSON, put again replaces it", async () => {
    for (const [engine, def] of [
      ["dag", DAG],
      ["graph", GRAPH],
      ["statemachine", MACHINE],
    ] as const) {
      const path = file(`${engine}-${def.id}`, def);
      const args = engine === "dag" ? [] : ["--engine", engine];
      expect(await ctl(["definitions", "put", path, "--tenant", "t", ...args])).toEqual({
        code: 0,
        stdout: `stored ${engine} definition ${def.id}\n`,
        stderr: "",
      });
      const got = await ctl(["definitions", "get", def.id, "--tenant", "t", ...args]);
      expect(got.code, got.stderr).toBe(0);
      expect(JSON.parse(got.stdout)).toEqual(def);
      expect(got.stderr).toMatch(new RegExp(`^${engine} definition ${def.id}: stored by runs-\\S+ at \\S+, last by runs-\\S+ at \\S+\\n$`));
      expect(await ctl(["definitions", "put", path, "--tenant", "t", ...args, "--json"])).toEqual({
        code: 0,
        stdout: `${JSON.stringify({ definitionId: def.id, created: false }, null, 2)}\n`,
        stderr: "",
      });
    }
    const json = JSON.parse((await ctl(["definitions", "get", "door", "--tenant", "t", "--engine", "machine", "--json"])).stdout) as {
      definition: unknown;
      stored: Record<string, string>;
    };
    // --json emits every field, defaults too.
    expect(json.definition).toMatchObject(MACHINE);
    expect(json.stored).toMatchObject({ definitionId: "door", createdBy: expect.stringMatching(/^runs-/), updatedBy: expect.stringMatching(/^runs-/) });
    expect(json.stored.updatedOn).toMatch(ISO);
  });

  it("list shows the tenant's definitions of one engine by id, page by page; other tenants and engines are apart", async () => {
    for (const id of ["b-second", "a-first", "c-third"]) await ctl(["definitions", "put", file(id, { ...DAG, id }), "--tenant", "paged"]);
    const [page, json, other, graphs] = await Promise.all([
      ctl(["definitions", "list", "--tenant", "paged", "--limit", "2"]),
      ctl(["definitions", "list", "--tenant", "paged", "--json"]),
      ctl(["definitions", "list", "--tenant", "nobody"]),
      ctl(["definitions", "list", "--tenant", "t", "--engine", "graph", "--json"]),
    ]);
    const lines = page.stdout.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^DEFINITION +UPDATED +UPDATED BY +CREATED BY$/);
    expect(lines.slice(1, 3).map((l) => l.split(/\s+/)[0])).toEqual(["a-first", "b-second"]);
    const more = /^more: --page-token (\S+) \(or a larger --limit\)$/.exec(lines[3]!);
    expect(more, page.stdout).not.toBeNull();
    const rest = await ctl(["definitions", "list", "--tenant", "paged", "--page-token", more![1]!]);
    expect(
      rest.stdout
        .trimEnd()
        .split("\n")
        .slice(1)
        .map((l) => l.split(/\s+/)[0]),
    ).toEqual(["c-third"]);
    expect((JSON.parse(json.stdout) as { definitions: { definitionId: string }[] }).definitions.map((d) => d.definitionId)).toEqual([
      "a-first",
      "b-second",
      "c-third",
    ]);
    expect(other).toEqual({ code: 0, stdout: "no definitions\n", stderr: "" });
    expect((JSON.parse(graphs.stdout) as { definitions: { definitionId: string }[] }).definitions.map((d) => d.definitionId)).toEqual(["loop"]);
    // A page token names its tenant: it does not continue another tenant's list.
    expect(await ctl(["definitions", "list", "--tenant", "nobody", "--page-token", more![1]!])).toMatchObject({
      code: 2,
      stderr: "aiflowctl: --page-token: was issued for a different tenant\n",
    });
  });

  it("refusals: an unknown definition exits 1 naming it, a bad definition or flag exits 2, an ops token exits 1", async () => {
    const [missing, otherEngine, bad, engine, noTenant, ops] = await Promise.all([
      ctl(["definitions", "get", "nope", "--tenant", "t"]),
      ctl(["definitions", "get", "build", "--tenant", "t", "--engine", "graph"]),
      ctl(["definitions", "put", file("cycle", { id: "cycle", nodes: [{ name: "a", engineKind: "k", dependsOn: ["a"] }] }), "--tenant", "t"]),
      ctl(["definitions", "list", "--tenant", "t", "--engine", "cron"]),
      ctl(["definitions", "list"]),
      ctl(["definitions", "list", "--tenant", "t"], TOKENS.ops),
    ]);
    expect(missing).toEqual({
      code: 1,
      stdout: "",
      stderr:
        "aiflowctl: tenant 't' has no stored DAG definition 'nope' (store one with PutDefinition, or aiflowctl definitions put FILE --engine dag --tenant t)\n",
    });
    expect(otherEngine).toMatchObject({ code: 1, stderr: expect.stringContaining("tenant 't' has no stored graph definition 'build'") });
    expect(bad).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: node 'a'.depends_on: names the node itself\n" });
    expect(engine).toEqual({
      code: 2,
      stdout: "",
      stderr: "aiflowctl: --engine: 'cron' is not an engine that stores definitions: give dag, graph or statemachine\n",
    });
    expect(noTenant).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: give the tenant: --tenant T\n" });
    expect(ops.code).toBe(1);
  });
});

describe("triggers put and stored definitions", () => {
  it("refuses a start trigger whose definition the tenant has not stored (exit 1, saying how to store it); once stored, takes it", async () => {
    const trigger = file("on-push", {
      name: "on-push",
      type: "TRIGGER_TYPE_WEBHOOK",
      action: "ACTION_START",
      engineKind: "graph",
      definitionId: "deploy",
      secret: "a-secret-of-sixteen-bytes",
    });
    expect(await ctl(["triggers", "put", trigger, "--tenant", "t"])).toEqual({
      code: 1,
      stdout: "",
      stderr:
        "aiflowctl: trigger.definition_id: tenant 't' has no stored graph definition 'deploy': store it first (PutDefinition, or aiflowctl definitions put FILE --engine graph --tenant t)\n",
    });
    expect(await ctl(["triggers", "list", "--tenant", "t"])).toMatchObject({ code: 0, stdout: "no triggers\n" });
    expect((await ctl(["definitions", "put", file("deploy", { ...GRAPH, id: "deploy" }), "--tenant", "t", "--engine", "graph"])).code).toBe(0);
    expect(await ctl(["triggers", "put", trigger, "--tenant", "t"])).toEqual({ code: 0, stdout: "created webhook trigger on-push\n", stderr: "" });
  });
});
