/**
 * The trace context an Enqueue hands to its items, on a daemon that does not trace (no tracer
 * provider in this process): the producer's own `traceparent` is stored with every item of the call
 * and comes back on every claim of every attempt, handed over to a waiting claim or claimed by a
 * statement, and on GetItem. What W3C Trace Context says a receiver ignores is ignored, never refused.
 * The daemon that traces (its own spans as the stored parent) is test/tracing.test.ts.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { trace } from "@opentelemetry/api";
import { tracingActive } from "../src/observability/tracing.js";
import { serverNow, STATEMENT, untilStatementRan, type Producer } from "./support/queue.js";
import { CAP, useQueueDaemon } from "./support/queue-daemon.js";

const fx = useQueueDaemon("tracectx");
const { agent } = fx;
let p: Producer;
beforeAll(() => void ({ p } = fx));

const TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN = "00f067aa0ba902b7";
const PARENT = `00-${TRACE}-${SPAN}-01`;

/** Enqueues `n` items of engine kind dag into `tenant`, the call carrying `headers` besides its token. */
async function enqueueWith(tenant: string, headers: Record<string, string>, n = 1): Promise<string[]> {
  const res = await p.q.enqueue(
    { tenantKey: tenant, items: Array.from({ length: n }, () => ({ engineKind: "dag", maxRetries: 1 })) },
    { headers: { ...p.call.headers, ...headers } },
  );
  return res.results.map((r) => r.id);
}

describe("the traceparent an Enqueue carries", () => {
  it("is not this process's: no tracer provider is registered, so the daemon runs untraced", () => {
    expect(tracingActive()).toBe(false);
    expect(trace.getTracer("t").startSpan("s").isRecording()).toBe(false);
  });

  it("is stored with every item of the call and handed to the agent by the claim, and read back by GetItem", async () => {
    const t = "ctx-claimed";
    const a = await agent("ctx-claimed-a", { tenants: [t] });
    const ids = await enqueueWith(t, { traceparent: PARENT, tracestate: "vendor=x" }, 2);
    const claimed = await a.claim(2);
    expect(claimed.map((c) => c.id).sort()).toEqual([...ids].sort());
    expect(claimed.map((c) => c.traceContext)).toEqual([PARENT, PARENT]);
    expect((await p.item(t, ids[0]!)).traceContext).toBe(PARENT);
  });

  it("comes with an item handed over to a claim that was waiting when it was enqueued", async () => {
    const t = "ctx-handed";
    const a = await agent("ctx-handed-a", { tenants: [t] });
    const since = await serverNow(fx.db);
    const waiting = a.claim(1, 60_000);
    await untilStatementRan(fx.db, STATEMENT.claim, since);
    const [first, second] = await enqueueWith(t, { traceparent: PARENT }, 2);
    const [item] = await waiting;
    expect(item).toMatchObject({ id: first, traceContext: PARENT });
    // Handed over by the insert, not claimed by a statement: both rows are still as the insert wrote them.
    const xmins = await fx.db.raw<{ v: string }>(`SELECT xmin::text AS v FROM ${fx.db.tables.qualified("work_item")} WHERE id = ANY($1)`, [[first, second]]);
    expect(new Set(xmins.map((x) => x.v)).size).toBe(1);
  });

  it("comes back on every later attempt: a retry and a release hand out the same context", async () => {
    const t = "ctx-attempts";
    const a = await agent("ctx-attempts-a", { tenants: [t] });
    const [id] = await enqueueWith(t, { traceparent: PARENT });
    const [first] = await a.claim(1);
    await a.fail([first!], { retryable: true });
    fx.clock.advance(CAP);
    const [second] = await a.claim(1);
    expect(second).toMatchObject({ id, retryCount: 1, traceContext: PARENT });
    await a.release([second!]);
    const [third] = await a.claim(1);
    expect(third).toMatchObject({ id, retryCount: 1, traceContext: PARENT });
  });

  it("of a later version is stored as version 00 of its first four fields", async () => {
    const t = "ctx-version";
    const a = await agent("ctx-version-a", { tenants: [t] });
    await enqueueWith(t, { traceparent: `cc-${TRACE}-${SPAN}-01-what-comes-later` });
    const [item] = await a.claim(1);
    expect(item!.traceContext).toBe(PARENT);
  });

  it.each([
    ["an all-zero trace id", `00-${"0".repeat(32)}-${SPAN}-01`],
    ["an all-zero span id", `00-${TRACE}-${"0".repeat(16)}-01`],
    ["upper-case hex", PARENT.toUpperCase()],
    ["version ff", `ff-${TRACE}-${SPAN}-01`],
    ["version 00 with more fields", `${PARENT}-more`],
    ["not one at all", "hello"],
  ])("is ignored when it is not valid (%s): the call succeeds and its items carry none", async (_, bad) => {
    const t = `ctx-bad-${bad.length}-${bad.charCodeAt(0)}`;
    const a = await agent(`${t}-a`, { tenants: [t] });
    const [id] = await enqueueWith(t, { traceparent: bad });
    const [item] = await a.claim(1);
    expect(item).toMatchObject({ id, traceContext: "" });
  });

  it("is absent when the call carries none", async () => {
    const t = "ctx-none";
    const a = await agent("ctx-none-a", { tenants: [t] });
    const [id] = await enqueueWith(t, {});
    const [item] = await a.claim(1);
    expect(item).toMatchObject({ id, traceContext: "" });
    expect((await p.item(t, id!)).traceContext).toBe("");
  });
});
