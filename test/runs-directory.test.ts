import { beforeAll, describe, expect, it } from "vitest";
import { Code, type Client } from "@connectrpc/connect";
import { FakeClock } from "../src/clock.js";
import {
  FiringAction,
  FiringOutcome,
  RunDirectoryService,
  RunState,
  TriggerFiringService,
  type ListRunsRequest,
  type RecordRunRequest,
} from "@aiflow/wire/gen/aiflow/cluster/v1/runs_pb.js";
import { TOKENS } from "./support/daemon.js";
import type { TestDb } from "./support/db.js";
import { codeOf, refusal, useTestDaemon } from "./support/kit.js";

const clock = new FakeClock();
// Runs of engines outside the daemon ("datapipe", "etl"): the daemon's own kinds are written by its
// engines only (runs-directory-writers.test.ts). The daemon migrates the schema itself.
const fx = useTestDaemon({ label: "runs", migrate: false, clock });
let db: TestDb;
let client: Client<typeof RunDirectoryService>;
let firings: Client<typeof TriggerFiringService>;

const as = (token: string) => ({ headers: { authorization: `Bearer ${token}` } });
const engine = as(TOKENS.engine);

type Rec = Partial<Omit<RecordRunRequest, "$typeName" | "$unknown">>;
type ListReq = Partial<Omit<ListRunsRequest, "$typeName" | "$unknown">>;
const record = (r: Rec, opts = engine) => client.recordRun({ tenantKey: "t1", engineKind: "datapipe", ...r }, opts);
/** A firing of `trigger` that started `runId`, as a trigger records it; its id. A cause must name one. */
const fired = async (trigger: string, runId: string, tenantKey = "t1") =>
  (await firings.recordFiring({ tenantKey, triggerName: trigger, action: FiringAction.START, runId, outcome: FiringOutcome.STARTED }, engine)).firing!.id;

beforeAll(() => {
  db = fx.db;
  client = fx.client(RunDirectoryService);
  firings = fx.client(TriggerFiringService);
});

