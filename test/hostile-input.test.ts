/**
 * Input a hostile or careless caller sends, end to end over real HTTP/2 and a real Postgres: each is
 * refused at the edge with INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for size) and changes nothing,
 * or is stored and comes back number for number on every read path. None of it may answer INTERNAL.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { Code } from "@connectrpc/connect";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { FakeClock } from "../src/clock.js";
import type { Daemon } from "../src/daemon.js";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { FiringAction, FiringOutcome, RunDirectoryService, TriggerFiringService, TriggerType } from "@aiflow/wire/gen/aiflow/cluster/v1/runs_pb.js";
import { FIRING_PAGE_BYTES } from "../src/rpc/runs-service.js";
import { MAX_JSON_DEPTH } from "../src/domain/json-text.js";
import { LIST_PAGE_BYTES } from "../src/rpc/queue-service.js";
import { TOKENS } from "./support/daemon.js";
import { codeOf, refusal, Session, useTestDaemon } from "./support/kit.js";
import { Producer, TestAgent } from "./support/queue.js";

const PAYLOAD_MAX = 1024 * 1024;
const clock = new FakeClock(Date.UTC(2026, 3, 1));
const fx = useTestDaemon({ label: "hostile", clock, config: { payloadMaxBytes: PAYLOAD_MAX } });
const closers = fx.closers;
let daemon: Daemon;
let p: Producer;

beforeAll(() => {
  daemon = fx.daemon;
  p = closers.add(new Producer(daemon.address));
});

async function agentFor(tenant: string, name = `${tenant}-agent`): Promise<TestAgent> {
  return closers.add(await TestAgent.register(daemon.address, name, { tenants: [tenant], engineKinds: ["dag"] }));
}

const nested = (depth: number) => "[".repeat(depth) + "]".repeat(depth);

describe("control characters", () => {
  it("a NUL in a heartbeat's disk mount is INVALID_ARGUMENT and nothing is buffered", async () => {
    const a = await agentFor("cc1");
    const bad = a.conn.agent.heartbeat(
      {
        name: a.name,
        metrics: { cpuUtilization: 1, memoryUsedBytes: 1n, memoryTotalBytes: 2n, disks: [{ mount: "/data\u0000x", freeBytes: 1n, totalBytes: 2n }], gpus: [] },
      },
      { headers: { authorization: `Bearer ${TOKENS.agent}` } },
    );
    const err = await refusal(bad);
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toContain("metrics.disks[0].mount");
  });

  it("a control character in a registration field is INVALID_ARGUMENT", async () => {
    const a = new Session(daemon.address, (await import("@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js")).AgentService, TOKENS.agent);
    closers.add(a);
    const code = await codeOf(
      a.client.register({ name: "cc2-agent", agentVersion: "1.0\u0007", metadata: { tenants: ["cc2"], engineKinds: ["dag"] } }, a.call),
    );
    expect(code).toBe(Code.InvalidArgument);
  });
});

describe("values past what the columns hold", () => {
  it("a not_before past 2262 (or before 1970) is INVALID_ARGUMENT", async () => {
    for (const seconds of [10_000_000_000n, -1n]) {
      const err = await refusal(p.enqueue("range1", [{ engineKind: "dag", notBefore: { seconds, nanos: 0 } }]));
      expect(err.code).toBe(Code.InvalidArgument);
      expect(err.rawMessage).toContain("items[0].not_before");
    }
  });

  it("forged page tokens are INVALID_ARGUMENT on every paged RPC", async () => {
    const forge = (o: object) => Buffer.from(JSON.stringify(o)).toString("base64url");
    const ops = new Session(daemon.address, OpsService, TOKENS.ops);
    const runs = new Session(daemon.address, RunDirectoryService, TOKENS.engine);
    const firings = new Session(daemon.address, TriggerFiringService, TOKENS.engine);
    for (const s of [ops, runs, firings]) closers.add(s);
    const items = [
      forge({ priority: 0, createdon: 1e300, id: "x" }),
      forge({ priority: 0.5, createdon: 1, id: "x" }),
      forge({ priority: 0, createdon: 1, id: "x\u0000" }),
      "%%%",
      "A".repeat(5000),
    ];
    for (const t of items) {
      expect(await codeOf(p.q.listItems({ tenantKey: "pt1", pageToken: t }, p.call))).toBe(Code.InvalidArgument);
      expect(await codeOf(ops.client.listItems({ pageToken: t }, ops.call))).toBe(Code.InvalidArgument);
    }
    expect(await codeOf(ops.client.listBindings({ pageToken: forge({ createdon: 1e300, id: "x" }) }, ops.call))).toBe(Code.InvalidArgument);
    const runsFirst = await runs.client.listRuns({ tenantKey: "pt1" }, runs.call);
    expect(runsFirst.runs).toEqual([]);
    const query = (token: string) => JSON.parse(Buffer.from(token, "base64url").toString()) as { q: string };
    // A token of the right query whose cursor overflows int8.
    await runs.client.recordRun({ tenantKey: "pt1", runId: "r1", engineKind: "datapipe" }, runs.call);
    await runs.client.recordRun({ tenantKey: "pt1", runId: "r2", engineKind: "datapipe" }, runs.call);
    const page = await runs.client.listRuns({ tenantKey: "pt1", pageSize: 1 }, runs.call);
    const q = query(page.nextPageToken).q;
    expect(await codeOf(runs.client.listRuns({ tenantKey: "pt1", pageSize: 1, pageToken: forge({ q, c: { u: "9".repeat(19), i: "x" } }) }, runs.call))).toBe(
      Code.InvalidArgument,
    );
    const fpage = await firings.client.listFirings({ tenantKey: "pt1", pageSize: 1 }, firings.call);
    expect(fpage.firings).toEqual([]);
  });

  it("a selector of more than 64 entries is INVALID_ARGUMENT", async () => {
    const selector = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, "v"]));
    const err = await refusal(p.enqueue("sel1", [{ engineKind: "dag", workerParams: { selector } }]));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toContain("worker_params.selector");
  });

  it("a Wait naming more than 1,000 items is INVALID_ARGUMENT", async () => {
    const ids = Array.from({ length: 1001 }, (_, i) => `id${i}`);
    expect(await codeOf(p.q.wait({ tenantKey: "w1", ids }, p.call))).toBe(Code.InvalidArgument);
  });
});

describe("JSON that would poison reads", () => {
  it(`a payload or result nested deeper than ${MAX_JSON_DEPTH} levels is INVALID_ARGUMENT; one at the limit round-trips`, async () => {
    const err = await refusal(p.enqueue("deep1", [{ engineKind: "dag", payloadJson: nested(10_000) }]));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toContain("nested more than");
    const id = await p.one("deep1", { engineKind: "dag", payloadJson: nested(MAX_JSON_DEPTH) });
    const a = await agentFor("deep1");
    const [item] = await a.claim(1);
    expect(item!.id).toBe(id);
    const tooDeep = a.conn.agent.complete(
      { name: a.name, items: [{ workItemId: id, leaseToken: item!.leaseToken, resultJson: nested(MAX_JSON_DEPTH + 1) }] },
      { headers: { authorization: `Bearer ${TOKENS.agent}` } },
    );
    expect(await codeOf(tooDeep)).toBe(Code.InvalidArgument);
    expect((await a.complete([item!], undefined))[0]!.ok).toBe(true);
    expect((await p.item("deep1", id)).payloadJson.replace(/\s/g, "")).toBe(nested(MAX_JSON_DEPTH));
    const listed = await p.q.listItems({ tenantKey: "deep1" }, p.call);
    expect(listed.items.map((i) => i.id)).toEqual([id]);
  });

  it("\\u0000, an unpaired surrogate, duplicate keys and numbers jsonb cannot hold are INVALID_ARGUMENT, naming what", async () => {
    const cases: [string, string][] = [
      ['{"a":"\\u0000"}', "\\u0000"],
      ['{"a":"\\ud800"}', "surrogate"],
      ['{"a":1,"a":2}', "duplicate key 'a'"],
      ['{"a":1,"\\u0061":2}', "duplicate key 'a'"],
      ["[1e200000]", "digits"],
      ['{"a": tru}', "position 6"],
    ];
    for (const [payloadJson, says] of cases) {
      const err = await refusal(p.enqueue("bad1", [{ engineKind: "dag", payloadJson }]));
      expect(err.code, payloadJson).toBe(Code.InvalidArgument);
      expect(err.rawMessage, payloadJson).toContain(says);
    }
    const listed = await p.q.listItems({ tenantKey: "bad1" }, p.call);
    expect(listed.items).toEqual([]);
  });

  it("an error about bad JSON never echoes the text", async () => {
    // JSON.parse's own message would quote this one.
    const err = await refusal(p.enqueue("bad2", [{ engineKind: "dag", payloadJson: "sk-live-abc" }]));
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).not.toContain("sk-live");
  });

  it("exponents count as the digits jsonb writes out: a payload or result small as sent but huge as stored is RESOURCE_EXHAUSTED", async () => {
    const huge = `[${Array.from({ length: 2000 }, () => "1e999").join(",")}]`;
    expect(huge.length).toBeLessThan(PAYLOAD_MAX);
    const err = await refusal(p.enqueue("exp1", [{ engineKind: "dag", payloadJson: huge }]));
    expect(err.code).toBe(Code.ResourceExhausted);
    const id = await p.one("exp1", { engineKind: "dag" });
    const a = await agentFor("exp1");
    const [item] = await a.claim(1);
    const refused = await refusal(
      a.conn.agent.complete(
        { name: a.name, items: [{ workItemId: id, leaseToken: item!.leaseToken, resultJson: huge }] },
        { headers: { authorization: `Bearer ${TOKENS.agent}` } },
      ),
    );
    expect(refused.code).toBe(Code.ResourceExhausted);
    expect(refused.rawMessage).toContain("items[0].result_json");
  });
});

describe("numbers come back as they went in", () => {
  const payload =
    '{"big": 12345678901234567890, "odd": 9007199254740993, "neg": -0.000000000000000000012345678901234567890, "nested": [{"n": 123456789012345678901234567890}]}';
  // jsonb orders an object's keys its own way: the numbers are compared as a set of texts.
  const numbers = (json: string) => json.match(/-?\d[\d.eE+-]*/g)?.sort();

  it("through Claim, GetItem, ListItems and Wait, for payloads and results", async () => {
    const id = await p.one("num1", { engineKind: "dag", payloadJson: payload });
    const a = await agentFor("num1");
    const [claimed] = await a.claim(1);
    expect(numbers(claimed!.payloadJson)).toEqual(numbers(payload));
    await a.conn.agent.complete(
      { name: a.name, items: [{ workItemId: id, leaseToken: claimed!.leaseToken, resultJson: payload }] },
      { headers: { authorization: `Bearer ${TOKENS.agent}` } },
    );
    const got = await p.item("num1", id);
    const listed = (await p.q.listItems({ tenantKey: "num1" }, p.call)).items[0]!;
    const waited = (await p.q.wait({ tenantKey: "num1", ids: [id], timeout: durationFromMs(0) }, p.call)).items[0]!;
    const ops = new Session(daemon.address, OpsService, TOKENS.ops);
    closers.add(ops);
    const opsGot = (await ops.client.getItem({ id }, ops.call)).item!;
    for (const it of [got, listed, waited, opsGot]) {
      expect(numbers(it.payloadJson)).toEqual(numbers(payload));
      expect(numbers(it.resultJson)).toEqual(numbers(payload));
    }
  });
});

