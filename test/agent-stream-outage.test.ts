/**
 * The agent stream through a database outage: a statement that fails because the database is away
 * does not end the agent's session. The session keeps its stream, its credits and the items it
 * pushed; what the agent sent meanwhile is applied, in order, once the database is back, and
 * pushes go on on the same stream. (Ending the session made the agent reconnect at the worst
 * moment, and a client that missed that end waited on its stream forever.)
 * The daemon reaches Postgres through a proxy that cuts its connections and refuses new ones.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import type { Daemon } from "../src/daemon.js";
import { captureLog } from "./support/agents.js";
import { AgentStream } from "./support/agent-stream.js";
import { useTestDb, until } from "./support/kit.js";
import { OpsTestAgent } from "./support/ops.js";
import { Producer } from "./support/queue.js";
import { startTcpProxy, type TcpProxy } from "./support/tcp-proxy.js";

const fx = useTestDb("streamout");
const captured = captureLog("warn");
let proxy: TcpProxy;
let daemon: Daemon;

beforeAll(async () => {
  proxy = await startTcpProxy(fx.db.url);
  fx.closers.defer(() => proxy.close());
  daemon = await fx.startDaemon({ log: captured.log, config: { databaseUrl: proxy.url, dbPoolSize: 2, heartbeatInterval: 60_000, sweepInterval: 60_000 } });
});

const waitedForDatabase = () => captured.lines().some((l) => l.msg === "database unavailable: agent streams keep their sessions and try again");

describe("the agent stream while the database is away", () => {
  it("keeps the session: a completion sent during the outage is answered on the same stream after it, and pushes go on", async () => {
    const tenant = "stream-outage";
    const producer = new Producer(daemon.address);
    fx.closers.add(producer.conn);
    const agent = await OpsTestAgent.register(daemon.address, "stream-outage-a", { tenants: [tenant], engineKinds: ["k"] });
    fx.closers.add({ close: () => agent.close() });
    const stream = new AgentStream(agent.s.client, agent.name, { credits: 1 });
    await stream.next("the status", (r) => r.status === AgentStatus.ACTIVE);
    const first = await producer.one(tenant, { engineKind: "k", payloadJson: "{}" });
    const [pushed] = await stream.itemsAtLeast(1);
    expect(pushed!.id).toBe(first);

    // The database goes away; the completion's statement fails, and the session waits for it.
    proxy.refuse("close");
    proxy.cut();
    stream.complete([pushed!]);
    let ended = false;
    void stream.ended.then(() => (ended = true));
    await until("the session tried the completion and waited for the database (or the stream ended)", () => waitedForDatabase() || ended);
    expect(ended).toBe(false);

    proxy.refuse(null);
    const answered = await stream.next("the completion's outcome", (r) => r.completionOutcomes.length > 0);
    expect(answered.completionOutcomes).toEqual([expect.objectContaining({ workItemId: first, ok: true })]);
    // The credit the completion freed is still the session's: the next item comes on the same stream.
    stream.credit(1);
    const second = await producer.one(tenant, { engineKind: "k", payloadJson: "{}" });
    await stream.itemsAtLeast(2);
    expect(stream.items.map((i) => i.id)).toEqual([first, second]);
    expect(ended).toBe(false);
    stream.goodbye();
    expect(await stream.ended).toBeUndefined();
  });
});
