/**
 * Webhook triggers over real HTTP: a signed delivery starts a run whose directory row points at its
 * firing, or signals a waiting run; every refusal (unknown trigger, bad or missing signature, a body
 * over the cap or not JSON, a replayed delivery, an unknown run or event) is answered with its HTTP
 * status and recorded as a refused firing carrying what the trigger meant to do, and changes nothing
 * else — a refusal that proved nothing keeps only its body's size, digest and first KiB, and none is
 * recorded under a tenant with no webhook trigger here (the hostile-webhook-* tests push on those
 * bounds). The entity reference's two queries over the log answer what they promise.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Action, TriggerType } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { RunStatus } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { FakeClock, msToNs } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { TOKENS } from "./support/daemon.js";
import { DagClient, definition } from "./support/dag.js";
import { useTestDb } from "./support/kit.js";
import { sha256Hex } from "./support/hostile-webhook.js";
import { deliver, TriggerClient } from "./support/triggers.js";

const clock = new FakeClock(Date.UTC(2026, 11, 1, 12));
const fx = useTestDb("hooks");
const SECRET = "a-webhook-secret-of-some-length";
const MAX = 2048;
let D: Daemon;
let url: string;
let dag: DagClient;
let triggers: TriggerClient;

const table = (t: "trigger_firing" | "engine_run" | "run" | "trigger_delivery") => fx.db.tables.qualified(t);
interface FiringDbRow {
  id: string;
  trigger_name: string;
  trigger_type: string | null;
  payload: string | null;
  action: string | null;
  definition_id: string | null;
  event: string | null;
  run_id: string | null;
  outcome: string;
  error: string | null;
  fired_on: string | null;
}
const firing = async (id: string) => (await fx.db.raw<FiringDbRow>(`SELECT * FROM ${table("trigger_firing")} WHERE id = $1`, [id]))[0]!;
/** What a firing keeps of a short body that proved nothing (src/triggers/payload.ts). */
const unverified = (body: string) => JSON.stringify({ unverified_body: { bytes: Buffer.byteLength(body), sha256: sha256Hex(body), first_1024_bytes: body } });
const count = async (t: "trigger_firing" | "run" | "engine_run" | "trigger_delivery") =>
  Number((await fx.db.raw<{ n: string }>(`SELECT count(*) AS n FROM ${table(t)}`))[0]!.n);

beforeAll(async () => {
  D = await fx.startDaemon({ clock, config: { sweepInterval: 3_600_000, webhookMaxBytes: MAX, httpListen: { host: "127.0.0.1", port: 0 } } });
  url = D.httpUrl!;
  dag = fx.closers.add(new DagClient(D.address));
  triggers = fx.closers.add(new TriggerClient(D.address));
  await dag.dag.putDefinition({
    tenantKey: "t",
    definition: definition([{ name: "deploy", payloadJson: `{"ref":"{{ context.payload.ref }}"}` }], { id: "deploy" }),
  });
  await triggers.put("t", { name: "on-push", type: TriggerType.WEBHOOK, action: Action.START, definitionId: "deploy", secret: SECRET });
  await triggers.put("t", { name: "approve", type: TriggerType.WEBHOOK, action: Action.SIGNAL, event: "approved", runIdPath: "run.id", secret: SECRET });
});

describe("a signed webhook", () => {
  it("starts a run of the trigger's definition, with the payload in its context, whose directory row names the trigger and the firing", async () => {
    const body = '{"ref": "main",\n "sha": "abc"}';
    const sent = Date.UTC(2026, 10, 30, 8, 0, 0);
    const res = await deliver(url, "t", "on-push", body, { secret: SECRET, delivery: "d-1", date: new Date(sent).toUTCString() });
    expect(res.status).toBe(202);
    expect(res.body.outcome).toBe("started");
    const runId = res.body.run_id!;
    const run = await dag.get("t", runId);
    expect(JSON.parse(run.contextJson)).toEqual({
      payload: { ref: "main", sha: "abc" },
      trigger: { name: "on-push", firing_id: res.body.firing_id, fired_on: msToNs(sent).toString() },
    });
    const f = await firing(res.body.firing_id!);
    expect(f).toMatchObject({
      trigger_name: "on-push",
      trigger_type: "webhook",
      payload: body,
      action: "start",
      definition_id: "deploy",
      event: null,
      run_id: runId,
      outcome: "started",
      error: null,
    });
    // The source's time (its Date header), not the daemon's.
    expect(f.fired_on).toBe(msToNs(sent).toString());
    const dir = await fx.db.raw(`SELECT engine_kind, definition_id, triggered_by, trigger_firing_id FROM ${table("engine_run")} WHERE run_id = $1`, [runId]);
    expect(dir).toEqual([{ engine_kind: "dag", definition_id: "deploy", triggered_by: "on-push", trigger_firing_id: res.body.firing_id }]);
  });

  it("acts once per delivery id: a replay is refused (409), recorded, and starts nothing", async () => {
    const runs = await count("run");
    const body = '{"ref": "release"}';
    const first = await deliver(url, "t", "on-push", body, { secret: SECRET, delivery: "d-2" });
    expect(first.status).toBe(202);
    const again = await deliver(url, "t", "on-push", body, { secret: SECRET, delivery: "d-2" });
    expect(again.status).toBe(409);
    expect(again.body.outcome).toBe("refused");
    expect(await count("run")).toBe(runs + 1);
    const f = await firing(again.body.firing_id!);
    // A replay proves only that someone saw the delivery: its body is kept as one that proved nothing.
    expect(f).toMatchObject({ outcome: "refused", action: "start", definition_id: "deploy", run_id: null, payload: unverified(body) });
    expect(f.error).toMatch(/delivery 'd-2' was already acted on \(firing \w+\)/);
  });

  it("signals the run its body names, which moves on; the firing records the run it moved", async () => {
    const def = definition([{ name: "approval", wait: true, event: "approved" }]);
    const run = await dag.start("t", def);
    const body = JSON.stringify({ run: { id: run.id }, by: "ann" });
    const res = await deliver(url, "t", "approve", body, { secret: SECRET });
    expect(res.status).toBe(202);
    expect(res.body).toMatchObject({ outcome: "signalled", run_id: run.id });
    const done = await dag.until("t", run.id, RunStatus.COMPLETED);
    expect(JSON.parse(done.contextJson).approval).toEqual({ run: { id: run.id }, by: "ann" });
    expect(await firing(res.body.firing_id!)).toMatchObject({ action: "signal", event: "approved", run_id: run.id, outcome: "signalled" });
  });
});

