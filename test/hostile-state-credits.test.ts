/**
 * An agent's stream holds no more items than its registered slots justify (issue 51, item 12): an
 * agent that grants itself credits far past its slots is refused the rest, in the response's
 * `refused`, and the daemon pushes no more than the cap; completions reported in the message that
 * grants more free their room at once; and the SDKs' default prefetch never meets the cap.
 *
 * On the daemon of test/support/queue-daemon.ts (claimMaxItems 5, a fake clock).
 */
import { beforeAll, describe, expect, it } from "vitest";
import { AgentStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import { resolveOptions } from "../agent-sdk/src/options.js";
import { creditCap, MAX_OUTSTANDING } from "../src/rpc/agent-service/stream-ledger.js";
import { AgentStream } from "./support/agent-stream.js";
import type { Producer } from "./support/queue.js";
import { useQueueDaemon } from "./support/queue-daemon.js";

const fx = useQueueDaemon("hcredits");
let p: Producer;
beforeAll(() => void ({ p } = fx));

describe("the credit cap", () => {
  it("is the slots and a claim-ahead allowance of 3 × slots, at least 256 in all, at most MAX_OUTSTANDING", () => {
    expect([0, 1, 2, 64, 100, 1_000, 100_000].map(creditCap)).toEqual([256, 257, 258, 320, 400, 4_000, MAX_OUTSTANDING]);
  });

  it(`is never met by the SDK's default prefetch, for any number of slots up to MAX_OUTSTANDING (${MAX_OUTSTANDING}, every stream's bound)`, () => {
    const base = { address: "127.0.0.1:1", name: "a", tenants: ["t"], handlers: { k: () => undefined } };
    for (let slots = 1; slots <= MAX_OUTSTANDING; slots += slots < 1_000 ? 1 : 97) {
      const o = resolveOptions({ ...base, slots });
      expect(o.slots + o.prefetch, `slots ${slots}`).toBeLessThanOrEqual(creditCap(slots));
    }
  });
});

describe("an agent stream granting itself more than its slots justify", () => {
  it("is refused the rest, naming the slots and the cap, and is pushed no more than the cap", async () => {
    const t = "hcredits-a";
    const a = await fx.agent("hcredits-a", { tenants: [t], slots: 2 });
    const s = new AgentStream(a.conn.agent, a.name);
    await s.next("the status", (r) => r.status === AgentStatus.ACTIVE);
    s.credit(10_000);
    const refused = await s.next("the credits' refusal", (r) => r.refused !== "");
    expect(refused.refused).toBe(
      "credits: 9742 of 10000 not granted (agent 'hcredits-a' registered 2 slots: at most 258 items granted and unreported at once)",
    );
    await p.enqueue(
      t,
      Array.from({ length: 300 }, () => ({ engineKind: "dag" })),
    );
    const held = await s.itemsAtLeast(258);
    // Holding the cap, not one more credit is granted.
    const mark = s.responses.length;
    s.credit(1);
    expect((await s.next("the second refusal", (r) => r.refused !== "", mark)).refused).toMatch(/^credits: 1 of 1 not granted/);

    // Ten completions and ten credits in one message: the completed items' room is the credits'.
    const after = s.responses.length;
    s.send({ completions: held.slice(0, 10).map((i) => ({ workItemId: i.id, leaseToken: i.leaseToken })), credits: 10 });
    await s.itemsAtLeast(268);
    await s.settled();
    expect(s.responses.slice(after).filter((r) => r.refused !== "")).toEqual([]);
    expect(s.items).toHaveLength(268);
    s.goodbye();
    expect(await s.ended).toBeUndefined();
  });
});