describe("RecordRun merges", () => {
  it("engine save first, trigger cause second: the cause completes the row", async () => {
    const a = await record({ runId: "m1", definitionId: "deploy", parentRunId: "p0" });
    expect(a.created).toBe(true);
    expect(a.run).toMatchObject({ runId: "m1", engineKind: "datapipe", definitionId: "deploy", parentRunId: "p0", triggeredBy: "", triggerFiringId: "" });
    expect(a.run?.endedOn).toBeUndefined();
    clock.advance(1000);
    const F1 = await fired("on-push", "m1");
    const b = await record({ runId: "m1", triggeredBy: "on-push", triggerFiringId: F1 });
    expect(b.created).toBe(false);
    expect(b.run).toMatchObject({ id: a.run!.id, definitionId: "deploy", parentRunId: "p0", triggeredBy: "on-push", triggerFiringId: F1 });
    // A later save that lacks the cause does not erase it.
    clock.advance(1000);
    const c = await record({ runId: "m1", definitionId: "deploy" });
    expect(c.run).toMatchObject({ id: a.run!.id, definitionId: "deploy", parentRunId: "p0", triggeredBy: "on-push", triggerFiringId: F1 });
    expect(Number(c.run!.updatedOn!.seconds)).toBeGreaterThan(Number(c.run!.createdOn!.seconds));
    expect(c.run!.createdOn).toEqual(a.run!.createdOn);
  });

  it("trigger cause first, engine save second: the engine's facts complete the row", async () => {
    const F2 = await fired("nightly", "m2");
    const a = await record({ runId: "m2", triggeredBy: "nightly", triggerFiringId: F2 });
    expect(a.created).toBe(true);
    expect(a.run).toMatchObject({ definitionId: "", parentRunId: "", triggeredBy: "nightly", triggerFiringId: F2 });
    const b = await record({ runId: "m2", definitionId: "report", parentRunId: "p9" });
    expect(b.created).toBe(false);
    expect(b.run).toMatchObject({ id: a.run!.id, definitionId: "report", parentRunId: "p9", triggeredBy: "nightly", triggerFiringId: F2 });
    const got = await client.getRun({ tenantKey: "t1", runId: "m2" }, engine);
    expect(got.run).toMatchObject({ definitionId: "report", parentRunId: "p9", triggeredBy: "nightly", triggerFiringId: F2, engineKind: "datapipe" });
  });

  it("re-recording the same facts is idempotent: one row, same id, created once", async () => {
    const req: Rec = { runId: "m3", engineKind: "etl", definitionId: "g", parentRunId: "p", triggeredBy: "t", triggerFiringId: await fired("t", "m3") };
    const first = await record(req);
    const again = await record(req);
    const third = await record(req);
    expect(first.created).toBe(true);
    expect(again.created).toBe(false);
    expect(third.created).toBe(false);
    for (const r of [again, third]) {
      expect(r.run?.id).toBe(first.run?.id);
      expect({ ...r.run, updatedOn: undefined }).toEqual({ ...first.run, updatedOn: undefined });
    }
    const rows = await db.raw<{ n: number }>(`SELECT count(*)::int AS n FROM ${db.tables.qualified("engine_run")} WHERE tenant_key = 't1' AND run_id = 'm3'`);
    expect(rows[0]!.n).toBe(1);
  });

  it("ended_on: the first write wins; a later different or absent value changes nothing", async () => {
    await record({ runId: "m4", definitionId: "d" });
    const ended = await record({ runId: "m4", endedOn: 1_700_000_000_000_000_001n });
    expect(ended.run?.endedOn).toBe(1_700_000_000_000_000_001n);
    const later = await record({ runId: "m4", endedOn: 1_750_000_000_000_000_000n });
    expect(later.run?.endedOn).toBe(1_700_000_000_000_000_001n);
    const lacking = await record({ runId: "m4" });
    expect(lacking.run?.endedOn).toBe(1_700_000_000_000_000_001n);
    const rows = await db.raw<{ ended_on: string }>(`SELECT ended_on FROM ${db.tables.qualified("engine_run")} WHERE tenant_key = 't1' AND run_id = 'm4'`);
    expect(rows[0]!.ended_on).toBe("1700000000000000001");
    // ended_on also arrives first on a brand-new row.
    const fresh = await record({ runId: "m4b", endedOn: 1_700_000_000_000_000_005n });
    expect(fresh.run?.endedOn).toBe(1_700_000_000_000_000_005n);
  });

  it("refuses a write that disagrees with a recorded fact, and writes none of it (FAILED_PRECONDITION)", async () => {
    await record({ runId: "m5", definitionId: "deploy" });
    const [F, G] = [await fired("on-push", "m5"), await fired("on-push", "m5")];
    const before = (await client.getRun({ tenantKey: "t1", runId: "m5" }, engine)).run;
    // A different definition, even alongside a gap it could have filled.
    const err = await refusal(record({ runId: "m5", definitionId: "other", triggeredBy: "on-push" }));
    expect(err.code).toBe(Code.FailedPrecondition);
    expect(err.rawMessage).toContain("definition_id 'deploy' (this write says 'other')");
    expect((await client.getRun({ tenantKey: "t1", runId: "m5" }, engine)).run).toMatchObject({ triggeredBy: "" });
    expect(await codeOf(record({ runId: "m5", engineKind: "etl" }))).toBe(Code.FailedPrecondition);
    await record({ runId: "m5", parentRunId: "p1", triggerFiringId: F });
    expect(await codeOf(record({ runId: "m5", parentRunId: "p2" }))).toBe(Code.FailedPrecondition);
    // Another firing that started the same run: still not the one on record.
    expect((await refusal(record({ runId: "m5", triggerFiringId: G }))).rawMessage).toContain(`trigger_firing_id '${F}' (this write says '${G}')`);
    const after = (await client.getRun({ tenantKey: "t1", runId: "m5" }, engine)).run;
    // The firing alone named its trigger.
    expect(after).toMatchObject({
      id: before!.id,
      engineKind: "datapipe",
      definitionId: "deploy",
      parentRunId: "p1",
      triggeredBy: "on-push",
      triggerFiringId: F,
    });
    // Agreeing writes still go through.
    expect(await codeOf(record({ runId: "m5", definitionId: "deploy", triggeredBy: "on-push" }))).toBe("ok");
    await fired("cron-x", "m5");
    expect(await codeOf(record({ runId: "m5", triggeredBy: "cron-x" }))).toBe(Code.FailedPrecondition);
  });

  it("validates at the edge", async () => {
    expect(await codeOf(record({ runId: "v1", engineKind: "" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(record({ runId: "" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(record({ runId: "has space" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(record({ runId: "v1", tenantKey: "" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(record({ runId: "v1", endedOn: -1n }))).toBe(Code.InvalidArgument);
    expect(await codeOf(record({ runId: "v1", triggeredBy: "no/slash" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(record({ runId: "v1", definitionId: "x".repeat(257) }))).toBe(Code.InvalidArgument);
    expect(await codeOf(client.getRun({ tenantKey: "t1", runId: "v1" }, engine))).toBe(Code.NotFound);
  });
});

describe("ListRuns", () => {
  const T = "lt";
  beforeAll(async () => {
    const base = { tenantKey: T };
    const rec = async (r: Rec) => {
      clock.advance(10);
      await client.recordRun({ ...base, engineKind: "datapipe", ...r }, engine);
    };
    for (const runId of ["l1", "l3"]) await fired("on-push", runId, T);
    await rec({ runId: "l1", triggeredBy: "on-push" });
    await rec({ runId: "l2", engineKind: "etl", parentRunId: "l1" });
    await rec({ runId: "l3", triggeredBy: "on-push", endedOn: 1_700_000_000_000_000_009n });
    await rec({ runId: "l4", engineKind: "etl", parentRunId: "l1", endedOn: 1_700_000_000_000_000_010n });
    await rec({ runId: "l5" });
  });
  const list = (r: ListReq = {}) => client.listRuns({ tenantKey: T, ...r }, engine);
  const ids = async (r: ListReq = {}) => (await list(r)).runs.map((x) => x.runId);

  it("lists newest first, and filters by engine kind, trigger, parent and live/ended", async () => {
    expect(await ids()).toEqual(["l5", "l4", "l3", "l2", "l1"]);
    expect(await ids({ engineKind: "etl" })).toEqual(["l4", "l2"]);
    expect(await ids({ triggeredBy: "on-push" })).toEqual(["l3", "l1"]);
    expect(await ids({ parentRunId: "l1" })).toEqual(["l4", "l2"]);
    expect(await ids({ state: RunState.LIVE })).toEqual(["l5", "l2", "l1"]);
    expect(await ids({ state: RunState.ENDED })).toEqual(["l4", "l3"]);
    expect(await ids({ engineKind: "etl", state: RunState.LIVE })).toEqual(["l2"]);
    expect(await ids({ engineKind: "nope" })).toEqual([]);
  });

  it("breaks createdon ties by id desc", async () => {
    const runs: string[] = [];
    for (let i = 0; i < 4; i++) runs.push((await client.recordRun({ tenantKey: "tie", runId: `x${i}`, engineKind: "datapipe" }, engine)).run!.id);
    const listed = (await client.listRuns({ tenantKey: "tie" }, engine)).runs.map((r) => r.id);
    expect(listed).toEqual([...runs].sort().reverse());
  });

  it("pages with an opaque token bound to its query", async () => {
    const seen: string[] = [];
    let token = "";
    let pages = 0;
    do {
      const page = await list({ pageSize: 2, pageToken: token });
      expect(page.runs.length).toBeLessThanOrEqual(2);
      seen.push(...page.runs.map((r) => r.runId));
      token = page.nextPageToken;
      pages++;
    } while (token);
    expect(seen).toEqual(["l5", "l4", "l3", "l2", "l1"]);
    expect(pages).toBe(3);
    const first = await list({ pageSize: 2 });
    expect(await codeOf(list({ pageSize: 2, pageToken: first.nextPageToken, engineKind: "etl" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(client.listRuns({ tenantKey: "t1", pageToken: first.nextPageToken }, engine))).toBe(Code.InvalidArgument);
    expect(await codeOf(list({ pageToken: "garbage!" }))).toBe(Code.InvalidArgument);
    expect(await codeOf(list({ pageSize: -1 }))).toBe(Code.InvalidArgument);
    // An exact fit has no further page.
    expect((await list({ pageSize: 5 })).nextPageToken).toBe("");
    expect((await list({ pageSize: 100_000 })).runs).toHaveLength(5);
  });
});

describe("tenant isolation", () => {
  const t1 = as(TOKENS.engineT1);

  beforeAll(async () => {
    await client.recordRun({ tenantKey: "t2", runId: "secret-run", engineKind: "datapipe", definitionId: "t2-def" }, engine);
    await client.recordRun({ tenantKey: "t2", runId: "m1", engineKind: "etl", definitionId: "t2-own" }, engine);
  });

  it("a token limited to t1 is refused every call for t2 (PERMISSION_DENIED)", async () => {
    expect(await codeOf(client.recordRun({ tenantKey: "t2", runId: "x", engineKind: "datapipe" }, t1))).toBe(Code.PermissionDenied);
    expect(await codeOf(client.getRun({ tenantKey: "t2", runId: "secret-run" }, t1))).toBe(Code.PermissionDenied);
    expect(await codeOf(client.listRuns({ tenantKey: "t2" }, t1))).toBe(Code.PermissionDenied);
    // ...and served for t1.
    expect(await codeOf(client.getRun({ tenantKey: "t1", runId: "m1" }, t1))).toBe("ok");
  });

  it("a run id of t2 read as t1 is NOT_FOUND, and the same run id in two tenants is two rows", async () => {
    expect(await codeOf(client.getRun({ tenantKey: "t1", runId: "secret-run" }, t1))).toBe(Code.NotFound);
    expect((await client.listRuns({ tenantKey: "t1", pageSize: 500 }, t1)).runs.map((r) => r.runId)).not.toContain("secret-run");
    expect((await client.getRun({ tenantKey: "t1", runId: "m1" }, t1)).run).toMatchObject({ tenantKey: "t1", engineKind: "datapipe", definitionId: "deploy" });
    expect((await client.getRun({ tenantKey: "t2", runId: "m1" }, engine)).run).toMatchObject({ tenantKey: "t2", engineKind: "etl", definitionId: "t2-own" });
    for (const r of (await client.listRuns({ tenantKey: "t2" }, engine)).runs) expect(r.tenantKey).toBe("t2");
  });

  it("is role engine: an agent or ops token is refused, no token is unauthenticated", async () => {
    expect(await codeOf(client.getRun({ tenantKey: "t1", runId: "m1" }, as(TOKENS.agent)))).toBe(Code.PermissionDenied);
    expect(await codeOf(client.getRun({ tenantKey: "t1", runId: "m1" }, as(TOKENS.ops)))).toBe(Code.PermissionDenied);
    expect(await codeOf(client.getRun({ tenantKey: "t1", runId: "m1" }))).toBe(Code.Unauthenticated);
  });
});
