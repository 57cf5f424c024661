/**
 * Replayed webhook deliveries (issue 51, item 5), over HTTP/1.1 to the daemon's HTTP port. A captured
 * signed delivery sent again — its delivery id removed or changed, its Date moved — starts nothing:
 * under GitHub's body-only signature a body acts once per trigger; under the signed-timestamp form
 * (X-Aiflow-Signature: t=…,v1=…) a delivery is accepted only within ±5 minutes of its signed time
 * and acts once within them. What a replay proves is only that someone once saw the delivery, so
 * its refusal keeps the body's size, digest and first KiB, not the body.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Action, TriggerType } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { FakeClock, msToNs } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { DagClient, definition } from "./support/dag.js";
import { githubSignature, post, sha256Hex, stampedSignature } from "./support/hostile-webhook.js";
import { useTestDb } from "./support/kit.js";
import { TriggerClient } from "./support/triggers.js";

const clock = new FakeClock(Date.UTC(2026, 11, 1, 12));
const fx = useTestDb("hookreplay");
const SECRET = "the-secret-of-the-replayed-hook";
let D: Daemon;

const runsOf = async (trigger: string) =>
  Number((await fx.db.raw<{ n: string }>(`SELECT count(*) AS n FROM ${fx.db.tables.qualified("engine_run")} WHERE triggered_by = $1`, [trigger]))[0]!.n);
const firing = async (id: string) =>
  (
    await fx.db.raw<{ outcome: string; payload: string | null; error: string | null; run_id: string | null }>(
      `SELECT * FROM ${fx.db.tables.qualified("trigger_firing")} WHERE id = $1`,
      [id],
    )
  )[0]!;
const nowSeconds = () => Math.floor(clock.nowMs() / 1000);

beforeAll(async () => {
  D = await fx.startDaemon({ clock, config: { sweepInterval: 3_600_000, httpListen: { host: "127.0.0.1", port: 0 }, authFailureLimit: 1_000_000 } });
  await fx.closers
    .add(new DagClient(D.address))
    .dag.putDefinition({ tenantKey: "t", definition: definition([{ name: "w", wait: true, event: "never" }], { id: "d" }) });
  const triggers = fx.closers.add(new TriggerClient(D.address));
  for (const name of ["gh", "stamped", "tampered"])
    await triggers.put("t", { name, type: TriggerType.WEBHOOK, action: Action.START, definitionId: "d", secret: SECRET });
});

describe("a replayed signed delivery starts no run", () => {
  it("GitHub's body-only signature: the same body again, with its delivery id removed or changed or its Date moved, is 409 and recorded without its body", async () => {
    const body = JSON.stringify({ ref: "refs/heads/main", after: "9f1c0de", pad: "p".repeat(4000) });
    const github = { ...githubSignature(SECRET, body), "x-github-event": "push" };
    const first = await post(D.httpUrl!, "t", "gh", body, { ...github, "x-github-delivery": "gh-1" });
    expect(first.status).toBe(202);
    const replays = [
      github,
      { ...github, "x-github-delivery": "gh-2" },
      { ...github, "x-delivery-id": "another-id" },
      { ...github, "x-github-delivery": "gh-3", date: new Date(clock.nowMs() + 86_400_000).toUTCString() },
    ];
    for (const headers of replays) {
      const again = await post(D.httpUrl!, "t", "gh", body, headers);
      expect(again.status).toBe(409);
      expect(again.body.error).toMatch(/already acted on/);
      const f = await firing(again.body.firing_id!);
      expect(f.outcome).toBe("refused");
      // The replayer proved nothing the first delivery had not: its size, digest and first KiB only.
      expect(JSON.parse(f.payload!)).toEqual({ unverified_body: { bytes: body.length, sha256: sha256Hex(body), first_1024_bytes: body.slice(0, 1024) } });
    }
    expect(await runsOf("gh")).toBe(1);
  });

  it("the signed-timestamp form: a replay inside the window is refused by its digest, outside it by its time; the same body signed anew acts again", async () => {
    const body = '{"deploy":"api"}';
    const t = nowSeconds();
    const signed = stampedSignature(SECRET, t, body);
    const first = await post(D.httpUrl!, "t", "stamped", body, { ...signed, "x-delivery-id": "s-1" });
    expect(first.status).toBe(202);
    // The source's time is the signed one.
    expect(
      (await fx.db.raw<{ fired_on: string }>(`SELECT fired_on FROM ${fx.db.tables.qualified("trigger_firing")} WHERE id = $1`, [first.body.firing_id]))[0]!
        .fired_on,
    ).toBe(msToNs(t * 1000).toString());
    for (const headers of [signed, { ...signed, "x-delivery-id": "s-2" }]) expect((await post(D.httpUrl!, "t", "stamped", body, headers)).status).toBe(409);
    clock.advance(301_000);
    const stale = await post(D.httpUrl!, "t", "stamped", body, { ...signed, "x-delivery-id": "s-3" });
    expect(stale.status).toBe(401);
    expect(stale.body.error).toMatch(/outside the ±300 s window/);
    // A sender that means it signs the same body at a new time: a new delivery.
    expect((await post(D.httpUrl!, "t", "stamped", body, stampedSignature(SECRET, nowSeconds(), body))).status).toBe(202);
    // A time too far ahead is refused too (it would outlive the window of its digest).
    expect((await post(D.httpUrl!, "t", "stamped", body, stampedSignature(SECRET, nowSeconds() + 301, body))).status).toBe(401);
    expect(await runsOf("stamped")).toBe(2);
  });

  it("a signed-timestamp header whose time or body was changed is 401, and a bad one is not rescued by a GitHub signature beside it", async () => {
    const body = '{"deploy":"web"}';
    const t = nowSeconds();
    const header = stampedSignature(SECRET, t, body)["x-aiflow-signature"]!;
    const moved = header.replace(`t=${t}`, `t=${t + 1}`);
    expect((await post(D.httpUrl!, "t", "tampered", body, { "x-aiflow-signature": moved })).status).toBe(401);
    expect((await post(D.httpUrl!, "t", "tampered", '{"deploy":"db"}', { "x-aiflow-signature": header })).status).toBe(401);
    expect((await post(D.httpUrl!, "t", "tampered", body, { "x-aiflow-signature": moved, ...githubSignature(SECRET, body) })).status).toBe(401);
    expect((await post(D.httpUrl!, "t", "tampered", body, { "x-aiflow-signature": "t=abc,v1=00" })).status).toBe(401);
    expect(await runsOf("tampered")).toBe(0);
  });
});
