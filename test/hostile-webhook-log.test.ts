/**
 * What unauthenticated webhook traffic may write to the firing log (issue 51, item 6), over HTTP/1.1
 * to the daemon's HTTP port. A delivery that proved nothing (no or a bad signature, an unknown
 * trigger) is recorded with its body's size, SHA-256 and first KiB, only under a tenant this daemon
 * serves webhooks for, and at most so many a minute per trigger (per tenant for unknown names);
 * past that, and for other tenants, it is answered and counted, not stored. A signed delivery keeps
 * its whole body. The address throttle is set out of reach, so the bounds shown are the log's own.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Action, TriggerType } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { DagClient, definition } from "./support/dag.js";
import { counterValue, githubSignature, post, sha256Hex } from "./support/hostile-webhook.js";
import { useTestDb } from "./support/kit.js";
import { TriggerClient } from "./support/triggers.js";

const clock = new FakeClock(Date.UTC(2026, 11, 1, 12));
const fx = useTestDb("hooklog");
const SECRET = "the-secret-of-the-logged-hook";
// The documented figures: refused deliveries recorded per trigger a minute, and bytes of an unverified body kept.
const CAP = 10;
const UNVERIFIED_PREFIX_BYTES = 1024;
let D: Daemon;

const rows = async (where: string, values: unknown[] = []) =>
  (
    await fx.db.raw<{ n: string; bytes: string | null }>(
      `SELECT count(*) AS n, sum(octet_length(payload)) AS bytes FROM ${fx.db.tables.qualified("trigger_firing")} WHERE ${where}`,
      values,
    )
  )[0]!;
const count = async (where: string, values: unknown[] = []) => Number((await rows(where, values)).n);
const payloadOf = async (id: string) =>
  (await fx.db.raw<{ payload: string | null }>(`SELECT payload FROM ${fx.db.tables.qualified("trigger_firing")} WHERE id = $1`, [id]))[0]!.payload;
const unrecorded = (reason: string) => counterValue(D, "aiflow_webhook_refusals_total", { reason, recorded: "false" });

beforeAll(async () => {
  D = await fx.startDaemon({
    clock,
    config: { sweepInterval: 3_600_000, webhookMaxBytes: 256 * 1024, httpListen: { host: "127.0.0.1", port: 0 }, authFailureLimit: 1_000_000 },
  });
  const dag = fx.closers.add(new DagClient(D.address));
  for (const tenantKey of ["t", "cron-only"])
    await dag.dag.putDefinition({ tenantKey, definition: definition([{ name: "w", wait: true, event: "never" }], { id: "d" }) });
  const triggers = fx.closers.add(new TriggerClient(D.address));
  for (const name of ["h", "capped", "whole"])
    await triggers.put("t", { name, type: TriggerType.WEBHOOK, action: Action.START, definitionId: "d", secret: SECRET });
  // A tenant with only a cron trigger serves no webhook.
  await triggers.put("cron-only", { name: "nightly", type: TriggerType.CRON, action: Action.START, definitionId: "d", schedule: "0 2 * * *" });
});

describe("a delivery that proved nothing", () => {
  it("is recorded with its body's size, SHA-256 and first KiB, not the body (unsigned, wrongly signed, or to an unknown trigger)", async () => {
    const body = JSON.stringify({ pad: "x".repeat(50_000), tail: "secret-at-the-end" });
    const sent = [
      await post(D.httpUrl!, "t", "h", body),
      await post(D.httpUrl!, "t", "h", body, githubSignature("not-the-secret-at-all", body)),
      await post(D.httpUrl!, "t", "no-such-hook", body, githubSignature(SECRET, body)),
    ];
    expect(sent.map((s) => s.status)).toEqual([401, 401, 404]);
    for (const s of sent) {
      const payload = (await payloadOf(s.body.firing_id!))!;
      expect(JSON.parse(payload)).toEqual({
        unverified_body: { bytes: body.length, sha256: sha256Hex(body), first_1024_bytes: body.slice(0, UNVERIFIED_PREFIX_BYTES) },
      });
      expect(payload).not.toContain("secret-at-the-end");
      expect(Buffer.byteLength(payload)).toBeLessThan(UNVERIFIED_PREFIX_BYTES + 200);
    }
  });

  it("is not recorded at all under a tenant this daemon serves no webhook for, only counted", async () => {
    const before = await unrecorded("unknown_trigger");
    for (const tenant of ["nobody", "cron-only"]) {
      const res = await post(D.httpUrl!, tenant, "nightly", '{"a":1}', githubSignature(SECRET, '{"a":1}'));
      expect(res.status).toBe(404);
      expect(res.body.firing_id).toBeUndefined();
      expect(res.body.recorded).toBe(false);
      expect(await count("tenant_key = $1", [tenant])).toBe(0);
    }
    expect(await unrecorded("unknown_trigger")).toBe(before + 2);
  });

  it(`past ${CAP} a minute per trigger (per tenant for unknown names) is answered and counted, not stored; the next minute stores again`, async () => {
    clock.advance(60_000);
    const N = 4 * CAP;
    const body = JSON.stringify({ pad: "y".repeat(10_000) });
    const capped = await count("trigger_name = 'capped'");
    const unknown = await count("tenant_key = 't' AND trigger_name LIKE 'guess-%'");
    const before = { unsigned: await unrecorded("unsigned"), unknown: await unrecorded("unknown_trigger") };
    for (let i = 0; i < N; i++) {
      expect((await post(D.httpUrl!, "t", "capped", body)).status).toBe(401);
      expect((await post(D.httpUrl!, "t", `guess-${i}`, body)).status).toBe(404);
    }
    expect(await count("trigger_name = 'capped'")).toBe(capped + CAP);
    expect(await count("tenant_key = 't' AND trigger_name LIKE 'guess-%'")).toBe(unknown + CAP);
    expect(await unrecorded("unsigned")).toBe(before.unsigned + N - CAP);
    expect(await unrecorded("unknown_trigger")).toBe(before.unknown + N - CAP);
    // What 2N deliveries of 10 KB wrote: 2·CAP rows of about a KiB each.
    expect(Number((await rows("trigger_name = 'capped' OR trigger_name LIKE 'guess-%'")).bytes)).toBeLessThan(2 * CAP * (UNVERIFIED_PREFIX_BYTES + 200));
    clock.advance(60_000);
    expect((await post(D.httpUrl!, "t", "capped", body)).body.firing_id).toBeDefined();
    expect(await count("trigger_name = 'capped'")).toBe(capped + CAP + 1);
  });
});

describe("a signed delivery", () => {
  it("keeps its whole body, refused or not, uncapped", async () => {
    const body = JSON.stringify({ pad: "z".repeat(50_000) });
    const ok = await post(D.httpUrl!, "t", "whole", body, githubSignature(SECRET, body));
    expect(ok.status).toBe(202);
    expect(await payloadOf(ok.body.firing_id!)).toBe(body);
    // Refused by the action, not the edge (a body that is not JSON): the sender proved the secret.
    for (let i = 0; i < CAP + 2; i++) {
      const bad = `not json ${i} ${"q".repeat(5_000)}`;
      const res = await post(D.httpUrl!, "t", "whole", bad, githubSignature(SECRET, bad));
      expect(res.status).toBe(400);
      expect(await payloadOf(res.body.firing_id!)).toBe(bad);
    }
  });
});
