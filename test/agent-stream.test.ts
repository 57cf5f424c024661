/**
 * AgentService.Connect on one daemon: credits bound what is pushed; items come from the claim and
 * from the insert while the stream waits; reports are answered per item on the stream; the stream's
 * end decides what becomes of what it pushed; status and directives travel on it; a stock grpc-js
 * client can drive it.
 *
 * On the daemon of test/support/queue-daemon.ts (claimMaxItems 5, a fake clock).
 */
import http2 from "node:http2";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { beforeAll, describe, expect, it } from "vitest";
import { ConnectRequestSchema, ConnectResponseSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { Code } from "@connectrpc/connect";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { Daemon } from "../src/daemon.js";
import { TOKENS } from "./support/daemon.js";
import type { TestDb } from "./support/db.js";
import { until } from "./support/kit.js";
import { opsSession } from "./support/ops.js";
import { itemRow, statusCounts, type Producer } from "./support/queue.js";
import { ids, useQueueDaemon } from "./support/queue-daemon.js";
import { AgentStream } from "./support/agent-stream.js";
import { grpc, loadService, metadata } from "./support/grpc-js.js";

const fx = useQueueDaemon("qstream");
const { agent } = fx;
let db: TestDb, daemon: Daemon, p: Producer;
beforeAll(() => void ({ db, daemon, p } = fx));

/** aiflow_agent_stream_ends_total{how} on the daemon now. */
const ends = async (how: string) =>
  Number((await daemon.metrics.registry.getSingleMetric("aiflow_agent_stream_ends_total")?.get())?.values.find((v) => v.labels.how === how)?.value ?? 0);

const open = async (name: string, tenant: string, first: ConstructorParameters<typeof AgentStream>[2] = {}) => {
  const a = await agent(name, { tenants: [tenant] });
  const s = new AgentStream(a.conn.agent, name, first);
  await s.next("the status", (r) => r.status === AgentStatus.ACTIVE);
  return { a, s };
};

describe("the agent stream", () => {
  it("pushes no more items than the credits granted, and the rest as more are granted", async () => {
    const t = "stream-credits";
    await p.enqueue(
      t,
      Array.from({ length: 7 }, () => ({ engineKind: "dag" })),
    );
    const { s } = await open("stream-credits-a", t, { credits: 2 });
    await s.itemsAtLeast(2);
    await s.settled();
    expect(s.items).toHaveLength(2);
    expect(await statusCounts(db, t)).toEqual({ dispatched: 2, pending: 5 });
    // More than one claim's cap (5): the stream claims again while credits and work remain.
    s.credit(10);
    await s.itemsAtLeast(7);
    await s.settled();
    expect(new Set(ids(s.items)).size).toBe(7);
    expect(await statusCounts(db, t)).toEqual({ dispatched: 7 });
    expect(s.items.every((i) => i.leaseToken !== "" && i.agentId === "stream-credits-a")).toBe(true);
    s.goodbye();
  });

  it("drops the credits it has not used when the agent withdraws them, and pushes again on new ones", async () => {
    const t = "stream-withdraw";
    const { s } = await open("stream-withdraw-a", t, { credits: 3 });
    await s.settled();
    s.send({ withdrawCredits: true });
    await s.next("the withdrawal's answer", (r) => r.creditsWithdrawn);
    await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }]);
    await s.settled();
    expect(s.items).toHaveLength(0);
    expect(await statusCounts(db, t)).toEqual({ pending: 2 });
    s.credit(1);
    await s.itemsAtLeast(1);
    await s.settled();
    expect(s.items).toHaveLength(1);
    expect(await statusCounts(db, t)).toEqual({ dispatched: 1, pending: 1 });
    s.goodbye();
  });

  it("pushes an item enqueued while it waits, straight from the insert, within the credits left", async () => {
    const t = "stream-handoff";
    const { s } = await open("stream-handoff-a", t, { credits: 2 });
    await s.settled();
    expect(s.items).toHaveLength(0);
    const before = daemon.metrics.registry.getSingleMetric("aiflow_queue_direct_dispatches_total");
    const handedBefore = before ? Number((await before.get()).values[0]?.value ?? 0) : 0;
    await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }, { engineKind: "dag" }]);
    await s.itemsAtLeast(2);
    await s.settled();
    expect(s.items).toHaveLength(2);
    expect(await statusCounts(db, t)).toEqual({ dispatched: 2, pending: 1 });
    const after = daemon.metrics.registry.getSingleMetric("aiflow_queue_direct_dispatches_total")!;
    expect(Number((await after.get()).values[0]?.value ?? 0) - handedBefore).toBe(2);
    s.goodbye();
  });

  it("answers completions per item, fenced by the lease token; an invalid one is refused alone", async () => {
    const t = "stream-complete";
    await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }]);
    const { s } = await open("stream-complete-a", t, { credits: 2 });
    const [x, y] = await s.itemsAtLeast(2);
    s.send({
      completions: [
        { workItemId: x!.id, leaseToken: x!.leaseToken, resultJson: '{"ok":1}' },
        { workItemId: y!.id, leaseToken: "not-the-token", resultJson: "" },
        { workItemId: y!.id, leaseToken: y!.leaseToken, resultJson: "{not json" },
      ],
    });
    const refused = await s.next("the invalid completion's outcome", (r) => r.completionOutcomes.some((o) => o.code === Code.InvalidArgument));
    expect(refused.completionOutcomes.find((o) => o.code === Code.InvalidArgument)).toMatchObject({ workItemId: y!.id, ok: false });
    const answered = await s.next("the valid completions' outcomes", (r) => r.completionOutcomes.some((o) => o.workItemId === x!.id));
    expect(answered.completionOutcomes.map((o) => [o.workItemId, o.ok, o.code])).toEqual([
      [x!.id, true, 0],
      [y!.id, false, Code.FailedPrecondition],
    ]);
    expect((await itemRow(db, x!.id)).status).toBe("completed");
    expect((await itemRow(db, y!.id)).status).toBe("dispatched");
    s.goodbye();
  });

  it("gives back what it pushed and was not reported when the agent says goodbye, spending nothing", async () => {
    const t = "stream-goodbye";
    const [first] = await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }, { engineKind: "dag" }]);
    const { s } = await open("stream-goodbye-a", t, { credits: 3 });
    const items = await s.itemsAtLeast(3);
    const done = items.find((i) => i.id === first!.id)!;
    const goodbyes = await ends("goodbye");
    s.complete([done]);
    s.goodbye();
    expect(await s.ended).toBeUndefined();
    await until("the goodbye counted", async () => (await ends("goodbye")) === goodbyes + 1);
    // The completion sent before the goodbye was applied and answered.
    expect(s.responses.some((r) => r.completionOutcomes.some((o) => o.workItemId === done.id && o.ok))).toBe(true);
    for (const i of items.filter((i) => i.id !== done.id))
      expect(await itemRow(db, i.id)).toMatchObject({ status: "pending", redelivery_count: 0, lease_token: null, agent_id: null });
    expect((await itemRow(db, done.id)).status).toBe("completed");
  });

  it("requeues what it pushed at once when the stream breaks, one redelivery spent, and tells the holder", async () => {
    const t = "stream-broken";
    await p.enqueue(t, [{ engineKind: "dag" }, { engineKind: "dag" }]);
    const { a, s } = await open("stream-broken-a", t, { credits: 2 });
    const items = await s.itemsAtLeast(2);
    // A second stream of the same agent (its reconnection elsewhere, say) hears the revocations.
    const again = new AgentStream(a.conn.agent, a.name);
    await again.next("the status", (r) => r.status === AgentStatus.ACTIVE);
    const breaks = await ends("broken");
    s.break();
    await s.ended;
    await until("the break counted", async () => (await ends("broken")) === breaks + 1);
    for (const i of items) await until(`${i.id} requeued`, async () => (await itemRow(db, i.id)).status === "pending");
    for (const i of items) expect(await itemRow(db, i.id)).toMatchObject({ redelivery_count: 1, lease_token: null });
    const cancels = await again.next("the revocations", (r) => r.directives.filter((d) => d.kind.case === "cancel").length >= 1);
    expect(cancels.directives.some((d) => d.kind.case === "cancel" && items.some((i) => d.kind.case === "cancel" && i.id === d.kind.value.workItemId))).toBe(
      true,
    );
    again.goodbye();
  });

  it("takes a half-close without a goodbye as a break", async () => {
    const t = "stream-hangup";
    const [one] = await p.enqueue(t, [{ engineKind: "dag" }]);
    const { s } = await open("stream-hangup-a", t, { credits: 1 });
    await s.itemsAtLeast(1);
    s.hangUp();
    await s.ended;
    await until("requeued", async () => (await itemRow(db, one!.id)).status === "pending");
    expect((await itemRow(db, one!.id)).redelivery_count).toBe(1);
  });

  it("tells a drain and an undrain on the stream, and pushes nothing while draining", async () => {
    const t = "stream-drain";
    const { s } = await open("stream-drain-a", t, { credits: 4 });
    const ops = fx.closers.add(opsSession(daemon.address));
    await ops.client.drainAgent({ name: "stream-drain-a", reason: "deploy" }, ops.call);
    const drained = await s.next("the drain", (r) => r.status === AgentStatus.DRAINING);
    expect(drained.directives[0]?.kind.case).toBe("status");
    await p.enqueue(t, [{ engineKind: "dag" }]);
    await s.settled();
    expect(s.items).toHaveLength(0);
    expect(await statusCounts(db, t)).toEqual({ pending: 1 });
    await ops.client.undrainAgent({ name: "stream-drain-a" }, ops.call);
    await s.next("the undrain", (r) => r.status === AgentStatus.ACTIVE, s.responses.indexOf(drained) + 1);
    await s.itemsAtLeast(1);
    s.goodbye();
  });

  it("answers an agent that stopped reading its answers for a while every message, in order, once it reads again, and the stream works on", async () => {
    const name = "stream-slow-reader";
    await agent(name, { tenants: ["stream-slow"] });
    const session = http2.connect(`http://${daemon.address}`);
    session.on("error", () => {});
    const req = session.request({
      ":method": "POST",
      ":path": "/aiflow.cluster.v1.AgentService/Connect",
      "content-type": "application/grpc",
      te: "trailers",
      authorization: `Bearer ${TOKENS.agent}`,
    });
    req.on("error", () => {});
    // It reads nothing: every answer stays with the daemon (and in the windows between).
    req.pause();
    const frame = (m: Parameters<typeof create<typeof ConnectRequestSchema>>[1]) => {
      const bytes = toBinary(ConnectRequestSchema, create(ConnectRequestSchema, m));
      const out = Buffer.alloc(5 + bytes.length);
      out.writeUInt32BE(bytes.length, 1);
      out.set(bytes, 5);
      return out;
    };
    const N = 300;
    let flushed = 0;
    req.write(frame({ name }));
    // 300 messages of 300 releases each (about 20 kB, each answered with 300 outcomes): 6 MB in
    // all, far past what the HTTP/2 windows, the session's 16 unapplied messages and its 64 unsent
    // answers hold, so the daemon must stop and start again on both sides of the stream.
    for (let m = 0; m < N; m++) {
      const releases = Array.from({ length: 300 }, (_, i) => ({ workItemId: `01J${String(m * 300 + i).padStart(23, "0")}`, leaseToken: "t".repeat(24) }));
      req.write(frame({ releases }), () => flushed++);
    }
    for (let i = 0; i < 5; i++) await new Promise<void>((r) => session.ping(() => r()));
    // Reading again, the agent gets an answer for every message, in order, and the stream works on.
    let pending = Buffer.alloc(0);
    let answered = 0;
    req.on("data", (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      while (pending.length >= 5 && pending.length >= 5 + pending.readUInt32BE(1)) {
        const res = fromBinary(ConnectResponseSchema, pending.subarray(5, 5 + pending.readUInt32BE(1)));
        if (res.releaseOutcomes.length === 300) answered++;
        pending = pending.subarray(5 + pending.readUInt32BE(1));
      }
    });
    req.resume();
    await until("every message answered", () => answered === N, 30_000);
    expect(flushed).toBe(N);
    req.end(frame({ goodbye: true }));
    const trailers = await new Promise<http2.IncomingHttpHeaders>((r) => req.once("trailers", r));
    expect(trailers["grpc-status"]).toBe("0");
    session.close();
  });

  it("carries a cancellation of a pushed item to its holder", async () => {
    const t = "stream-cancel";
    const [one] = await p.enqueue(t, [{ engineKind: "dag" }]);
    const { s } = await open("stream-cancel-a", t, { credits: 1 });
    await s.itemsAtLeast(1);
    await p.cancel(t, [one!.id]);
    const res = await s.next("the cancel", (r) => r.directives.some((d) => d.kind.case === "cancel"));
    const d = res.directives.find((d) => d.kind.case === "cancel")!;
    expect(d.kind.case === "cancel" && d.kind.value).toMatchObject({ workItemId: one!.id, leaseToken: s.items[0]!.leaseToken });
    s.goodbye();
  });

  it("refuses credits past its limit and an invalid heartbeat with a reason, and goes on", async () => {
    const t = "stream-refusals";
    const { s } = await open("stream-refusals-a", t);
    s.send({ credits: 20_000 });
    expect((await s.next("the credits' refusal", (r) => r.refused !== "")).refused).toMatch(
      /^credits: 19740 of 20000 not granted \(agent .* registered 4 slots: at most 260 items/,
    );
    s.send({ heartbeat: { metrics: { cpuUtilization: 250 } } });
    expect((await s.next("the heartbeat's refusal", (r) => r.refused.startsWith("heartbeat"))).refused).toMatch(/cpu_utilization/);
    await p.enqueue(t, [{ engineKind: "dag" }]);
    await s.itemsAtLeast(1);
    s.goodbye();
    expect(await s.ended).toBeUndefined();
  });

  it("ends with NOT_FOUND for an agent that never registered, and INVALID_ARGUMENT for a message of another agent", async () => {
    const { a } = await open("stream-names-a", "stream-names");
    const ghost = new AgentStream(a.conn.agent, "stream-names-ghost");
    expect((await ghost.ended) as { code: Code }).toMatchObject({ code: Code.NotFound });
    const s = new AgentStream(a.conn.agent, a.name);
    s.send({ name: "stream-names-other", credits: 1 });
    expect((await s.ended) as { code: Code }).toMatchObject({ code: Code.InvalidArgument });
  });

  it("serves a stock grpc-js client", async () => {
    const t = "stream-grpc-js";
    await agent("stream-grpc-js-a", { tenants: [t] });
    const [one] = await p.enqueue(t, [{ engineKind: "dag" }]);
    const Client = loadService("aiflow/cluster/v1/agent.proto", "aiflow.cluster.v1.AgentService");
    const client = new Client(daemon.address, grpc.credentials.createInsecure());
    try {
      const call = (client as unknown as { connect(md: grpc.Metadata): unknown }).connect(metadata(TOKENS.agent)) as grpc.ClientDuplexStream<
        object,
        { items: { id: string; leaseToken: string }[]; completionOutcomes: { ok: boolean }[]; status: string }
      >;
      const seen: { items: { id: string; leaseToken: string }[]; completionOutcomes: { ok: boolean }[]; status: string }[] = [];
      call.on("data", (r) => seen.push(r));
      const ended = new Promise<grpc.StatusObject>((resolve) => call.on("status", resolve));
      call.write({ name: "stream-grpc-js-a", credits: 1 });
      await until("the item over grpc-js", () => seen.some((r) => r.items.length > 0));
      expect(seen[0]!.status).toBe("AGENT_STATUS_ACTIVE");
      const item = seen.flatMap((r) => r.items)[0]!;
      expect(item.id).toBe(one!.id);
      call.write({ completions: [{ workItemId: item.id, leaseToken: item.leaseToken }] });
      await until("the completion's outcome", () => seen.some((r) => r.completionOutcomes.length > 0));
      expect(seen.find((r) => r.completionOutcomes.length > 0)!.completionOutcomes[0]!.ok).toBe(true);
      call.write({ goodbye: true });
      call.end();
      expect((await ended).code).toBe(grpc.status.OK);
      expect((await itemRow(db, one!.id)).status).toBe("completed");
    } finally {
      client.close();
    }
  });
});
