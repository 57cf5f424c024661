/**
 * aiflowctl's trigger commands as a person runs them: `node bin/aiflowctl.js …` in a child process
 * against a real daemon, with a `runs` token. Triggers are files in protobuf JSON (or stdin); a
 * webhook's secret comes from an environment variable named by --secret-env, and is looked for in
 * every byte aiflowctl prints (none may hold it). Checked: the table and the one-trigger view,
 * `--json` parsed, exit codes, and the one line of each refusal.
 */
import { execFile } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, it, vi } from "vitest";
import { TOKENS } from "./support/daemon.js";
import { DagClient, definition } from "./support/dag.js";
import { useTestDaemon } from "./support/kit.js";
import { makeTempDir, removeTempDir } from "./support/temp-dir.js";
import { deliver } from "./support/triggers.js";

const CLI = fileURLToPath(new URL("../bin/aiflowctl.js", import.meta.url));
const CLI_TIMEOUT_MS = 60_000;
vi.setConfig({ testTimeout: 120_000 });
const fx = useTestDaemon({
  label: "ctltrig",
  config: { instanceId: "ctl-triggers", sweepInterval: 3_600_000, heartbeatInterval: 3_600_000, httpListen: { host: "127.0.0.1", port: 0 } },
});
let dir: string;

const SECRET = "s3cret-from-the-environment-0123";
const OTHER_SECRET = "another-secret-kept-in-env-4567";
/** Everything aiflowctl printed, on either stream: the secrets must be in none of it. */
const printed: string[] = [];

beforeAll(async () => {
  dir = await makeTempDir("ctl-triggers");
  fx.closers.defer(() => removeTempDir(dir));
  // What the start triggers below name: a start trigger's definition must be stored first.
  const dag = fx.closers.add(new DagClient(fx.address));
  for (const id of ["report", "build"])
    await dag.dag.putDefinition({ tenantKey: "t", definition: definition([{ name: "w", wait: true, event: "never" }], { id }) });
});

interface Result {
  code: number;
  stdout: string;
  stderr: string;
}

const env = (extra: Record<string, string>) => {
  const e: NodeJS.ProcessEnv = { ...process.env, NO_COLOR: "1", ...extra };
  for (const k of ["AIFLOW_ADDRESS", "AIFLOW_TOKEN", "AIFLOW_TLS_CA", "AIFLOW_TLS_CERT", "AIFLOW_TLS_KEY", "NO_SUCH_SECRET"]) delete e[k];
  return e;
};

/** Runs aiflowctl with a runs token (or `token`) to completion, with `env` added to its environment and `stdin` on its standard input. */
function ctl(args: readonly string[], opts: { token?: string; env?: Record<string, string>; stdin?: string } = {}): Promise<Result> {
  const argv = [CLI, "--address", fx.address, "--token", opts.token ?? TOKENS.runs, ...args];
  return new Promise((resolve, reject) => {
    const child = execFile(process.execPath, argv, { env: env(opts.env ?? {}), timeout: CLI_TIMEOUT_MS }, (err, stdout, stderr) => {
      if (err && typeof err.code !== "number") return reject(Object.assign(err, { stdout, stderr }));
      printed.push(stdout, stderr);
      resolve({ code: err ? (err.code as number) : 0, stdout, stderr });
    });
    child.stdin?.end(opts.stdin ?? "");
  });
}

async function ctlJson<T>(args: readonly string[], opts: { env?: Record<string, string> } = {}): Promise<T> {
  const r = await ctl([...args, "--json"], opts);
  if (r.code !== 0) throw new Error(`aiflowctl ${args.join(" ")} exited ${r.code}: ${r.stderr}`);
  return JSON.parse(r.stdout) as T;
}

/** A trigger file in protobuf JSON, as a person writes one. */
function triggerFile(name: string, trigger: unknown): string {
  const path = join(dir, `${name}.json`);
  writeFileSync(path, JSON.stringify(trigger, null, 2));
  return path;
}

interface TriggerJson {
  name: string;
  type: string;
  action: string;
  definitionId: string;
  event: string;
  runIdPath: string;
  schedule: string;
  timeZone: string;
  secret: string;
  hasSecret: boolean;
  owner: string;
  source: string;
  nextFire?: string;
}

const DEPLOY = { name: "deploy", type: "TRIGGER_TYPE_WEBHOOK", action: "ACTION_SIGNAL", event: "deployed", runIdPath: "deployment.run" };
const NIGHTLY = {
  name: "nightly",
  type: "TRIGGER_TYPE_CRON",
  action: "ACTION_START",
  definitionId: "report",
  schedule: "30 2 * * *",
  timeZone: "Europe/Berlin",
};
const ALPHA = { name: "alpha", type: "TRIGGER_TYPE_WEBHOOK", action: "ACTION_START", definitionId: "build" };
const ISO = "\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z";