describe("refused webhooks are answered and recorded, and change nothing else", () => {
  const refused = async (res: Awaited<ReturnType<typeof deliver>>, status: number, error: RegExp) => {
    expect(res.status).toBe(status);
    expect(res.body.outcome).toBe("refused");
    const f = await firing(res.body.firing_id!);
    expect(f.outcome).toBe("refused");
    expect(f.run_id).toBeNull();
    expect(f.error).toMatch(error);
    return f;
  };

  it("a wrong signature, or none, is 401 and recorded with the action it was meant to carry", async () => {
    const runs = await count("run");
    const wrong = await refused(await deliver(url, "t", "on-push", '{"ref":"x"}', { secret: "another-secret-entirely" }), 401, /X-Hub-Signature-256/);
    expect(wrong).toMatchObject({ trigger_name: "on-push", action: "start", definition_id: "deploy", payload: unverified('{"ref":"x"}') });
    await refused(await deliver(url, "t", "on-push", '{"ref":"x"}', { signature: null }), 401, /missing or is not/);
    await refused(await deliver(url, "t", "on-push", '{"ref":"x"}', { signature: "sha256=zz" }), 401, /missing or is not/);
    // A signature of another body (a tampered payload).
    const sig = (await import("./support/triggers.js")).sign(SECRET, '{"ref":"x"}');
    await refused(await deliver(url, "t", "on-push", '{"ref":"y"}', { signature: sig }), 401, /HMAC/);
    expect(await count("run")).toBe(runs);
  });

  it("an unknown trigger is 404 and recorded under the name it was sent to; under a tenant with no webhook trigger it is not recorded", async () => {
    const f = await refused(await deliver(url, "t", "no-such-hook", '{"a":1}', { secret: SECRET }), 404, /has no webhook trigger 'no-such-hook'/);
    expect(f).toMatchObject({ trigger_name: "no-such-hook", trigger_type: "webhook", action: null, payload: unverified('{"a":1}') });
    // Another tenant's trigger of the same name is unknown here, and that tenant has no log to fill.
    const before = await count("trigger_firing");
    const other = await deliver(url, "other", "on-push", '{"a":1}', { secret: SECRET });
    expect(other.status).toBe(404);
    expect(other.body).toMatchObject({ outcome: "refused", error: expect.stringMatching(/tenant 'other' has no webhook trigger/) });
    expect(other.body.firing_id).toBeUndefined();
    expect(await count("trigger_firing")).toBe(before);
  });

  it("a body over --webhook-max-bytes is 413 and recorded without its payload", async () => {
    const big = JSON.stringify({ pad: "x".repeat(MAX) });
    const f = await refused(await deliver(url, "t", "on-push", big, { secret: SECRET }), 413, /over --webhook-max-bytes \(2048 bytes\)/);
    expect(f.payload).toBeNull();
    expect(f.action).toBe("start");
  });

  it("a signed body that is not JSON is 400 and recorded as it arrived", async () => {
    const f = await refused(await deliver(url, "t", "on-push", "ref=main&x=1", { secret: SECRET }), 400, /not valid JSON: expected a value at position 0/);
    expect(f.payload).toBe("ref=main&x=1");
  });

  it("a signal to an unknown run, to another owner's run, without a run id, or that no node waits for is refused with what it meant to do", async () => {
    const unknown = await refused(await deliver(url, "t", "approve", '{"run":{"id":"01NOSUCHRUN"}}', { secret: SECRET }), 404, /has no run '01NOSUCHRUN'/);
    expect(unknown).toMatchObject({ action: "signal", event: "approved" });
    const others = await new DagClient(D.address, TOKENS.runs2).start("t", definition([{ name: "approval", wait: true, event: "approved" }]));
    await refused(await deliver(url, "t", "approve", JSON.stringify({ run: { id: others.id } }), { secret: SECRET }), 404, /has no run/);
    await refused(await deliver(url, "t", "approve", '{"nothing":1}', { secret: SECRET }), 404, /no run id at 'run.id'/);
    const noWait = await dag.start("t", definition([{ name: "only" }]));
    await refused(
      await deliver(url, "t", "approve", JSON.stringify({ run: { id: noWait.id } }), { secret: SECRET }),
      422,
      /no wait node .* waits for 'approved'/,
    );
    // None of these moved the run a replay would have been refused for: each can be delivered again once fixed.
    // (The other keys there are the three acted-on bodies' digests, which hold a space: src/triggers/signature.ts.)
    expect(await fx.db.raw(`SELECT delivery_id FROM ${table("trigger_delivery")} WHERE delivery_id NOT LIKE '% %' ORDER BY delivery_id`)).toEqual([
      { delivery_id: "d-1" },
      { delivery_id: "d-2" },
    ]);
    expect(await count("trigger_delivery")).toBe(5);
  });

  it("a request that names no trigger, or does not POST, is answered and not recorded", async () => {
    const before = await count("trigger_firing");
    expect((await fetch(`${url}/hooks/t`, { method: "POST", body: "{}" })).status).toBe(404);
    expect((await fetch(`${url}/hooks/t/a/b`, { method: "POST", body: "{}" })).status).toBe(404);
    const get = await fetch(`${url}/hooks/t/on-push`);
    expect(get.status).toBe(405);
    expect(get.headers.get("allow")).toBe("POST");
    expect(await count("trigger_firing")).toBe(before);
  });
});

