/**
 * Refusals that change nothing: each bad Enqueue with its code and no row written, and bad agent
 * calls that leave the item as it was.
 *
 * On the daemon of test/support/queue-daemon.ts: one daemon, a fake clock, sweeps run by the tests.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import type { Daemon } from "../src/daemon.js";
import { TOKENS } from "./support/daemon.js";
import type { TestDb } from "./support/db.js";
import { codeOf } from "./support/kit.js";
import { countItems, itemRow, Producer } from "./support/queue.js";
import { oks, useQueueDaemon } from "./support/queue-daemon.js";

const fx = useQueueDaemon("qrefuse");
const { agent, closers } = fx;
// The file's schema, daemon and producer, once the fixture's beforeAll has made them.
let db: TestDb, daemon: Daemon, p: Producer;
beforeAll(() => void ({ db, daemon, p } = fx));

describe("bad input is refused and changes nothing", () => {
  it("refuses each bad Enqueue with its code, with no row written", async () => {
    const t1 = new Producer(daemon.address, TOKENS.engineT1);
    const asAgent = new Producer(daemon.address, TOKENS.agent);
    closers.add(t1);
    closers.add(asAgent);
    const valid = { engineKind: "dag", payloadJson: '{"ok":true}' };
    const before = await countItems(db);
    const refusals: [string, Promise<unknown>, Code][] = [
      ["tenant outside the token", t1.enqueue("t2", [valid]), Code.PermissionDenied],
      [
        "payload over the cap",
        p.enqueue("bad", [valid, { engineKind: "dag", payloadJson: JSON.stringify({ blob: "x".repeat(3000) }) }]),
        Code.ResourceExhausted,
      ],
      ["negative priority", p.enqueue("bad", [valid, { engineKind: "dag", priority: -1 }]), Code.InvalidArgument],
      ["negative max_retries", p.enqueue("bad", [valid, { engineKind: "dag", maxRetries: -1 }]), Code.InvalidArgument],
      ["payload that is not JSON", p.enqueue("bad", [valid, { engineKind: "dag", payloadJson: '{"unterminated": ' }]), Code.InvalidArgument],
      ["unknown parent", p.enqueue("bad", [valid, { engineKind: "dag", parentWorkItemId: "01NOSUCHPARENT0000000000000" }]), Code.InvalidArgument],
      ["no engine kind", p.enqueue("bad", [valid, { engineKind: "" }]), Code.InvalidArgument],
      ["no items", p.enqueue("bad", []), Code.InvalidArgument],
      ["agent token on the queue service", asAgent.enqueue("bad", [valid]), Code.PermissionDenied],
    ];
    const got = await Promise.all(refusals.map(async ([what, call]) => [what, await codeOf(call)]));
    expect(got).toEqual(refusals.map(([what, , code]) => [what, code]));
    expect(await countItems(db)).toBe(before);
    // The t1 token works for t1, and reads of other tenants are refused too.
    const id = await t1.one("t1", valid);
    expect(await codeOf(t1.get("t2", id))).toBe(Code.PermissionDenied);
    expect(await codeOf(p.get("t2", id))).toBe(Code.NotFound);
    expect(await codeOf(t1.q.cancel({ tenantKey: "t2", ids: [id] }, t1.call))).toBe(Code.PermissionDenied);
    expect(await countItems(db)).toBe(before + 1);
  });

  it("refuses bad agent calls without touching the item", async () => {
    const t = "bad-agent";
    const a = await agent("bad-agent-1", { tenants: [t] });
    const id = await p.one(t, { engineKind: "dag" });
    const [item] = await a.claim(1);
    const before = await itemRow(db, id);
    const completeWith = (resultJson: string) =>
      a.conn.agent.complete(
        { name: a.name, items: [{ workItemId: id, leaseToken: item!.leaseToken, resultJson }] },
        { headers: { authorization: `Bearer ${TOKENS.agent}` } },
      );
    expect(await codeOf(completeWith("{not json"))).toBe(Code.InvalidArgument);
    expect(await codeOf(completeWith(JSON.stringify({ blob: "x".repeat(3000) })))).toBe(Code.ResourceExhausted);
    expect(await codeOf(a.complete([]))).toBe(Code.InvalidArgument);
    expect(await codeOf(a.conn.agent.claim({ name: "never-registered", maxItems: 1 }, { headers: { authorization: `Bearer ${TOKENS.agent}` } }))).toBe(
      Code.NotFound,
    );
    expect(await codeOf(a.conn.agent.claim({ name: a.name, maxItems: 1 }, { headers: { authorization: `Bearer ${TOKENS.engine}` } }))).toBe(
      Code.PermissionDenied,
    );
    expect(await itemRow(db, id)).toEqual(before);
    expect(oks(await a.complete([item!], { fine: true }))).toEqual([true]);
  });
});