describe("help", () => {
  it("--help lists the triggers commands; triggers --help shows --secret-env, that the secret is never printed, the runs role; --help after any subcommand is the same", async () => {
    const [main, help] = await Promise.all([ctl(["--help"]), ctl(["triggers", "--help"])]);
    expect(main.code).toBe(0);
    for (const cmd of [
      "triggers list --tenant T",
      "triggers get NAME --tenant T",
      "triggers put FILE --tenant T [--secret-env VAR]",
      "triggers delete NAME --tenant T",
    ])
      expect(main.stdout).toContain(`  ${cmd}`);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/--tenant T +the trigger's tenant \(required\)/);
    expect(help.stdout).toMatch(/--secret-env VAR +put: the webhook's secret from the environment variable VAR, not from FILE.*The secret is never printed/);
    expect(help.stdout).toContain("Needs a token with role 'runs'.");
    const subs = await Promise.all(
      [["list"], ["get", "deploy"], ["put", "hook.json"], ["delete", "deploy"], ["get"]].map((a) => ctl(["triggers", ...a, "--help"])),
    );
    for (const r of subs) expect([r.code, r.stdout, r.stderr]).toEqual([0, help.stdout, ""]);
  });
});

describe("put, list, get, delete", () => {
  it("put FILE --secret-env VAR creates a webhook trigger with the variable's secret; again it replaces it (--json: created false, has a secret)", async () => {
    const file = triggerFile("deploy", DEPLOY);
    const created = await ctl(["triggers", "put", file, "--tenant", "t", "--secret-env", "HOOK_SECRET"], { env: { HOOK_SECRET: SECRET } });
    expect(created).toEqual({ code: 0, stdout: "created webhook trigger deploy\n", stderr: "" });
    const replaced = await ctlJson<{ trigger: TriggerJson; created: boolean }>(["triggers", "put", file, "--tenant", "t", "--secret-env", "HOOK_SECRET"], {
      env: { HOOK_SECRET: SECRET },
    });
    expect(replaced.created).toBe(false);
    expect(replaced.trigger).toMatchObject({ ...DEPLOY, secret: "", hasSecret: true, owner: expect.stringMatching(/^runs-\w+$/), source: "rpc" });

    // The secret the daemon keeps is the variable's: a delivery signed with it passes the signature check.
    const http = fx.daemon.httpUrl!;
    const body = JSON.stringify({ deployment: { run: "01NOSUCHRUN0000000000000000" } });
    expect((await deliver(http, "t", "deploy", body, { secret: "not-the-secret-at-all" })).status).toBe(401);
    expect((await deliver(http, "t", "deploy", body, { secret: SECRET })).status).not.toBe(401);
  });

  it("put FILE of a cron trigger with a time zone prints its next firing, in UTC and in its zone", async () => {
    const r = await ctl(["triggers", "put", triggerFile("nightly", NIGHTLY), "--tenant", "t"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`^created cron trigger nightly: next fire ${ISO} \\(\\d{4}-\\d\\d-\\d\\d 02:30 Europe/Berlin\\)\n$`));
    // A trigger on stdin, its secret from another variable.
    const alpha = await ctl(["triggers", "put", "-", "--tenant", "t", "--secret-env", "ALPHA_SECRET"], {
      env: { ALPHA_SECRET: OTHER_SECRET },
      stdin: JSON.stringify(ALPHA),
    });
    expect(alpha).toEqual({ code: 0, stdout: "created webhook trigger alpha\n", stderr: "" });
  });

  it("list shows the tenant's triggers by name: target, schedule and zone, next firing for cron, owner, source, whether a secret is set; --json too", async () => {
    const [list, json, other] = await Promise.all([
      ctl(["triggers", "list", "--tenant", "t"]),
      ctlJson<{ triggers: TriggerJson[] }>(["triggers", "list", "--tenant", "t"]),
      ctl(["triggers", "list", "--tenant", "u"]),
    ]);
    expect(list.code).toBe(0);
    const lines = list.stdout.trimEnd().split("\n");
    expect(lines[0]).toMatch(/^NAME +TYPE +ACTION +TARGET +SCHEDULE +NEXT FIRE +OWNER +SOURCE +SECRET$/);
    expect(lines.slice(1)).toEqual([
      expect.stringMatching(/^alpha +webhook +start +build +- +- +runs-\w+ +rpc +set$/),
      expect.stringMatching(/^deploy +webhook +signal +deployed → body\.deployment\.run +- +- +runs-\w+ +rpc +set$/),
      expect.stringMatching(new RegExp(`^nightly +cron +start +report +30 2 \\* \\* \\* \\(Europe/Berlin\\) +${ISO} +runs-\\w+ +rpc +-$`)),
    ]);
    expect(json.triggers.map((t) => [t.name, t.type, t.hasSecret, t.secret, t.nextFire !== undefined])).toEqual([
      ["alpha", "TRIGGER_TYPE_WEBHOOK", true, "", false],
      ["deploy", "TRIGGER_TYPE_WEBHOOK", true, "", false],
      ["nightly", "TRIGGER_TYPE_CRON", false, "", true],
    ]);
    expect(json.triggers[2]).toMatchObject({ schedule: "30 2 * * *", timeZone: "Europe/Berlin", definitionId: "report" });
    // The next firing is 02:30 in Berlin: 00:30 or 01:30 UTC, by daylight saving.
    expect(json.triggers[2]!.nextFire).toMatch(/T0[01]:30:00(\.0+)?Z$/);
    expect(other).toEqual({ code: 0, stdout: "no triggers\n", stderr: "" });
  });

  it("get NAME shows one trigger (a webhook's secret only as set); --json is the trigger", async () => {
    const [hook, cron, json] = await Promise.all([
      ctl(["triggers", "get", "deploy", "--tenant", "t"]),
      ctl(["triggers", "get", "nightly", "--tenant", "t"]),
      ctlJson<{ trigger: TriggerJson }>(["triggers", "get", "nightly", "--tenant", "t"]),
    ]);
    expect(hook.code).toBe(0);
    expect(hook.stdout.split("\n")).toEqual([
      "trigger deploy  webhook  signal",
      "  signal   deployed → body.deployment.run",
      "  hook     POST /hooks/t/deploy on the daemon's HTTP port",
      "  secret   set (never shown)",
      expect.stringMatching(/^ {2}owner {4}runs-\w+$/),
      "  source   rpc",
      expect.stringMatching(new RegExp(`^  created  ${ISO}$`)),
      expect.stringMatching(new RegExp(`^  updated  ${ISO}$`)),
      "",
    ]);
    expect(cron.code).toBe(0);
    expect(cron.stdout).toMatch(
      new RegExp(
        `^trigger nightly  cron  start\n  definition  report\n  schedule    30 2 \\* \\* \\* \\(Europe/Berlin\\)\n  next fire   ${ISO} \\(\\d{4}-\\d\\d-\\d\\d 02:30 Europe/Berlin\\)\n`,
      ),
    );
    expect(json.trigger).toMatchObject({ ...NIGHTLY, hasSecret: false, source: "rpc" });
  });

  it("delete NAME deletes it; get and delete of a trigger that is not there exit 1 with the daemon's line", async () => {
    expect(await ctl(["triggers", "delete", "alpha", "--tenant", "t"])).toEqual({ code: 0, stdout: "deleted trigger alpha\n", stderr: "" });
    const [get, again, list] = await Promise.all([
      ctl(["triggers", "get", "alpha", "--tenant", "t"]),
      ctl(["triggers", "delete", "alpha", "--tenant", "t"]),
      ctlJson<{ triggers: TriggerJson[] }>(["triggers", "list", "--tenant", "t"]),
    ]);
    expect(get).toEqual({ code: 1, stdout: "", stderr: "aiflowctl: tenant 't' has no trigger 'alpha'\n" });
    expect(again).toEqual({ code: 1, stdout: "", stderr: "aiflowctl: tenant 't' has no trigger 'alpha'\n" });
    expect(list.triggers.map((t) => t.name)).toEqual(["deploy", "nightly"]);
  });
});

describe("refusals", () => {
  it("a bad schedule or time zone is refused naming FILE and the field (exit 2); nothing is written", async () => {
    const badSchedule = triggerFile("bad-schedule", { ...NIGHTLY, name: "broken", schedule: "61 * * * *" });
    const badZone = triggerFile("bad-zone", { ...NIGHTLY, name: "broken", timeZone: "Mars/Olympus" });
    const [schedule, zone] = await Promise.all([ctl(["triggers", "put", badSchedule, "--tenant", "t"]), ctl(["triggers", "put", badZone, "--tenant", "t"])]);
    expect(schedule).toEqual({
      code: 2,
      stdout: "",
      stderr: `aiflowctl: ${badSchedule}: schedule: '61 * * * *' does not parse: Invalid value for minute: 61\n`,
    });
    expect(zone).toEqual({
      code: 2,
      stdout: "",
      stderr: `aiflowctl: ${badZone}: time_zone: 'Mars/Olympus' is not an IANA time zone such as 'Europe/Berlin' or 'UTC'\n`,
    });
    expect((await ctl(["triggers", "get", "broken", "--tenant", "t"])).code).toBe(1);
  });

  it("--secret-env naming an unset variable, or a secret the daemon refuses, names the variable (exit 2), never the secret", async () => {
    const file = triggerFile("new-hook", { ...DEPLOY, name: "new-hook" });
    const [unset, empty, short, both] = await Promise.all([
      ctl(["triggers", "put", file, "--tenant", "t", "--secret-env", "NO_SUCH_SECRET"]),
      ctl(["triggers", "put", file, "--tenant", "t", "--secret-env", "EMPTY_SECRET"], { env: { EMPTY_SECRET: "" } }),
      ctl(["triggers", "put", file, "--tenant", "t", "--secret-env", "SHORT_SECRET"], { env: { SHORT_SECRET: "short" } }),
      ctl(["triggers", "put", triggerFile("with-secret", { ...DEPLOY, secret: OTHER_SECRET }), "--tenant", "t", "--secret-env", "HOOK_SECRET"], {
        env: { HOOK_SECRET: SECRET },
      }),
    ]);
    expect(unset).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: --secret-env: the environment variable NO_SUCH_SECRET is not set\n" });
    expect(empty).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: --secret-env: the environment variable EMPTY_SECRET is empty\n" });
    expect(short).toEqual({ code: 2, stdout: "", stderr: "aiflowctl: --secret-env SHORT_SECRET: is 5 bytes; give 16-1024\n" });
    expect(both).toEqual({
      code: 2,
      stdout: "",
      stderr: `aiflowctl: ${join(dir, "with-secret.json")} has a secret and --secret-env HOOK_SECRET gives one: give it one way\n`,
    });
    // A new webhook with no secret at all is the daemon's refusal, naming the field in FILE.
    const none = await ctl(["triggers", "put", file, "--tenant", "t"]);
    expect(none).toEqual({
      code: 2,
      stdout: "",
      stderr: `aiflowctl: ${file}: secret: a webhook needs a secret (16-1024 bytes) that senders sign its body with\n`,
    });
    expect((await ctlJson<{ triggers: TriggerJson[] }>(["triggers", "list", "--tenant", "t"])).triggers.map((t) => t.name)).toEqual(["deploy", "nightly"]);
  });

  it("a missing --tenant, NAME or FILE, an unknown subcommand, a file that is not a Trigger: exit 2; an ops token: exit 1", async () => {
    const notTrigger = triggerFile("not-trigger", { name: "x", schedul: "* * * * *" });
    const results = await Promise.all([
      ctl(["triggers", "list"]),
      ctl(["triggers", "get", "--tenant", "t"]),
      ctl(["triggers", "delete", "--tenant", "t"]),
      ctl(["triggers", "put", "--tenant", "t"]),
      ctl(["triggers", "show", "--tenant", "t"]),
      ctl(["triggers"]),
      ctl(["triggers", "put", join(dir, "missing.json"), "--tenant", "t"]),
      ctl(["triggers", "put", notTrigger, "--tenant", "t"]),
      ctl(["triggers", "get", "has space", "--tenant", "t"]),
    ]);
    const stderr = results.map((r) => (expect([r.code, r.stdout]).toEqual([2, ""]), r.stderr));
    expect(stderr.slice(0, 6)).toEqual([
      "aiflowctl: give the tenant: --tenant T\n",
      "aiflowctl: give the trigger NAME: aiflowctl triggers get NAME --tenant T\n",
      "aiflowctl: give the trigger NAME: aiflowctl triggers delete NAME --tenant T\n",
      "aiflowctl: give the trigger FILE (or - for stdin): aiflowctl triggers put FILE --tenant T [--secret-env VAR]\n",
      "aiflowctl: unknown triggers subcommand 'show': list, get, put or delete (see aiflowctl triggers --help)\n",
      "aiflowctl: give the subcommand: list, get, put or delete (see aiflowctl triggers --help)\n",
    ]);
    expect(stderr[6]).toBe(`aiflowctl: FILE: cannot read ${join(dir, "missing.json")} (no such file)\n`);
    expect(stderr[7]).toMatch(new RegExp(`^aiflowctl: ${notTrigger}: is not an aiflow\\.trigger\\.v1\\.Trigger in protobuf JSON \\(.*schedul.*\\)\n$`));
    expect(stderr[8]).toMatch(/^aiflowctl: NAME: 'has space' is not a trigger name/);
    const ops = await ctl(["triggers", "list", "--tenant", "t"], { token: TOKENS.ops });
    expect(ops).toEqual({ code: 1, stdout: "", stderr: expect.stringMatching(/^aiflowctl: \S*ListTriggers needs a token with role 'runs'\n$/) });
  });
});

describe("the secret", () => {
  it("appears in nothing aiflowctl printed, --json included", () => {
    expect(printed.length).toBeGreaterThan(40);
    for (const text of printed) {
      expect(text).not.toContain(SECRET);
      expect(text).not.toContain(OTHER_SECRET);
    }
  });
});
