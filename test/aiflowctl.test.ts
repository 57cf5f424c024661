/**
 * aiflowctl as operators run it: `node bin/aiflowctl.js …` in a child process against a real daemon
 * (real clock, sweeps every 50 ms so drain deadlines act on their own), with `--json` output parsed
 * and checked, exit codes, and one-line error messages. Agents and producers are connect clients.
 * Daemons of the same schema serving TLS and mutual TLS (certificates from ./support/pki.ts) take
 * aiflowctl's --tls-* flags, and its handshake failures each get a line naming what to set.
 */
import { execFile, spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, it, vi } from "vitest";
import { Code } from "@connectrpc/connect";
import type { Daemon } from "../src/daemon.js";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { TOKENS } from "./support/daemon.js";
import { freePort } from "./support/free-port.js";
import { useTestDaemon, type Session } from "./support/kit.js";
import { Producer } from "./support/queue.js";
import { opsSession, OpsTestAgent, sorted } from "./support/ops.js";
import { Pki } from "./support/pki.js";
import type { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";

const CLI = fileURLToPath(new URL("../bin/aiflowctl.js", import.meta.url));
/**
 * Each run starts node and tsx (about a second of CPU), so on a busy machine a run can take many
 * seconds; these limits only matter when something hangs.
 */
const CLI_TIMEOUT_MS = 60_000;
vi.setConfig({ testTimeout: 120_000 });
const fx = useTestDaemon({
  label: "ctl",
  config: {
    instanceId: "ctl",
    sweepInterval: 50,
    // The test agents never heartbeat; they must not be found dead during the test.
    heartbeatInterval: 3_600_000,
    tenantWeights: new Map([["c9-cfg", 4]]),
  },
});
const closers = fx.closers;
let daemon: Daemon;
let ops: Session<typeof OpsService>;
let producer: Producer;

beforeAll(() => {
  daemon = fx.daemon;
  ops = closers.add(opsSession(daemon.address));
  producer = closers.add(new Producer(daemon.address));
});

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

const env = () => {
  const e: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1" };
  delete e.AIFLOW_ADDRESS;
  delete e.AIFLOW_TOKEN;
  return e;
};
const argv = (args: readonly string[], token: string) => [CLI, "--address", daemon.address, "--token", token, ...args];

/** Runs aiflowctl to completion. */
function ctl(args: readonly string[], token: string = TOKENS.ops): Promise<Run> {
  return new Promise((resolve, reject) => {
    execFile(process.execPath, argv(args, token), { env: env(), timeout: CLI_TIMEOUT_MS }, (err, stdout, stderr) => {
      if (err && typeof err.code !== "number") return reject(Object.assign(err, { stdout, stderr }));
      resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
    });
  });
}

/** Runs aiflowctl and parses its stdout as JSON, failing with its stderr when it did not succeed. */
async function ctlJson<T = Record<string, unknown>>(args: readonly string[], token?: string): Promise<T> {
  const r = await ctl([...args, "--json"], token);
  if (r.code !== 0) throw new Error(`aiflowctl ${args.join(" ")} exited ${r.code}: ${r.stderr}`);
  return JSON.parse(r.stdout) as T;
}

/** A long-running aiflowctl whose stderr lines can be awaited as they arrive. */
function ctlLive(args: readonly string[]) {
  const child = spawn(process.execPath, argv(args, TOKENS.ops), { env: env(), stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  const waiters: (() => void)[] = [];
  child.stdout.on("data", (b: Buffer) => (stdout += b.toString()));
  child.stderr.on("data", (b: Buffer) => {
    stderr += b.toString();
    for (const w of waiters.splice(0)) w();
  });
  const exited = new Promise<Run>((resolve) => child.on("close", (code) => resolve({ code: code ?? -1, stdout, stderr })));
  const timer = setTimeout(() => child.kill(), CLI_TIMEOUT_MS);
  // A test that fails while the command waits must not leave it running.
  closers.add({ close: () => child.exitCode === null && child.signalCode === null && child.kill() });
  void exited.then(() => clearTimeout(timer));
  return {
    exited,
    stderrLines: () => stderr.split("\n").filter(Boolean),
    /** Resolves with the first stderr line matching `re` (rejects if the process exits first). */
    async line(re: RegExp): Promise<string> {
      let done = false;
      void exited.then(() => (done = true));
      for (;;) {
        const hit = stderr.split("\n").find((l) => re.test(l));
        if (hit) return hit;
        if (done) throw new Error(`aiflowctl exited without a line like ${re}; stderr: ${stderr}`);
        await Promise.race([new Promise<void>((r) => waiters.push(r)), exited]);
      }
    },
  };
}

const agent = async (name: string, tenants: string[]) =>
  closers.add(await OpsTestAgent.register(daemon.address, name, { tenants, engineKinds: ["k"], version: "1.0.0" }));
const item = async (id: string) => (await ops.client.getItem({ id }, ops.call)).item!;

interface AgentJson {
  name: string;
  status: string;
  inFlight: number;
  agentVersion: string;
  drain?: { inFlightAtStart: number; inFlightNow: number; complete: boolean; releasedAtDeadline: number; reason: string; deadline?: string };
}

describe("usage", () => {
  it("--help lists every command and exits 0; bad flags and values exit 2 with one line, sending nothing", async () => {
    await agent("usage-agent", ["c0"]);
    const [help, agentsHelp, itemsHelp, bogus, badDuration, badNumber, noId] = await Promise.all([
      ctl(["--help"]),
      ctl(["agents", "--help"]),
      ctl(["items", "--help"]),
      ctl(["agents", "--bogus"]),
      ctl(["drain", "usage-agent", "--wait", "--interval", "soon"]),
      ctl(["items", "list", "--limit", "ten"]),
      ctl(["items", "get"]),
    ]);
    expect(help.code).toBe(0);
    for (const cmd of [
      "agents",
      "agent NAME",
      "drain NAME",
      "undrain NAME",
      "remove NAME",
      "queue stats",
      "items list",
      "items get",
      "items cancel",
      "items redrive",
      "enqueue",
      "keys list",
      "keys set",
      "tenants list",
      "tenants set-weight",
      "tenants clear-weight",
      "limits list",
      "limits set",
      "limits clear",
    ])
      expect(help.stdout).toContain(`  ${cmd}`);
    for (const flag of ["--address", "--token", "--json", "--help", "--wait", "--deadline", "--force", "--watch"]) expect(help.stdout).toContain(flag);
    // COMMAND --help is that command's usage with the global flags, not the whole list.
    expect(agentsHelp.code).toBe(0);
    expect(agentsHelp.stdout).toContain("  agents [--status S]... [--tag K=V]...");
    expect(agentsHelp.stdout).not.toContain("drain NAME");
    expect(agentsHelp.stdout).toContain("--address HOST:PORT");
    expect(itemsHelp.code).toBe(0);
    for (const cmd of ["items list", "items get", "items cancel", "items redrive"]) expect(itemsHelp.stdout).toContain(`  ${cmd}`);
    expect(itemsHelp.stdout).toContain("dead letters back to the queue");
    expect(itemsHelp.stdout).not.toContain("queue stats");

    expect(bogus).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: unknown flag --bogus\n" });
    expect(badDuration.code).toBe(2);
    expect(badDuration.stderr).toMatch(/^aiflowctl: [^\n]*--interval[^\n]*'soon' is not a duration[^\n]*\n$/);
    // Refused before anything was sent: the agent was not drained.
    expect((await ops.client.getAgent({ name: "usage-agent" }, ops.call)).agent?.status).toBe(AgentStatus.ACTIVE);
    expect(badNumber).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: --limit must be a whole number, got 'ten'\n" });
    expect(noId).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: give the item ID: aiflowctl items get ID\n" });
  });
});

describe("help, version and errors a person can act on", () => {
  it("COMMAND --help lists that command's flags with defaults, the role it needs and its exit codes; --version prints the version", async () => {
    const [drain, enqueue, version] = await Promise.all([ctl(["drain", "--help"]), ctl(["enqueue", "--help"]), ctl(["--version"])]);
    expect(drain.code).toBe(0);
    expect(drain.stdout).toMatch(/--interval D +how often --wait polls; default: 500ms/);
    expect(drain.stdout).toMatch(/--tag K=V \(repeatable\)/);
    expect(drain.stdout).toContain("Needs a token with role 'ops'.");
    expect(drain.stdout).toMatch(/Exit codes:\n( {2}.*\n)* {2}3 with --wait: the deadline gave work back/);
    expect(enqueue.stdout).toMatch(/--max-retries N +attempts after the first; default: 3/);
    expect(enqueue.stdout).toContain("Needs a token with role 'engine'.");
    const pkg = JSON.parse(await (await import("node:fs/promises")).readFile(new URL("../package.json", import.meta.url), "utf8")) as { version: string };
    expect(version).toEqual({ code: 0, stdout: `aiflowctl ${pkg.version}\n`, stderr: "" });
  });

  it("a value the daemon refuses is a usage error (exit 2) naming the flag typed, not the proto field", async () => {
    const [tenant, payload] = await Promise.all([
      ctl(["items", "cancel", "--tenant", "bad tenant", "x"]),
      ctl(["enqueue", "--tenant", "c9", "--engine-kind", "k", "--payload", "{nope"], TOKENS.engine),
    ]);
    expect(tenant.code).toBe(2);
    expect(tenant.stderr).toMatch(/^aiflowctl: --tenant: 'bad tenant' may only contain/);
    expect(payload.code).toBe(2);
    expect(payload.stderr).toMatch(/^aiflowctl: --payload: is not valid JSON/);
    expect((await ops.client.listItems({ tenantKey: "c9" }, ops.call)).items).toEqual([]);
  });

  it("no token, a token the daemon does not know, nothing listening, and a port that is not aiflowd each get one line saying what to set", async () => {
    const free = await freePort();
    const plain = http.createServer((_, res) => res.end("hello"));
    await new Promise<void>((r) => plain.listen(0, "127.0.0.1", r));
    closers.add({ close: () => plain.close() });
    const plainAddress = `127.0.0.1:${(plain.address() as AddressInfo).port}`;
    const bare = (args: string[]) =>
      new Promise<Run>((resolve) =>
        execFile(process.execPath, [CLI, ...args], { env: env(), timeout: CLI_TIMEOUT_MS }, (err, stdout, stderr) =>
          resolve({ code: err ? (err.code as number) : 0, stdout, stderr }),
        ),
      );
    const [noToken, unknown, nobody, notGrpc] = await Promise.all([
      bare(["--address", daemon.address, "agents"]),
      bare(["--address", daemon.address, "--token", "not-a-known-token", "agents"]),
      bare(["--address", `127.0.0.1:${free}`, "--token", TOKENS.ops, "agents"]),
      bare(["--address", plainAddress, "--token", TOKENS.ops, "agents"]),
    ]);
    expect(noToken).toEqual({
      code: 1,
      stdout: "",
      stderr: "aiflowctl: no token: give --token TOKEN or set AIFLOW_TOKEN (agents needs a token with role 'ops')\n",
    });
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/^aiflowctl: the daemon at \S+ does not accept the token from --token/);
    expect(unknown.stderr).not.toContain("not-a-known-token");
    expect(nobody).toEqual({
      code: 1,
      stdout: "",
      stderr: `aiflowctl: nothing is listening at 127.0.0.1:${free}: is aiflowd running there? (--address, AIFLOW_ADDRESS)\n`,
    });
    expect(notGrpc.code).toBe(1);
    expect(notGrpc.stderr).toMatch(new RegExp(`^aiflowctl: ${plainAddress} did not answer as aiflowd's gRPC port does .*\\(--address, AIFLOW_ADDRESS\\)\n$`));
  });
});

describe("bindings", () => {
  it("list, rebind and unbind an affinity key", async () => {
    const a = await agent("bnd-k1", ["c5"]);
    await agent("bnd-k2", ["c5"]);
    await producer.ids("c5", [{ engineKind: "k", workerParams: { affinityKey: "run-42" } }]);
    const held = await a.claim(1);
    expect(held).toHaveLength(1);
    expect((await a.complete(held)).every((o) => o.ok)).toBe(true);

    const listed = await ctlJson<{ bindings: { affinityKey: string; agentId: string }[] }>(["bindings", "list", "--key-prefix", "run-"]);
    expect(listed.bindings.map((b) => [b.affinityKey, b.agentId])).toEqual([["run-42", "bnd-k1"]]);
    const human = await ctl(["bindings", "list", "--agent", "bnd-k1"]);
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(/^TENANT +KEY +AGENT +SINCE\nc5 +run-42 +bnd-k1 +\d{4}-/);

    const rebound = await ctl(["bindings", "rebind", "run-42", "bnd-k2", "--tenant", "c5"]);
    expect(rebound).toEqual({ code: 0, stdout: "run-42 is bound to bnd-k2\n", stderr: "" });
    expect((await ops.client.listBindings({ keyPrefix: "run-" }, ops.call)).bindings.map((b) => b.agentId)).toEqual(["bnd-k2"]);

    const unbound = await ctl(["bindings", "unbind", "run-42"]);
    expect(unbound).toEqual({ code: 0, stdout: "unbound run-42\n", stderr: "" });
    expect((await ops.client.listBindings({ keyPrefix: "run-" }, ops.call)).bindings).toEqual([]);
    expect(await ctl(["bindings", "rebind", "run-42"])).toEqual({
      code: 2,
      stdout: "",
      stderr: "aiflowctl: give the KEY and the AGENT: aiflowctl bindings rebind KEY AGENT\n",
    });
  });
});

describe("keys", () => {
  it("list a concurrency key, and set and clear an operator's limit on it", async () => {
    await producer.ids("c8", [{ engineKind: "k", workerParams: { concurrencyKey: "render", maxInFlight: 2 } }]);
    type KeysJson = { keys: { tenantKey: string; key: string; limit: number; limitSource: string; inFlight: number; pending: string }[]; rules: unknown[] };
    const listed = await ctlJson<KeysJson>(["keys", "list", "--tenant", "c8"]);
    expect(listed.keys).toEqual([{ tenantKey: "c8", key: "render", limit: 2, limitSource: "items", inFlight: 0, pending: "1" }]);
    expect(listed.rules).toEqual([]);

    const raised = await ctl(["keys", "set", "render", "3", "--tenant", "c8"]);
    expect(raised).toEqual({ code: 0, stdout: "set the limit of render in c8 to 3: limit 3 (ops), 0 in flight, 1 pending\n", stderr: "" });
    const human = await ctl(["keys", "list", "--tenant", "c8"]);
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(/^TENANT +KEY +LIMIT +SOURCE +IN FLIGHT +PENDING\nc8 +render +3 +ops +0 +1\n$/);
    const rule = await ctlJson<{ key?: unknown }>(["keys", "set", "ren", "1", "--tenant", "c8", "--prefix"]);
    expect(rule.key).toBeUndefined();
    expect((await ctl(["keys", "list", "--tenant", "c8"])).stdout).toMatch(/\n\nprefix rules:\nTENANT +PREFIX +MAX IN FLIGHT\nc8 +ren +1\n$/);

    const cleared = await ctlJson<{ key: { limit: number; limitSource: string } }>(["keys", "set", "render", "0", "--tenant", "c8"]);
    expect([cleared.key.limit, cleared.key.limitSource]).toEqual([1, "ops prefix ren"]);
    expect(await ctl(["keys", "set", "render", "--tenant", "c8"])).toEqual({
      code: 2,
      stdout: "",
      stderr: "aiflowctl: give the KEY and the MAX: aiflowctl keys set KEY MAX --tenant T [--prefix]\n",
    });
    const tooMany = await ctl(["keys", "set", "render", "100001", "--tenant", "c8"]);
    expect(tooMany.code).toBe(2);
    expect(tooMany.stderr).toMatch(/^aiflowctl: MAX: 100001 is outside 0\.\.100000\n$/);
  });
});

describe("tenants", () => {
  it("list tenants with their weights, and set and clear an operator's weight", async () => {
    await producer.ids("c9", [{ engineKind: "k" }, { engineKind: "k" }]);
    type TenantsJson = { tenants: { tenantKey: string; weight: number; weightSource: string; pending: string; dispatched: string }[] };
    const listed = await ctlJson<TenantsJson>(["tenants", "list", "--tenant", "c9"]);
    expect(listed.tenants).toEqual([{ tenantKey: "c9", weight: 1, weightSource: "default", pending: "2", dispatched: "0" }]);
    expect((await ctlJson<TenantsJson>(["tenants", "list", "--tenant", "c9-cfg"])).tenants).toEqual([
      { tenantKey: "c9-cfg", weight: 4, weightSource: "config", pending: "0", dispatched: "0" },
    ]);

    const set = await ctl(["tenants", "set-weight", "c9", "2.5"]);
    expect(set).toEqual({ code: 0, stdout: "set the weight of c9 to 2.5: weight 2.5 (operator), 2 pending, 0 dispatched\n", stderr: "" });
    const human = await ctl(["tenants", "list", "--tenant", "c9"]);
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(/^TENANT +WEIGHT +SOURCE +PENDING +DISPATCHED\nc9 +2\.5 +operator +2 +0\n$/);
    const cleared = await ctlJson<{ tenant: TenantsJson["tenants"][number] }>(["tenants", "clear-weight", "c9"]);
    expect([cleared.tenant.weight, cleared.tenant.weightSource]).toEqual([1, "default"]);
    expect(await ctl(["tenants", "clear-weight", "c9-cfg"])).toEqual({
      code: 0,
      stdout: "cleared the weight of c9-cfg: weight 4 (config), 0 pending, 0 dispatched\n",
      stderr: "",
    });

    expect(await ctl(["tenants", "set-weight", "c9", "0"])).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: WEIGHT: 0 must be between 0.001 and 1000\n" });
    expect(await ctl(["tenants", "set-weight", "c9", "heavy"])).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: WEIGHT must be a number, got 'heavy'\n" });
    expect(await ctl(["tenants", "set-weight", "c9"])).toEqual({
      code: 2,
      stdout: "",
      stderr: "aiflowctl: give the TENANT and the WEIGHT: aiflowctl tenants set-weight TENANT WEIGHT\n",
    });
    expect((await ctlJson<TenantsJson>(["tenants", "list", "--tenant", "c9"])).tenants[0]?.weightSource).toBe("default");
  });
});

describe("limits", () => {
  it("set rate limits on a key and a prefix, list them with a key's state, and clear them", async () => {
    expect(await ctl(["limits", "set", "c10", "api", "50/1s"])).toEqual({ code: 0, stdout: "api in c10: at most 50/1s, 1 at once\n", stderr: "" });
    expect(await ctl(["limits", "set", "c10", "model:", "10/m", "--prefix", "--burst", "5"])).toEqual({
      code: 0,
      stdout: "keys starting with model: in c10: at most 10/1m each, 5 at once\n",
      stderr: "",
    });
    type LimitsJson = {
      rules: { tenantKey: string; key: string; prefix: boolean; count: number; interval: string; burst: number }[];
      keys: { tenantKey: string; key: string; nextSlotAt?: string; limit?: { key: string; prefix: boolean } }[];
      nextPageToken: string;
    };
    const listed = await ctlJson<LimitsJson>(["limits", "list", "--tenant", "c10"]);
    expect(listed).toEqual({
      rules: [
        { tenantKey: "c10", key: "api", prefix: false, count: 50, interval: "1s", burst: 1 },
        { tenantKey: "c10", key: "model:", prefix: true, count: 10, interval: "60s", burst: 5 },
      ],
      keys: [],
      nextPageToken: "",
    });

    // A dispatch of a key under the prefix spends a slot: the key is listed with its state.
    const a = await agent("lim-a", ["c10"]);
    await producer.ids("c10", [{ engineKind: "k", workerParams: { rateLimitKey: "model:x" } }]);
    expect((await a.claim(1)).map((i) => i.workerParams?.rateLimitKey)).toEqual(["model:x"]);
    const withKey = await ctlJson<LimitsJson>(["limits", "list", "--tenant", "c10"]);
    expect(withKey.keys.map((k) => [k.key, k.limit?.key, k.limit?.prefix, typeof k.nextSlotAt])).toEqual([["model:x", "model:", true, "string"]]);
    const human = await ctl(["limits", "list", "--tenant", "c10"]);
    expect(human.code).toBe(0);
    expect(human.stdout).toMatch(
      /^TENANT +KEY +ON +LIMIT +BURST\nc10 +api +key +50\/1s +1\nc10 +model: +prefix +10\/1m +5\n\nkeys:\nTENANT +KEY +LIMIT +SOURCE +NEXT SLOT\nc10 +model:x +10\/1m +prefix model: +\d{4}-\d\d-\d\dT[\d:.]+Z\n$/,
    );

    expect(await ctl(["limits", "clear", "c10", "api"])).toEqual({ code: 0, stdout: "cleared the rate limit of api in c10: it is not limited\n", stderr: "" });
    expect(await ctl(["limits", "clear", "c10", "model:", "--prefix"])).toEqual({
      code: 0,
      stdout: "cleared the rate limit of keys starting with model: in c10\n",
      stderr: "",
    });
    const after = await ctlJson<LimitsJson>(["limits", "list", "--tenant", "c10"]);
    expect([after.rules, after.keys.map((k) => [k.key, k.limit, k.nextSlotAt])]).toEqual([[], [["model:x", undefined, undefined]]]);

    expect(await ctl(["limits", "set", "c10", "api", "0/1s"])).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: COUNT/INTERVAL: 0 is outside 1..1000000\n" });
    expect(await ctl(["limits", "set", "c10", "api", "fast"])).toEqual({
      code: 2,
      stdout: "",
      stderr: "aiflowctl: COUNT/INTERVAL must be a whole count, a slash and a duration (50/1s, 600/1m), got 'fast'\n",
    });
    const soon = await ctl(["limits", "set", "c10", "api", "5/soon"]);
    expect(soon.code).toBe(2);
    expect(soon.stderr).toMatch(/^aiflowctl: [^\n]*'soon' is not a duration[^\n]*\n$/);
    expect(await ctl(["limits", "set", "c10", "api", "5/1s", "--burst", "0.5"])).toEqual({
      code: 2,
      stdout: "",
      stderr: "aiflowctl: --burst must be a whole number, got '0.5'\n",
    });
    expect(await ctl(["limits", "set", "c10", "api"])).toEqual({
      code: 2,
      stdout: "",
      stderr: "aiflowctl: give the TENANT, the KEY and the COUNT/INTERVAL: aiflowctl limits set TENANT KEY COUNT/INTERVAL [--burst N] [--prefix]\n",
    });
    expect((await ctlJson<LimitsJson>(["limits", "list", "--tenant", "c10"])).rules).toEqual([]);
  });
});

describe("undrain", () => {
  it("of an inactive agent is not a success: exit 1, saying its process must register again", async () => {
    const a = await agent("gone-1", ["c6"]);
    await ctlJson(["drain", "gone-1"]);
    await a.s.client.deregister({ name: "gone-1" }, a.s.call);
    const res = await ctl(["undrain", "gone-1"]);
    expect(res).toEqual({
      code: 1,
      stdout: "",
      stderr: "aiflowctl: gone-1 is inactive: undrain changed nothing; the agent returns when its process registers again (restart it)\n",
    });
  });
});

describe("fleet and queue commands", () => {
  it("enqueue, agents, agent, queue stats, items list, not-found and refused removal", async () => {
    const enq = await ctlJson<{ results: { id: string; existing: boolean }[] }>(
      ["enqueue", "--tenant", "c1", "--engine-kind", "k", "--count", "3"],
      TOKENS.engine,
    );
    expect(enq.results).toHaveLength(3);
    const ids = enq.results.map((r) => r.id);
    expect(new Set(ids).size).toBe(3);

    await agent("cli-b", ["c1"]);
    const a = await agent("cli-a", ["c1"]);
    const held = await a.claim(2);
    expect(held).toHaveLength(2);

    const [agents, one, qstats, items, missing, refused] = await Promise.all([
      ctlJson<{ agents: AgentJson[] }>(["agents"]),
      ctlJson<{ agent: AgentJson; dispatched: { id: string; status: string }[] }>(["agent", "cli-a"]),
      ctlJson<{ pending: string; dispatched: string; deadLetters: string; depth: { tenantKey: string; engineKind: string; status: string; count: string }[] }>([
        "queue",
        "stats",
        "--tenant",
        "c1",
      ]),
      ctlJson<{ items: { id: string; tenantKey: string; status: string }[] }>(["items", "list", "--tenant", "c1"]),
      ctl(["agent", "no-such-agent"]),
      ctl(["remove", "cli-a"]),
    ]);

    // Registered cli-b before cli-a (after usage-agent, when the first test ran): listed by name.
    const listed = agents.agents.map((x) => x.name);
    expect(listed).toEqual([...listed].sort());
    const ours = agents.agents.filter((x) => x.name.startsWith("cli-"));
    expect(ours.map((x) => [x.name, x.status, x.inFlight, x.agentVersion])).toEqual([
      ["cli-a", "AGENT_STATUS_ACTIVE", 2, "1.0.0"],
      ["cli-b", "AGENT_STATUS_ACTIVE", 0, "1.0.0"],
    ]);

    expect(one.agent.name).toBe("cli-a");
    expect(one.agent.inFlight).toBe(2);
    expect(sorted(one.dispatched.map((i) => i.id))).toEqual(sorted(held.map((h) => h.id)));
    expect(one.dispatched.every((i) => i.status === "WORK_ITEM_STATUS_DISPATCHED")).toBe(true);
    // Every time of an item reads in ISO 8601, epoch-nanosecond ones beside their exact value.
    const shown = one.dispatched[0] as unknown as Record<string, string | null>;
    expect(shown.createdOn).toMatch(/^\d{4}-\d\d-\d\dT[\d:.]+Z$/);
    expect(shown.dispatchedAt).toBe(new Date(Number(BigInt(shown.dispatchedAtNs!) / 1_000_000n)).toISOString());
    expect(shown.leaseExpiresAt).toMatch(/^\d{4}-\d\d-\d\dT[\d:.]+Z$/);
    expect(shown.completedAtNs).toBe("0");
    expect(shown.completedAt).toBeNull();

    expect([qstats.pending, qstats.dispatched, qstats.deadLetters]).toEqual(["1", "2", "0"]);
    // Two dispatched within the minute: how long they waited, as a person reads it.
    expect((await ctl(["queue", "stats", "--tenant", "c1"])).stdout).toMatch(/dispatched\/s 0\.0 {2}completed\/s 0\.0 {2}wait p50 \d+(ms|s) p99 \d+(ms|s)\n/);
    expect(sorted(qstats.depth.map((d) => `${d.tenantKey}/${d.engineKind}/${d.status}=${d.count}`))).toEqual([
      "c1/k/WORK_ITEM_STATUS_DISPATCHED=2",
      "c1/k/WORK_ITEM_STATUS_PENDING=1",
    ]);

    expect(sorted(items.items.map((i) => i.id))).toEqual(sorted(ids));
    expect(items.items.every((i) => i.tenantKey === "c1")).toBe(true);

    expect(missing).toEqual({ code: 1, stdout: "", stderr: "aiflowctl: agent 'no-such-agent' not found\n" });

    expect(refused.code).toBe(1);
    expect(refused.stdout).toBe("");
    expect(refused.stderr).toMatch(/^aiflowctl: [^\n]*'cli-a'[^\n]*\n$/);
    expect((await ops.client.listAgents({}, ops.call)).agents.map((x) => x.name)).toContain("cli-a");
    for (const h of held) expect((await item(h.id)).status).toBe(WorkItemStatus.DISPATCHED);
  });

  it("drain --json, undrain, and items redrive --all --json", async () => {
    const a = await agent("cli-r", ["c4"]);
    const [id] = await producer.many("c4", "k", 1);
    // The daemon sets the deadline ten minutes after it takes the call: between these two readings.
    const before = Date.now();
    const drained = await ctlJson<{ agents: AgentJson[] }>(["drain", "cli-r", "--reason", "deploy", "--deadline", "10m"]);
    const after = Date.now();
    expect(drained.agents.map((x) => [x.name, x.status])).toEqual([["cli-r", "AGENT_STATUS_DRAINING"]]);
    expect(drained.agents[0]?.drain).toMatchObject({ reason: "deploy", inFlightAtStart: 0, inFlightNow: 0, complete: true });
    const deadline = Date.parse(drained.agents[0]!.drain!.deadline!);
    expect(deadline).toBeGreaterThanOrEqual(before + 10 * 60_000);
    expect(deadline).toBeLessThanOrEqual(after + 10 * 60_000);
    expect(await a.claim(1)).toEqual([]);

    const undrained = await ctl(["undrain", "cli-r"]);
    expect(undrained).toEqual({ code: 0, stdout: "cli-r is active\n", stderr: "" });
    const claimed = await a.claim(1);
    expect(claimed.map((x) => x.id)).toEqual([id]);
    expect((await a.fail(claimed, false, "poison")).every((o) => o.ok)).toBe(true);

    expect(await item(id!)).toMatchObject({ status: WorkItemStatus.FAILED, error: "poison" });
    const redriven = await ctlJson<{ redrivenIds: string[] }>(["items", "redrive", "--all"]);
    expect(redriven.redrivenIds).toEqual([id]);
    expect(await item(id!)).toMatchObject({ status: WorkItemStatus.PENDING, retryCount: 0 });
  });
});

describe("drain --wait", () => {
  it("shows progress and exits 0 once the agent's work completed", async () => {
    const a = await agent("cli-w", ["c2"]);
    await producer.many("c2", "k", 2);
    const held = await a.claim(2);
    expect(held).toHaveLength(2);

    const run = ctlLive(["drain", "cli-w", "--wait", "--interval", "50ms"]);
    await run.line(/^cli-w: in flight 2\/2, no deadline$/);
    expect((await a.complete(held)).every((o) => o.ok)).toBe(true);
    const res = await run.exited;
    expect(res.code).toBe(0);
    expect(res.stdout).toBe("drained\n");
    expect(run.stderrLines().at(-1)).toMatch(/^cli-w: in flight 0\/2, no deadline, complete$/);
  });

  it("exits 3 when the deadline gave work back; the work is pending again with its retries unspent", async () => {
    const a = await agent("cli-d", ["c3"]);
    await producer.many("c3", "k", 2, { maxRetries: 2 });
    const held = await a.claim(2);
    expect(held).toHaveLength(2);

    const run = ctlLive(["drain", "cli-d", "--wait", "--deadline", "300ms", "--interval", "50ms"]);
    const res = await run.exited;
    expect(res.code).toBe(3);
    expect(res.stdout).toBe("drained; 2 item(s) were given back at the deadline\n");
    // Progress lines while it waited (how many depends on how fast this machine is), then the outcome.
    expect(run.stderrLines().every((l) => /^cli-d: in flight [0-2]\/2, deadline in \S+/.test(l))).toBe(true);
    expect(run.stderrLines().at(-1)).toMatch(/^cli-d: in flight 0\/2, deadline in 0ms, complete, 2 released at deadline$/);
    for (const h of held) expect(await item(h.id)).toMatchObject({ status: WorkItemStatus.PENDING, retryCount: 0 });
    expect((await a.complete(held)).map((o) => o.code)).toEqual([Code.FailedPrecondition, Code.FailedPrecondition]);
  });
});

describe("over TLS", () => {
  const pki = Pki.create();
  const serverCert = pki.server();
  const alice = pki.client("alice", { uris: ["spiffe://aiflow/ops/alice"] });
  const strangerPki = Pki.create("another-ca");
  const ca = pki.ca.cert;
  closers.defer(() => (pki.close(), strangerPki.close()));
  let tlsDaemon: Daemon;
  let mtlsDaemon: Daemon;
  beforeAll(async () => {
    // Daemons of the file's schema serving TLS and mutual TLS: they list the agents the h2c one registered.
    const config = { sweepInterval: 50, heartbeatInterval: 3_600_000, tlsCert: serverCert.cert, tlsKey: serverCert.key };
    [tlsDaemon, mtlsDaemon] = await Promise.all([
      fx.startDaemon({ config: { ...config, instanceId: "ctl-tls" } }),
      fx.startDaemon({ config: { ...config, instanceId: "ctl-mtls", tlsClientCa: ca } }),
    ]);
  });

  /** Runs aiflowctl with exactly `args`, and `extraEnv` on top of a clean environment. */
  const run = (args: string[], extraEnv: NodeJS.ProcessEnv = {}) =>
    new Promise<Run>((resolve) =>
      execFile(process.execPath, [CLI, ...args], { env: { ...env(), ...extraEnv }, timeout: CLI_TIMEOUT_MS }, (err, stdout, stderr) =>
        resolve({ code: err ? (err.code as number) : 0, stdout, stderr }),
      ),
    );
  const names = (r: Run) => {
    if (r.code !== 0) throw new Error(`aiflowctl exited ${r.code}: ${r.stderr}`);
    return (JSON.parse(r.stdout) as { agents: AgentJson[] }).agents.map((a) => a.name);
  };

  it("agents over TLS with --tls-ca (a bare address becomes https://) or AIFLOW_TLS_CA, and over mutual TLS with an ops certificate and no token", async () => {
    await agent("tls-listed", ["c7"]);
    const [help, flag, fromEnv, mutual] = await Promise.all([
      run(["--help"]),
      run(["--address", tlsDaemon.address, "--tls-ca", ca, "--token", TOKENS.ops, "agents", "--json"]),
      run(["--address", `https://${tlsDaemon.address}`, "--token", TOKENS.ops, "agents", "--json"], { AIFLOW_TLS_CA: ca }),
      run(["--address", mtlsDaemon.address, "--tls-ca", ca, "--tls-cert", alice.cert, "--tls-key", alice.key, "agents", "--json"]),
    ]);
    for (const f of ["--tls-ca FILE", "--tls-cert FILE", "--tls-key FILE"]) expect(help.stdout).toContain(f);
    expect(names(flag)).toContain("tls-listed");
    expect(names(fromEnv)).toContain("tls-listed");
    expect(names(mutual)).toContain("tls-listed");
  });

  it("a daemon certificate not trusted, a file missing, a lone --tls-cert, http:// with TLS flags, TLS to an h2c port: one line naming what to set", async () => {
    const garbage = join(pki.dir, "garbage.pem");
    writeFileSync(garbage, "not a certificate\n");
    const ops = ["--token", TOKENS.ops, "agents"];
    const [untrusted, otherCa, missing, lone, notPem, plaintext, h2c] = await Promise.all([
      run(["--address", `https://${tlsDaemon.address}`, ...ops]),
      run(["--address", tlsDaemon.address, "--tls-ca", strangerPki.ca.cert, ...ops]),
      run(["--address", tlsDaemon.address, "--tls-ca", join(pki.dir, "nope.crt"), ...ops]),
      run(["--address", mtlsDaemon.address, "--tls-ca", ca, "--tls-cert", alice.cert, ...ops]),
      run(["--address", tlsDaemon.address, "--tls-ca", garbage, ...ops]),
      run(["--address", `http://${tlsDaemon.address}`, "--tls-ca", ca, ...ops]),
      run(["--address", daemon.address, "--tls-ca", ca, ...ops]),
    ]);
    const failed = `aiflowctl: the TLS handshake with ${tlsDaemon.address}`;
    expect(untrusted.code).toBe(1);
    expect(untrusted.stderr).toMatch(
      new RegExp(
        `^aiflowctl: the TLS handshake with https://${tlsDaemon.address} failed: its certificate is not trusted \\(.+\\): give the CA that signed it with --tls-ca FILE \\(or AIFLOW_TLS_CA\\)\n$`,
      ),
    );
    expect(otherCa.code).toBe(1);
    expect(otherCa.stderr).toMatch(`${failed} failed: its certificate is not trusted (`);
    expect(otherCa.stderr).toMatch(`): the CA in --tls-ca (${strangerPki.ca.cert}) did not sign it\n`);
    expect(missing).toEqual({ code: 2, stdout: "", stderr: `aiflowctl: --tls-ca: cannot read ${join(pki.dir, "nope.crt")} (no such file)\n` });
    expect(lone).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: --tls-cert and --tls-key go together (got only --tls-cert)\n" });
    expect(notPem).toEqual({ code: 2, stdout: "", stderr: `aiflowctl: --tls-ca: ${garbage} holds no PEM certificate\n` });
    expect(plaintext).toEqual({
      code: 2,
      stdout: "",
      stderr: `aiflowctl: http://${tlsDaemon.address} is plaintext (http://), but TLS flags are given: write https:// or leave the scheme out\n`,
    });
    expect(h2c.code).toBe(1);
    expect(h2c.stderr).toMatch(
      new RegExp(`^aiflowctl: the TLS handshake with ${daemon.address} failed: ${daemon.address} does not speak TLS \\(.+\\): it serves h2c`),
    );
  });

  it("mutual TLS without a client certificate (or with another CA's), and h2c to a TLS port: the connection closes unanswered, and the line says what to give", async () => {
    const stranger = strangerPki.client("stranger", { uris: ["spiffe://aiflow/ops/mallory"] });
    const ops = ["--token", TOKENS.ops, "agents"];
    const [noCert, otherCert, plainToTls] = await Promise.all([
      run(["--address", mtlsDaemon.address, "--tls-ca", ca, ...ops]),
      run(["--address", mtlsDaemon.address, "--tls-ca", ca, "--tls-cert", stranger.cert, "--tls-key", stranger.key, ...ops]),
      run(["--address", tlsDaemon.address, ...ops]),
    ]);
    expect(noCert).toEqual({
      code: 1,
      stdout: "",
      stderr: `aiflowctl: ${mtlsDaemon.address} closed the connection as the TLS handshake ended: under mutual TLS it wants a client certificate: give --tls-cert FILE and --tls-key FILE\n`,
    });
    expect(otherCert.code).toBe(1);
    expect(otherCert.stderr).toMatch(/under mutual TLS, the certificate of --tls-cert is not one it accepts/);
    expect(plainToTls).toEqual({
      code: 1,
      stdout: "",
      stderr: `aiflowctl: ${tlsDaemon.address} closed the connection without answering: if it serves TLS, give --tls-ca FILE (or AIFLOW_TLS_CA) (--address, AIFLOW_ADDRESS)\n`,
    });
  });
});
