import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { durationFromMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import type { TestDb } from "./support/db.js";
import { TOKENS } from "./support/daemon.js";
import { refusal, Session, useTestDaemon } from "./support/kit.js";
import { Producer } from "./support/queue.js";
import { OpsTestAgent, opsSession } from "./support/ops.js";

const clock = new FakeClock();
// The daemon migrates the schema itself.
const fx = useTestDaemon({ label: "opsedge", migrate: false, clock, config: { sweepInterval: 3_600_000 } });
const closers = fx.closers;
let db: TestDb;
let daemon: Daemon;
beforeAll(() => void ({ db, daemon } = fx));

const ops = () => closers.add(opsSession(daemon.address));

describe("ops edges", () => {
  it("a re-drain without a deadline keeps the deadline already set", async () => {
    closers.add(await OpsTestAgent.register(daemon.address, "edge-redrain", { tenants: ["t1"], engineKinds: ["k"] }));
    const o = ops();
    const first = await o.client.drainAgent({ name: "edge-redrain", deadline: durationFromMs(600_000), reason: "first" }, o.call);
    const deadline = timestampMs(first.agents[0]!.drain!.deadline!);
    const again = await o.client.drainAgent({ name: "edge-redrain", reason: "second" }, o.call);
    expect(again.agents[0]!.drain!.reason).toBe("second");
    expect(timestampMs(again.agents[0]!.drain!.deadline!)).toBe(deadline);
  });

  it("a removed agent holds nothing afterwards: its work is released and it cannot claim again", async () => {
    const agent = closers.add(await OpsTestAgent.register(daemon.address, "edge-remove", { tenants: ["t1"], engineKinds: ["k"] }));
    const producer = closers.add(new Producer(daemon.address));
    const [id] = await producer.ids("t1", [{ engineKind: "k" }]);
    expect((await agent.claim(1)).map((i) => i.id)).toEqual([id]);
    const o = ops();
    expect((await o.client.removeAgent({ name: "edge-remove", force: true }, o.call)).released).toBe(1);
    const rows = await db.raw<{ status: string; agent_id: string | null }>(`SELECT status, agent_id FROM "${db.schema}".aiflow_work_item WHERE id = $1`, [id]);
    expect(rows[0]).toEqual({ status: "pending", agent_id: null });
    expect((await refusal(agent.claim(1))).code).toBe(Code.NotFound);
  });

  it("Wait for an id that does not exist is NOT_FOUND at once, not a wait until the timeout", async () => {
    const q = closers.add(new Session(daemon.address, QueueService, TOKENS.engine));
    // Its timeout is a minute, twice the test's: the refusal can only have come at once.
    const err = await refusal(q.client.wait({ tenantKey: "t1", ids: ["no-such-item"], timeout: durationFromMs(60_000) }, q.call));
    expect(err.code).toBe(Code.NotFound);
    expect(err.rawMessage).toContain("no-such-item");
  });
});
