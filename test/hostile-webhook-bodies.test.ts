/**
 * Malformed webhook bodies (issue 51, item 7), over HTTP/1.1 to the daemon's HTTP port: a raw NUL,
 * a NUL or lone surrogate escaped, a lone surrogate's raw bytes, invalid UTF-8, 8,000 levels of
 * nesting. None is a 500. Unsigned, each is 401 and recorded as a delivery that proved nothing;
 * signed, each is 400 with the JSON check StartRun uses (one place: src/rpc/input/json-text.ts),
 * recorded as a refused firing that keeps the whole body (as base64 where the text cannot be
 * stored as it came), counted, and starts nothing.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Action, TriggerType } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { DagClient, definition } from "./support/dag.js";
import { counterValue, githubSignature, post, sha256Hex, stampedSignature } from "./support/hostile-webhook.js";
import { useTestDb } from "./support/kit.js";
import { TriggerClient } from "./support/triggers.js";

const clock = new FakeClock(Date.UTC(2026, 11, 1, 12));
const fx = useTestDb("hookbodies");
const SECRET = "the-secret-of-the-malformed-hook";
let D: Daemon;

const b = (...parts: (string | number[])[]) => Buffer.concat(parts.map((p) => (typeof p === "string" ? Buffer.from(p, "utf8") : Buffer.from(p))));
const DEEP = 8_000;
/** Each a distinct body (so no refusal is a replay of another). */
const BODIES: Record<string, Buffer> = {
  "a raw NUL after the value": b('{"a":1}', [0]),
  "a raw NUL in a string": b('{"a":"x', [0], 'y"}'),
  "an escaped NUL": b('{"a":"\\u0000"}'),
  "an escaped lone surrogate": b('{"a":"\\ud800"}'),
  "a lone surrogate's raw bytes": b('{"a":"', [0xed, 0xa0, 0x80], '"}'),
  "invalid UTF-8": b('{"a":"', [0xff, 0xfe], '"}'),
  "8,000 levels of arrays": b("[".repeat(DEEP), "]".repeat(DEEP)),
  "8,000 levels of objects": b('{"a":'.repeat(DEEP), "1", "}".repeat(DEEP)),
};
/** Bodies whose text Postgres can store as it came; the others are kept as base64. */
const STORABLE = new Set(["an escaped NUL", "an escaped lone surrogate", "8,000 levels of arrays", "8,000 levels of objects"]);

const firing = async (id: string) =>
  (
    await fx.db.raw<{ outcome: string; payload: string | null; error: string | null }>(
      `SELECT * FROM ${fx.db.tables.qualified("trigger_firing")} WHERE id = $1`,
      [id],
    )
  )[0]!;
const runs = async () => Number((await fx.db.raw<{ n: string }>(`SELECT count(*) AS n FROM ${fx.db.tables.qualified("engine_run")}`))[0]!.n);

beforeAll(async () => {
  D = await fx.startDaemon({
    clock,
    config: { sweepInterval: 3_600_000, webhookMaxBytes: 256 * 1024, httpListen: { host: "127.0.0.1", port: 0 }, authFailureLimit: 1_000_000 },
  });
  await fx.closers
    .add(new DagClient(D.address))
    .dag.putDefinition({ tenantKey: "t", definition: definition([{ name: "w", wait: true, event: "never" }], { id: "d" }) });
  const triggers = fx.closers.add(new TriggerClient(D.address));
  for (const name of ["unsigned", "github", "stamped"])
    await triggers.put("t", { name, type: TriggerType.WEBHOOK, action: Action.START, definitionId: "d", secret: SECRET });
});

describe("a malformed webhook body is a 4xx, never a 500", () => {
  it("unsigned: 401, recorded by its size, digest and first KiB", async () => {
    for (const [what, body] of Object.entries(BODIES)) {
      const res = await post(D.httpUrl!, "t", "unsigned", body);
      expect(res.status, what).toBe(401);
      const f = await firing(res.body.firing_id!);
      expect(JSON.parse(f.payload!).unverified_body, what).toMatchObject({ bytes: body.length, sha256: sha256Hex(body) });
    }
  });

  it("signed (GitHub's form and the signed-timestamp form): 400, recorded whole with why, counted, and no run", async () => {
    const before = { runs: await runs(), counted: await counterValue(D, "aiflow_webhook_refusals_total", { reason: "bad_body", recorded: "true" }) };
    let sent = 0;
    for (const [name, sign] of [
      ["github", (body: Buffer) => githubSignature(SECRET, body)],
      ["stamped", (body: Buffer) => stampedSignature(SECRET, Math.floor(clock.nowMs() / 1000), body)],
    ] as const) {
      for (const [what, body] of Object.entries(BODIES)) {
        const res = await post(D.httpUrl!, "t", name, body, sign(body));
        sent++;
        expect(res.status, `${name}: ${what}`).toBe(400);
        expect(res.body.outcome).toBe("refused");
        const f = await firing(res.body.firing_id!);
        expect(f.outcome).toBe("refused");
        expect(f.error, what).toMatch(/the body is not (valid JSON|UTF-8)/);
        if (STORABLE.has(what)) expect(f.payload, what).toBe(body.toString("utf8"));
        else expect(JSON.parse(f.payload!), what).toEqual({ body: { bytes: body.length, sha256: sha256Hex(body), base64: body.toString("base64") } });
      }
    }
    expect(await runs()).toBe(before.runs);
    expect(await counterValue(D, "aiflow_webhook_refusals_total", { reason: "bad_body", recorded: "true" })).toBe(before.counted + sent);
  });
});
