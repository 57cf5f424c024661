/**
 * TriggerService and the --triggers-file: every bad definition is refused naming its field with
 * nothing written; a secret goes in and never comes out; a replacement keeps the stored secret and
 * takes the owner; triggers are the tenant's; the file's triggers are put at start, a file trigger
 * it no longer names is deleted, and a file that does not check keeps the daemon from starting.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { toJsonString, type MessageInitShape } from "@bufbuild/protobuf";
import { Action, TriggerSchema, TriggerType } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { readTriggersFile } from "../src/triggers/file.js";
import { TOKENS } from "./support/daemon.js";
import { DagClient, definition } from "./support/dag.js";
import { refusal, useTestDb } from "./support/kit.js";
import { makeTempDir, removeTempDir } from "./support/temp-dir.js";
import { GraphClient, MachineClient } from "./support/native.js";
import { deliver, TriggerClient } from "./support/triggers.js";

const clock = new FakeClock(Date.UTC(2026, 11, 1, 12));
const fx = useTestDb("trigsvc");
const SECRET = "sixteen-bytes-at-least";
let D: Daemon;
let client: TriggerClient;
let dir: string;

type Trig = MessageInitShape<typeof TriggerSchema>;
const hook: Trig = { name: "hook", type: TriggerType.WEBHOOK, action: Action.START, definitionId: "d", secret: SECRET };
const cron: Trig = { name: "tick", type: TriggerType.CRON, action: Action.START, definitionId: "d", schedule: "0 * * * *" };
const triggerRows = async () => Number((await fx.db.raw<{ n: string }>(`SELECT count(*) AS n FROM ${fx.db.tables.qualified("trigger")}`))[0]!.n);

beforeAll(async () => {
  dir = await makeTempDir("triggers-file");
  fx.closers.defer(() => removeTempDir(dir));
  D = await fx.startDaemon({ clock, config: { sweepInterval: 3_600_000, httpListen: { host: "127.0.0.1", port: 0 } } });
  client = fx.closers.add(new TriggerClient(D.address));
  // What the triggers below start: a start trigger names a definition its tenant has stored.
  const dag = fx.closers.add(new DagClient(D.address));
  for (const tenantKey of ["t", "u", "f"])
    for (const id of ["d", "d2"]) await dag.dag.putDefinition({ tenantKey, definition: definition([{ name: "w", wait: true, event: "never" }], { id }) });
});

describe("TriggerService", () => {
  it("refuses every bad trigger naming the field, writing nothing", async () => {
    const cases: [Trig, RegExp][] = [
      [{ ...hook, name: "" }, /^trigger\.name: '' is not 1-64/],
      [{ ...hook, name: "has space" }, /^trigger\.name: 'has space'/],
      [{ ...hook, type: TriggerType.UNSPECIFIED }, /^trigger\.type: give webhook or cron/],
      [{ ...hook, action: Action.UNSPECIFIED }, /^trigger\.action: give start or signal/],
      [{ ...hook, definitionId: "" }, /^trigger\.definition_id: is required to start a run/],
      [{ ...hook, event: "e" }, /^trigger\.event: is for a signal/],
      [{ ...hook, action: Action.SIGNAL, definitionId: "", runId: "r" }, /^trigger\.event: is required to signal a run/],
      [{ ...hook, action: Action.SIGNAL, definitionId: "", event: "e" }, /^trigger\.run_id: give the run to signal as run_id, or \(webhooks\) as run_id_path/],
      [{ ...hook, action: Action.SIGNAL, definitionId: "", event: "e", runId: "r", runIdPath: "a.b" }, /^trigger\.run_id: .* not both/],
      [{ ...hook, action: Action.SIGNAL, definitionId: "", event: "e", runIdPath: "a..b" }, /^trigger\.run_id_path: 'a\.\.b' is not a dotted path/],
      [{ ...hook, secret: "" }, /^trigger\.secret: a webhook needs a secret/],
      [{ ...hook, secret: "short" }, /^trigger\.secret: is 5 bytes; give 16-1024/],
      [{ ...hook, schedule: "* * * * *" }, /^trigger\.schedule: is for a cron trigger/],
      [{ ...cron, schedule: "* * * *" }, /^trigger\.schedule: '\* \* \* \*' is not five fields/],
      [{ ...cron, schedule: "* * * * * *" }, /^trigger\.schedule: .* is not five fields/],
      [{ ...cron, schedule: "61 * * * *" }, /^trigger\.schedule: '61 \* \* \* \*' does not parse: Invalid value for minute: 61/],
      [{ ...cron, timeZone: "Mars/Olympus" }, /^trigger\.time_zone: 'Mars\/Olympus' is not an IANA time zone/],
      [{ ...cron, secret: SECRET }, /^trigger\.secret: is for a webhook/],
      [{ ...cron, action: Action.SIGNAL, definitionId: "", event: "e", runIdPath: "run" }, /^trigger\.run_id_path: only a webhook has a body/],
    ];
    for (const [t, message] of cases) {
      const e = await refusal(client.triggers.putTrigger({ tenantKey: "t", trigger: t }));
      expect([e.code, e.rawMessage], JSON.stringify(t)).toEqual([Code.InvalidArgument, expect.stringMatching(message)]);
      expect(e.rawMessage).not.toContain("short");
    }
    expect(await triggerRows()).toBe(0);
  });

  it("refuses a start of a definition the tenant has not stored (FAILED_PRECONDITION naming it), for each engine, and takes it once stored", async () => {
    const graphs = fx.closers.add(new GraphClient(D.address));
    const machines = fx.closers.add(new MachineClient(D.address));
    const cases: [Trig, string][] = [
      [{ ...hook, definitionId: "nope" }, "dag"],
      [{ ...hook, engineKind: "graph", definitionId: "d" }, "graph"],
      [{ ...cron, engineKind: "statemachine", definitionId: "d" }, "statemachine"],
    ];
    for (const [t, kind] of cases) {
      const e = await refusal(client.triggers.putTrigger({ tenantKey: "t", trigger: t }));
      expect([e.code, e.rawMessage], JSON.stringify(t)).toEqual([
        Code.FailedPrecondition,
        `trigger.definition_id: tenant 't' has no stored ${kind} definition '${t.definitionId}': store it first (PutDefinition, or aiflowctl definitions put FILE --engine ${kind} --tenant t)`,
      ]);
    }
    // Another tenant's definition of that id is not the tenant's.
    expect((await refusal(client.triggers.putTrigger({ tenantKey: "v", trigger: hook }))).code).toBe(Code.FailedPrecondition);
    expect(await triggerRows()).toBe(0);
    await graphs.graph.putDefinition({
      tenantKey: "t",
      definition: {
        id: "d",
        start: "a",
        nodes: [
          { name: "a", kind: 1, engineKind: "k" },
          { name: "z", kind: 2 },
        ],
        edges: [{ from: "a", to: "z" }],
      },
    });
    await machines.machine.putDefinition({
      tenantKey: "t",
      definition: {
        id: "d",
        initial: "a",
        states: [
          { name: "a", transitions: [{ event: "go", to: "z" }] },
          { name: "z", terminal: true },
        ],
      },
    });
    for (const [t] of cases.slice(1))
      expect((await client.triggers.putTrigger({ tenantKey: "t", trigger: { ...t, name: `ok-${t.engineKind}` } })).created).toBe(true);
    for (const [t] of cases.slice(1)) await client.triggers.deleteTrigger({ tenantKey: "t", name: `ok-${t.engineKind}` });
  });

  it("never returns a secret; a replacement keeps it, takes the owner, and a changed secret is the one that verifies", async () => {
    const put = await client.triggers.putTrigger({ tenantKey: "t", trigger: hook });
    expect(put.created).toBe(true);
    expect(put.trigger).toMatchObject({ name: "hook", secret: "", hasSecret: true, source: "rpc" });
    const owner = put.trigger!.owner;
    expect(owner).toMatch(/^runs-/);
    const other = fx.closers.add(new TriggerClient(D.address, TOKENS.runs2));
    const replaced = await other.triggers.putTrigger({ tenantKey: "t", trigger: { ...hook, secret: "", definitionId: "d2" } });
    expect(replaced.created).toBe(false);
    expect(replaced.trigger).toMatchObject({ hasSecret: true, definitionId: "d2" });
    expect(replaced.trigger!.owner).not.toBe(owner);
    const got = (await client.triggers.getTrigger({ tenantKey: "t", name: "hook" })).trigger!;
    expect(toJsonString(TriggerSchema, got)).not.toContain(SECRET);
    // The kept secret still verifies; after a change only the new one does.
    expect((await deliver(D.httpUrl!, "t", "hook", "{}", { secret: SECRET })).status).toBe(202);
    await client.put("t", { ...hook, secret: "a-brand-new-secret-value" });
    expect((await deliver(D.httpUrl!, "t", "hook", "{}", { secret: SECRET })).status).toBe(401);
    expect((await deliver(D.httpUrl!, "t", "hook", '{"second":true}', { secret: "a-brand-new-secret-value" })).status).toBe(202);
  });

  it("lists a tenant's triggers by name, gets and deletes them, and keeps tenants apart", async () => {
    await client.put("t", { ...cron, name: "a-cron" });
    await client.put("u", { ...cron, name: "u-only" });
    expect((await client.triggers.listTriggers({ tenantKey: "t" })).triggers.map((t) => t.name)).toEqual(["a-cron", "hook"]);
    expect((await client.triggers.listTriggers({ tenantKey: "u" })).triggers.map((t) => t.name)).toEqual(["u-only"]);
    expect((await refusal(client.triggers.getTrigger({ tenantKey: "u", name: "hook" }))).code).toBe(Code.NotFound);
    await client.triggers.deleteTrigger({ tenantKey: "t", name: "a-cron" });
    const gone = await refusal(client.triggers.deleteTrigger({ tenantKey: "t", name: "a-cron" }));
    expect([gone.code, gone.rawMessage]).toEqual([Code.NotFound, "tenant 't' has no trigger 'a-cron'"]);
    const limited = fx.closers.add(new TriggerClient(D.address, TOKENS.runsT1));
    expect((await refusal(limited.triggers.listTriggers({ tenantKey: "t" }))).code).toBe(Code.PermissionDenied);
    // A deleted webhook is an unknown one.
    await client.triggers.deleteTrigger({ tenantKey: "t", name: "hook" });
    expect((await deliver(D.httpUrl!, "t", "hook", "{}", { secret: "a-brand-new-secret-value" })).status).toBe(404);
  });
});

describe("--triggers-file", () => {
  const write = (name: string, body: unknown) => {
    const path = join(dir, name);
    writeFileSync(path, typeof body === "string" ? body : JSON.stringify(body));
    return path;
  };
  const entry = {
    tenant: "f",
    name: "nightly",
    type: "cron",
    action: "start",
    definition_id: "report",
    schedule: "0 2 * * *",
    time_zone: "Europe/Berlin",
    owner: "ci",
  };

  it("puts its triggers at start, with secrets from the environment, and deletes the file's triggers it no longer names", async () => {
    process.env.AIFLOW_TEST_HOOK_SECRET = SECRET;
    const first = write("one.json", {
      triggers: [
        entry,
        { tenant: "f", name: "push", type: "webhook", action: "start", definition_id: "build", owner: "ci", secret_env: "AIFLOW_TEST_HOOK_SECRET" },
      ],
    });
    const A = await fx.startDaemon({ clock, config: { sweepInterval: 3_600_000, triggersFile: first, httpListen: { host: "127.0.0.1", port: 0 } } });
    const listed = (await client.triggers.listTriggers({ tenantKey: "f" })).triggers;
    expect(listed.map((t) => [t.name, t.source, t.owner, t.hasSecret])).toEqual([
      ["nightly", "file", "ci", false],
      ["push", "file", "ci", true],
    ]);
    // The file's webhook verifies with the secret from the environment, and starts runs as its owner.
    await fx.closers.add(new DagClient(D.address)).dag.putDefinition({ tenantKey: "f", definition: definition([{ name: "b" }], { id: "build" }) });
    const res = await deliver(A.httpUrl!, "f", "push", '{"x":1}', { secret: SECRET });
    expect(res.status).toBe(202);
    expect(await fx.db.raw(`SELECT createdby FROM ${fx.db.tables.qualified("run")} WHERE id = $1`, [res.body.run_id])).toEqual([{ createdby: "ci" }]);
    await client.put("f", { ...cron, name: "by-rpc" });
    await A.stop();
    const second = write("two.json", { triggers: [entry] });
    await (await fx.startDaemon({ clock, config: { sweepInterval: 3_600_000, triggersFile: second } })).stop();
    expect((await client.triggers.listTriggers({ tenantKey: "f" })).triggers.map((t) => t.name)).toEqual(["by-rpc", "nightly"]);
  });

  it("that does not check is a ConfigError naming the entry and field", () => {
    const bad =
      (body: unknown, env: NodeJS.ProcessEnv = {}) =>
      () =>
        readTriggersFile(write("bad.json", body), env);
    expect(bad("{not json")).toThrow(/^invalid --triggers-file: .*bad\.json: .*JSON/);
    expect(bad({ triggers: [{ ...entry, owner: undefined }] })).toThrow(/triggers\.0\.owner: Required/);
    expect(bad({ triggers: [{ ...entry, secret: "inline" }] })).toThrow(/Unrecognized key\(s\) in object: 'secret'/);
    expect(bad({ triggers: [{ ...entry, schedule: "0 2 * *" }] })).toThrow(/triggers\[0\]\.schedule: '0 2 \* \*' is not five fields/);
    expect(bad({ triggers: [entry, entry] })).toThrow(/triggers\[1\]: tenant 'f' names trigger 'nightly' twice/);
    const hookEntry = { tenant: "f", name: "h", type: "webhook", action: "start", definition_id: "x", owner: "ci", secret_env: "NOT_SET_ANYWHERE" };
    expect(bad({ triggers: [hookEntry] })).toThrow(/triggers\[0\]\.secret_env: the environment has no NOT_SET_ANYWHERE/);
    expect(bad({ triggers: [hookEntry] }, { NOT_SET_ANYWHERE: "short" })).toThrow(/triggers\[0\]\.secret_env: is 5 bytes/);
  });

  it("keeps the daemon from starting when it does not check", async () => {
    await expect(
      fx.startDaemon({ clock, config: { triggersFile: write("bad2.json", { triggers: [{ ...entry, time_zone: "Nowhere/Else" }] }) } }),
    ).rejects.toThrow(/triggers\[0\]\.time_zone: 'Nowhere\/Else' is not an IANA time zone/);
  });
});