describe("replies that stay readable", () => {
  it(`a ListItems page holds at most ${LIST_PAGE_BYTES} bytes of payloads (and at least one item); paging still sees every item once`, async () => {
    const big = (i: number) => JSON.stringify({ i, pad: "x".repeat(PAYLOAD_MAX - 100) });
    const ids: string[] = [];
    // One call each: a call's message is capped at twice the payload limit.
    for (let i = 0; i < 7; i++) ids.push(await p.one("page1", { engineKind: "dag", payloadJson: big(i) }));
    const { seen, pages } = await pageThrough(LIST_PAGE_BYTES, async (pageToken) => {
      const res = await p.q.listItems({ tenantKey: "page1", pageSize: 1000, pageToken }, p.call);
      return { rows: res.items.map((i) => ({ id: i.id, bytes: Buffer.byteLength(i.payloadJson) })), next: res.nextPageToken };
    });
    expect(seen.length).toBe(ids.length);
    expect(new Set(seen)).toEqual(new Set(ids));
    expect(pages).toBeGreaterThan(2);
  });

  it(`a ListFirings page holds at most ${FIRING_PAGE_BYTES} bytes of payloads; paging still sees every firing once`, async () => {
    const firings = new Session(daemon.address, TriggerFiringService, TOKENS.engine);
    closers.add(firings);
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) {
      const res = await firings.client.recordFiring(
        {
          tenantKey: "page2",
          triggerName: "hook",
          triggerType: TriggerType.WEBHOOK,
          action: FiringAction.START,
          outcome: FiringOutcome.REFUSED,
          error: "bad signature",
          payload: JSON.stringify({ i, pad: "y".repeat(PAYLOAD_MAX - 100) }),
        },
        firings.call,
      );
      ids.push(res.firing!.id);
    }
    const { seen, pages } = await pageThrough(FIRING_PAGE_BYTES, async (pageToken) => {
      const res = await firings.client.listFirings({ tenantKey: "page2", pageSize: 500, pageToken }, firings.call);
      return { rows: res.firings.map((f) => ({ id: f.id, bytes: Buffer.byteLength(f.payload) })), next: res.nextPageToken };
    });
    expect(seen.length).toBe(ids.length);
    expect(new Set(seen)).toEqual(new Set(ids));
    expect(pages).toBeGreaterThan(1);
  });
});

/**
 * Reads every page, checking that each holds at least one row and, when it holds more, at most
 * `budget` bytes. Returns the ids in the order read and how many pages it took.
 */
async function pageThrough(budget: number, page: (token: string) => Promise<{ rows: { id: string; bytes: number }[]; next: string }>) {
  const seen: string[] = [];
  let token = "";
  let pages = 0;
  do {
    const { rows, next } = await page(token);
    expect(rows.length).toBeGreaterThan(0);
    if (rows.length > 1) expect(rows.reduce((n, r) => n + r.bytes, 0)).toBeLessThanOrEqual(budget);
    seen.push(...rows.map((r) => r.id));
    token = next;
    pages++;
  } while (token && pages < 20);
  return { seen, pages };
}