describe("the firing log", () => {
  it("answers the entity reference's two queries: a run traced back to its cause, and the firings that caused nothing", async () => {
    const firings = fx.db.tables.qualified("trigger_firing");
    const runs = fx.db.tables.qualified("engine_run");
    const traced = await fx.db.raw<{ run_id: string; engine_kind: string; definition_id: string; outcome: string; payload: string }>(
      `SELECT r.run_id, r.engine_kind, r.definition_id, f.outcome, f.payload
         FROM ${runs} r JOIN ${firings} f ON f.id = r.trigger_firing_id
        WHERE r.triggered_by = 'on-push' ORDER BY r.createdon DESC`,
    );
    const started = await fx.db.raw<{ run_id: string; payload: string }>(`SELECT run_id, payload FROM ${firings} WHERE outcome = 'started' ORDER BY id DESC`);
    // (The fake clock gives both runs one createdon, so the query's order between them is a tie.)
    const byRun = (a: { run_id: string }, b: { run_id: string }) => a.run_id.localeCompare(b.run_id);
    expect(traced.sort(byRun).map((r) => [r.run_id, r.engine_kind, r.definition_id, r.outcome, r.payload])).toEqual(
      started.sort(byRun).map((f) => [f.run_id, "dag", "deploy", "started", f.payload]),
    );
    expect(traced).toHaveLength(2);

    const nothing = await fx.db.raw<{ trigger_name: string; outcome: string; error: string }>(
      `SELECT trigger_name, outcome, error, fired_on FROM ${firings} WHERE outcome IN ('refused', 'failed') ORDER BY fired_on DESC`,
    );
    const all = await fx.db.raw<{ n: string }>(`SELECT count(*) AS n FROM ${firings} WHERE run_id IS NULL`);
    expect(nothing).toHaveLength(Number(all[0]!.n));
    expect(nothing.length).toBeGreaterThanOrEqual(12);
    expect(nothing.every((r) => r.outcome === "refused" && r.error.length > 0)).toBe(true);
    expect(new Set(nothing.map((r) => r.trigger_name))).toEqual(new Set(["on-push", "approve", "no-such-hook"]));
  });

  it("counts each firing by type and outcome", async () => {
    const m = (await D.metrics.registry.getMetricsAsJSON()).find((x) => x.name === "aiflow_trigger_firings_total")!;
    const at = (outcome: string) => m.values.find((v) => v.labels.type === "webhook" && v.labels.outcome === outcome)?.value;
    const recorded = async (outcome: string) =>
      Number((await fx.db.raw<{ n: string }>(`SELECT count(*) AS n FROM ${table("trigger_firing")} WHERE outcome = $1`, [outcome]))[0]!.n);
    expect(at("started")).toBe(2);
    expect(at("signalled")).toBe(1);
    expect(at("refused")).toBe(await recorded("refused"));
    expect(await recorded("started")).toBe(2);
  });
});
