/**
 * Webhooks under faults and pressure: one delivery id raced through two daemons starts exactly one
 * run; with the database away a webhook is answered 503 and nothing is recorded, and the same
 * delivery goes through once it is back; an address that keeps sending unsigned or unknown-trigger
 * webhooks has its failing ones answered 429 unrecorded past --auth-failure-limit, until its window
 * ends, while its validly signed deliveries are served.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Action, TriggerType } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { DagClient, definition } from "./support/dag.js";
import { until, useTestDb } from "./support/kit.js";
import { startTcpProxy, type TcpProxy } from "./support/tcp-proxy.js";
import { deliver, TriggerClient, type Delivery } from "./support/triggers.js";

const clock = new FakeClock(Date.UTC(2026, 11, 1, 12));
const fx = useTestDb("hookfaults");
const SECRET = "the-secret-of-the-faults-hook";
const HTTP = { host: "127.0.0.1", port: 0 };
const config = { sweepInterval: 3_600_000, httpListen: HTTP, authFailureLimit: 3, authFailureWindow: 60_000 };
let A: Daemon;
let B: Daemon;

const count = async (where: string, values: unknown[] = []) =>
  Number((await fx.db.raw<{ n: string }>(`SELECT count(*) AS n FROM ${fx.db.tables.qualified("trigger_firing")} WHERE ${where}`, values))[0]!.n);

beforeAll(async () => {
  A = await fx.startDaemon({ clock, config });
  B = await fx.startDaemon({ clock, config });
  const dag = fx.closers.add(new DagClient(A.address));
  await dag.dag.putDefinition({ tenantKey: "t", definition: definition([{ name: "n", wait: true, event: "never" }], { id: "d" }) });
  await fx.closers
    .add(new TriggerClient(A.address))
    .put("t", { name: "h", type: TriggerType.WEBHOOK, action: Action.START, definitionId: "d", secret: SECRET });
});

describe("webhooks under faults", () => {
  it("one delivery id raced through two daemons starts exactly one run; the others are refused as replays", async () => {
    const answers = await Promise.all(
      Array.from({ length: 12 }, (_, i) => deliver((i % 2 ? A : B).httpUrl!, "t", "h", `{"i":${i}}`, { secret: SECRET, delivery: "raced" })),
    );
    const statuses = answers.map((a) => a.status).sort();
    expect(statuses).toEqual([202, ...Array(11).fill(409)]);
    const runs = await fx.db.raw(`SELECT run_id FROM ${fx.db.tables.qualified("engine_run")} WHERE triggered_by = 'h'`);
    expect(runs).toEqual([{ run_id: answers.find((a) => a.status === 202)!.body.run_id }]);
    expect(await count("outcome = 'started'")).toBe(1);
    expect(await count("outcome = 'refused' AND error LIKE '%already acted on%'")).toBe(11);
    // Distinct deliveries raced the same way each start their own run (distinct bodies too: under
    // GitHub's signature the body's digest is a replay key as well as the delivery id).
    const distinct = await Promise.all(
      Array.from({ length: 12 }, (_, i) => deliver((i % 2 ? A : B).httpUrl!, "t", "h", `{"own":${i}}`, { secret: SECRET, delivery: `own-${i}` })),
    );
    expect(distinct.map((a) => a.status)).toEqual(Array(12).fill(202));
    expect(new Set(distinct.map((a) => a.body.run_id)).size).toBe(12);
  });

  it("with the database away answers 503 and records nothing; the same delivery goes through once it is back", async () => {
    const proxy: TcpProxy = await startTcpProxy(fx.db.url);
    fx.closers.defer(() => proxy.close());
    const C = await fx.startDaemon({ clock, config: { ...config, databaseUrl: proxy.url, dbPoolSize: 2 } });
    const before = await count("true");
    proxy.refuse("close");
    proxy.cut();
    const away = await deliver(C.httpUrl!, "t", "h", '{"during":"outage"}', { secret: SECRET, delivery: "outage-1" });
    expect(away.status).toBe(503);
    expect(away.body.error).toMatch(/database is unavailable; nothing was recorded/);
    expect(await count("true")).toBe(before);
    proxy.refuse(null);
    let back: Delivery | undefined;
    await until(
      "the delivery goes through",
      async () => (back = await deliver(C.httpUrl!, "t", "h", '{"during":"outage"}', { secret: SECRET, delivery: "outage-1" })).status !== 503,
      20_000,
      50,
    );
    expect(back!.status).toBe(202);
    expect(await count("true")).toBe(before + 1);
  });

  it("an address past its limit of unsigned or unknown-trigger webhooks has its failing ones answered 429, unrecorded, until its window ends, and its signed ones served", async () => {
    // A new minute: the firing log's own bound per trigger (src/triggers/refusal-budget.ts) starts
    // afresh, so what is shown here is the address's limit alone.
    clock.advance(60_000);
    const before = await count("outcome = 'refused'");
    const unsigned = () => deliver(A.httpUrl!, "t", "h", "{}", { signature: null });
    // The limit is 3: the fourth takes the address over it, and is still recorded.
    for (let i = 0; i < 2; i++) expect((await unsigned()).status).toBe(401);
    expect((await deliver(A.httpUrl!, "t", "nope", "{}", { secret: SECRET })).status).toBe(404);
    expect((await unsigned()).status).toBe(401);
    // Past it, failures are refused unrecorded: unsigned, wrongly signed, to an unknown trigger...
    expect((await unsigned()).status).toBe(429);
    expect((await deliver(A.httpUrl!, "t", "h", '{"bad":1}', { secret: "not-the-secret" })).status).toBe(429);
    expect((await deliver(A.httpUrl!, "t", "nope", "{}", { secret: SECRET })).status).toBe(429);
    expect(await count("outcome = 'refused'")).toBe(before + 4);
    // ...while a sender that proves the secret (behind the same proxy or NAT, say) is served.
    const signedThrough = await deliver(A.httpUrl!, "t", "h", '{"while":"throttled"}', { secret: SECRET });
    expect(signedThrough.status).toBe(202);
    expect((await unsigned()).status).toBe(429);
    // Another daemon keeps its own count.
    expect((await deliver(B.httpUrl!, "t", "h", '{"on":"B"}', { secret: SECRET })).status).toBe(202);
    clock.advance(60_000);
    expect((await deliver(A.httpUrl!, "t", "h", '{"on":"A"}', { secret: SECRET })).status).toBe(202);
  });
});
