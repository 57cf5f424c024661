/**
 * RunDirectoryService and TriggerFiringService (role `engine`, tenant-scoped): the run directory
 * (aiflow_engine_run) and the append-only firing log (aiflow_trigger_firing). Handlers validate,
 * check the tenant against the caller's token, call the store and shape the reply.
 *
 * Every request names its tenant and every read is qualified by it: an id of another tenant reads
 * as NOT_FOUND, and a token limited to other tenants is refused with PERMISSION_DENIED before any
 * read. TriggerFiringService has no update and no delete method; the retention task below is the
 * only deletion of firings. RecordRun writes runs of engines outside the daemon only; the daemon's
 * own engines write theirs themselves (./run-writers.ts says why and what else a write must satisfy).
 */
import { createHash } from "node:crypto";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { z } from "zod";
import { msToNs, type Clock } from "../clock.js";
import type { Config } from "../config.js";
import { failedPrecondition, invalidArgument, notFound, resourceExhausted } from "../domain/errors.js";
import {
  FiringAction,
  FiringOutcome,
  type RunDirectoryService,
  RunState,
  type TriggerFiringService,
  TriggerType,
  type EngineRunSchema,
  type RecordFiringRequest,
  type RecordRunRequest,
  type TriggerFiringSchema,
} from "@aiflow/wire/gen/aiflow/cluster/v1/runs_pb.js";
import type { Logger } from "../log.js";
import { assertTenant, callerOf } from "./caller.js";
import type { EngineRunRow, EngineRunStore, RunFacts, RunFilter } from "../store/engine-runs.js";
import type {
  FiringAction as StoredAction,
  FiringFilter,
  FiringInput,
  FiringOutcome as StoredOutcome,
  FiringRow,
  TriggerFiringStore,
  TriggerType as StoredType,
} from "../store/trigger-firings.js";
import type { MaintenanceTask } from "../maintenance.js";
import type { TriggerStore } from "../store/triggers.js";
import { identifier, optionalText } from "../domain/input.js";
import { admitExternalWrite, DAEMON_ENGINE_KINDS, ownedRun } from "./run-writers.js";

/** Lists return this many rows when page_size is 0, and never more than PAGE_MAX. */
export const PAGE_DEFAULT = 50;
export const PAGE_MAX = 500;
/**
 * The payload bytes of one ListFirings page: it stops before this (after its first firing, however
 * large) and says more follow, so a page stays within the 4 MiB stock gRPC clients accept.
 */
export const FIRING_PAGE_BYTES = 3 * 1024 * 1024;
/** Longest definition_id and event accepted; they are names chosen by people, not identifiers. */
const NAME_MAX = 256;
const ERROR_MAX = 16_384;

export interface RunsServiceDeps {
  config: Config;
  clock: Clock;
  runs: EngineRunStore;
  firings: TriggerFiringStore;
}

export function runDirectoryServiceImpl(d: RunsServiceDeps): ServiceImpl<typeof RunDirectoryService> {
  return {
    async recordRun(req, ctx) {
      const caller = callerOf(ctx);
      const tenantKey = identifier(req.tenantKey, "tenant_key");
      assertTenant(caller, tenantKey);
      const facts = await admitExternalWrite(d, runFacts(req, tenantKey), msToNs(d.clock.nowMs()));
      const res = await d.runs.record(facts, d.clock.nowMs(), caller.principal);
      if (res.kind === "conflict") {
        // The daemon's engine created the row after admitExternalWrite read it: still its run.
        if (DAEMON_ENGINE_KINDS.has(res.row.engine_kind)) throw ownedRun(res.row);
        const what = res.fields.map((f) => `${f.field} '${f.stored}' (this write says '${f.given}')`).join(", ");
        throw failedPrecondition(
          `run '${facts.runId}' of tenant '${tenantKey}' is already recorded with ${what}; a recorded fact never changes, so nothing was written`,
        );
      }
      return { run: runToWire(res.row), created: res.created };
    },

    async getRun(req, ctx) {
      const tenantKey = identifier(req.tenantKey, "tenant_key");
      assertTenant(callerOf(ctx), tenantKey);
      const runId = identifier(req.runId, "run_id");
      const row = await d.runs.get(tenantKey, runId);
      if (!row) throw notFound(`tenant '${tenantKey}' has no run '${runId}' in the directory`);
      const table = await d.runs.engineTable(tenantKey, runId);
      return { run: runToWire(row), engineTable: table === null ? "" : d.config.tablePrefix + table };
    },

    async listRuns(req, ctx) {
      const tenantKey = identifier(req.tenantKey, "tenant_key");
      assertTenant(callerOf(ctx), tenantKey);
      const filter: RunFilter = {};
      const engineKind = optionalIdentifier(req.engineKind, "engine_kind");
      const triggeredBy = optionalIdentifier(req.triggeredBy, "triggered_by");
      const parentRunId = optionalIdentifier(req.parentRunId, "parent_run_id");
      if (engineKind !== null) filter.engineKind = engineKind;
      if (triggeredBy !== null) filter.triggeredBy = triggeredBy;
      if (parentRunId !== null) filter.parentRunId = parentRunId;
      if (req.state === RunState.LIVE) filter.state = "live";
      else if (req.state === RunState.ENDED) filter.state = "ended";
      else if (req.state !== RunState.UNSPECIFIED) throw invalidArgument("state", `unknown value ${req.state}`);
      const size = pageSize(req.pageSize);
      const query = queryKey("runs", tenantKey, filter);
      const cursor = decodePageToken(req.pageToken, query, runCursorToken);
      const rows = await d.runs.list(tenantKey, filter, cursor && { createdUs: BigInt(cursor.u), id: cursor.i }, size + 1);
      const page = rows.slice(0, size);
      const last = page.at(-1);
      return {
        runs: page.map(runToWire),
        nextPageToken: rows.length > size && last ? encodePageToken(query, { u: last.created_us.toString(), i: last.id }) : "",
      };
    },
  };
}

export function triggerFiringServiceImpl(d: RunsServiceDeps): ServiceImpl<typeof TriggerFiringService> {
  return {
    async recordFiring(req, ctx) {
      const caller = callerOf(ctx);
      const tenantKey = identifier(req.tenantKey, "tenant_key");
      assertTenant(caller, tenantKey);
      const input = firingInput(req, tenantKey, d.config.payloadMaxBytes);
      const row = await d.firings.insert(input, d.clock.nowMs(), caller.principal);
      return { firing: firingToWire(row) };
    },

    async getFiring(req, ctx) {
      const tenantKey = identifier(req.tenantKey, "tenant_key");
      assertTenant(callerOf(ctx), tenantKey);
      const id = identifier(req.id, "id");
      const row = await d.firings.get(tenantKey, id);
      if (!row) throw notFound(`tenant '${tenantKey}' has no trigger firing '${id}'`);
      return { firing: firingToWire(row) };
    },

    async listFirings(req, ctx) {
      const tenantKey = identifier(req.tenantKey, "tenant_key");
      assertTenant(callerOf(ctx), tenantKey);
      const filter: FiringFilter = {};
      const triggerName = optionalIdentifier(req.triggerName, "trigger_name");
      const runId = optionalIdentifier(req.runId, "run_id");
      if (triggerName !== null) filter.triggerName = triggerName;
      if (runId !== null) filter.runId = runId;
      const outcomes = [
        ...new Set(
          req.outcomes.map((o, i) => {
            const s = OUTCOMES[o as FiringOutcome];
            if (!s) throw invalidArgument(`outcomes[${i}]`, `${o} is not an outcome`);
            return s;
          }),
        ),
      ].sort();
      if (outcomes.length > 0) filter.outcomes = outcomes;
      const size = pageSize(req.pageSize);
      const query = queryKey("firings", tenantKey, filter);
      const cursor = decodePageToken(req.pageToken, query, firingCursorToken);
      const { rows, more } = await d.firings.list(
        tenantKey,
        filter,
        cursor && { firedOn: cursor.f === null ? null : BigInt(cursor.f), id: cursor.i },
        size,
        FIRING_PAGE_BYTES,
      );
      const last = rows.at(-1);
      return {
        firings: rows.map(firingToWire),
        nextPageToken: more && last ? encodePageToken(query, { f: last.fired_on?.toString() ?? null, i: last.id }) : "",
      };
    },
  };
}

/** How often the retention sweep may scan the firing log; retention is counted in days. */
export const RETENTION_SWEEP_EVERY_MS = 15 * 60_000;
const DAY_MS = 86_400_000;

/**
 * Deletes trigger firings the daemon recorded more than --firing-retention-days ago (by createdon).
 * The table has no index on createdon, so the sweep runs at most every RETENTION_SWEEP_EVERY_MS of
 * clock time rather than on every maintenance tick.
 */
export function firingRetentionTask(d: { config: Config; firings: TriggerFiringStore; deliveries: TriggerStore; log: Logger }): MaintenanceTask {
  let lastMs: number | undefined;
  return {
    name: "firing-retention",
    async run(now) {
      if (lastMs !== undefined && now >= lastMs && now - lastMs < RETENTION_SWEEP_EVERY_MS) return;
      const days = d.config.firingRetention;
      const deleted = await d.firings.sweep(now - days * DAY_MS);
      // A delivery id is kept as long as the firing it acted in: a replay is refused while that firing is on record.
      await d.deliveries.sweepDeliveries(now - days * DAY_MS);
      lastMs = now;
      if (deleted > 0) d.log.info({ deleted, retentionDays: days }, "deleted trigger firings past retention");
    },
  };
}

// ---- validation -------------------------------------------------------------------------------

function optionalIdentifier(raw: string, field: string): string | null {
  return raw.trim() === "" ? null : identifier(raw, field);
}

function runFacts(req: RecordRunRequest, tenantKey: string): RunFacts {
  if (req.endedOn < 0n) throw invalidArgument("ended_on", `${req.endedOn} is negative; give epoch nanoseconds, or 0 for not ended`);
  return {
    tenantKey,
    runId: identifier(req.runId, "run_id"),
    engineKind: identifier(req.engineKind, "engine_kind"),
    definitionId: optionalText(req.definitionId, "definition_id", NAME_MAX),
    parentRunId: optionalIdentifier(req.parentRunId, "parent_run_id"),
    triggeredBy: optionalIdentifier(req.triggeredBy, "triggered_by"),
    triggerFiringId: optionalIdentifier(req.triggerFiringId, "trigger_firing_id"),
    endedOn: req.endedOn === 0n ? null : req.endedOn,
  };
}

function firingInput(req: RecordFiringRequest, tenantKey: string, payloadMaxBytes: number): FiringInput {
  const triggerName = identifier(req.triggerName, "trigger_name");
  const outcome = OUTCOMES[req.outcome];
  if (!outcome)
    throw invalidArgument(
      "outcome",
      req.outcome === FiringOutcome.UNSPECIFIED ? "is required: a firing is recorded once its outcome is known" : `unknown value ${req.outcome}`,
    );
  const triggerType = TYPES[req.triggerType];
  if (triggerType === undefined) throw invalidArgument("trigger_type", `unknown value ${req.triggerType}`);
  const action = ACTIONS[req.action];
  if (action === undefined) throw invalidArgument("action", `unknown value ${req.action}`);
  const runId = optionalIdentifier(req.runId, "run_id");
  if (runId === null && (outcome === "started" || outcome === "signalled")) throw invalidArgument("run_id", `is required when the outcome is ${outcome}`);
  if (req.firedOn < 0n) throw invalidArgument("fired_on", `${req.firedOn} is negative; give epoch nanoseconds, or 0 when the source gave no time`);
  return {
    tenantKey,
    triggerName,
    triggerType,
    payload: payloadText(req.payload, payloadMaxBytes),
    action,
    definitionId: optionalText(req.definitionId, "definition_id", NAME_MAX),
    event: optionalText(req.event, "event", NAME_MAX),
    runId,
    outcome,
    error: optionalText(req.error, "error", ERROR_MAX),
    firedOn: req.firedOn === 0n ? null : req.firedOn,
  };
}

/** The payload exactly as sent (never trimmed or re-serialised), once it is known to be JSON and small enough. */
function payloadText(raw: string, maxBytes: number): string | null {
  if (raw.length === 0) return null;
  const size = Buffer.byteLength(raw, "utf8");
  if (size > maxBytes) throw resourceExhausted(`payload is ${size} bytes; the limit is ${maxBytes} bytes`);
  try {
    JSON.parse(raw);
  } catch (err) {
    throw invalidArgument("payload", `is not JSON text (${(err as Error).message})`);
  }
  return raw;
}

function pageSize(raw: number): number {
  if (raw < 0) throw invalidArgument("page_size", `${raw} is negative`);
  return raw === 0 ? PAGE_DEFAULT : Math.min(raw, PAGE_MAX);
}

// ---- enums ------------------------------------------------------------------------------------

const TYPES: Record<TriggerType, StoredType | null> = {
  [TriggerType.UNSPECIFIED]: null,
  [TriggerType.WEBHOOK]: "webhook",
  [TriggerType.CRON]: "cron",
  [TriggerType.GITPOLL]: "gitpoll",
  [TriggerType.FILESYSTEM]: "filesystem",
};
const ACTIONS: Record<FiringAction, StoredAction | null> = {
  [FiringAction.UNSPECIFIED]: null,
  [FiringAction.START]: "start",
  [FiringAction.SIGNAL]: "signal",
};
const OUTCOMES: Record<FiringOutcome, StoredOutcome | null> = {
  [FiringOutcome.UNSPECIFIED]: null,
  [FiringOutcome.STARTED]: "started",
  [FiringOutcome.SIGNALLED]: "signalled",
  [FiringOutcome.REFUSED]: "refused",
  [FiringOutcome.FAILED]: "failed",
};

/** Stored string to wire enum; a value this version does not know reads as UNSPECIFIED. */
function toWire<E extends number>(table: Record<E, string | null>, stored: string | null, unspecified: E): E {
  if (stored === null) return unspecified;
  const hit = (Object.entries(table) as [string, string | null][]).find(([, s]) => s === stored);
  return hit ? (Number(hit[0]) as E) : unspecified;
}

// ---- wire shapes ------------------------------------------------------------------------------

function runToWire(r: EngineRunRow): MessageInitShape<typeof EngineRunSchema> {
  return {
    id: r.id,
    tenantKey: r.tenant_key,
    runId: r.run_id,
    engineKind: r.engine_kind,
    definitionId: r.definition_id ?? "",
    parentRunId: r.parent_run_id ?? "",
    triggeredBy: r.triggered_by ?? "",
    triggerFiringId: r.trigger_firing_id ?? "",
    endedOn: r.ended_on ?? undefined,
    createdBy: r.createdby,
    createdOn: timestampFromMs(r.createdon),
    updatedBy: r.updatedby ?? "",
    updatedOn: r.updatedon === null ? undefined : timestampFromMs(r.updatedon),
  };
}

function firingToWire(f: FiringRow): MessageInitShape<typeof TriggerFiringSchema> {
  return {
    id: f.id,
    tenantKey: f.tenant_key,
    triggerName: f.trigger_name,
    triggerType: toWire(TYPES, f.trigger_type, TriggerType.UNSPECIFIED),
    payload: f.payload ?? "",
    action: toWire(ACTIONS, f.action, FiringAction.UNSPECIFIED),
    definitionId: f.definition_id ?? "",
    event: f.event ?? "",
    runId: f.run_id ?? "",
    outcome: toWire(OUTCOMES, f.outcome, FiringOutcome.UNSPECIFIED),
    error: f.error ?? "",
    firedOn: f.fired_on ?? undefined,
    createdBy: f.createdby,
    createdOn: timestampFromMs(f.createdon),
  };
}

// ---- page tokens ------------------------------------------------------------------------------
// A token is base64url JSON of the cursor (the last row's sort key) and a digest of the query it
// came from, so a token replayed with another tenant or other filters is refused, not misapplied.

/** A non-negative int8 as decimal text: what the cursors' microsecond and nanosecond columns hold. */
const int8Text = z
  .string()
  .regex(/^\d{1,19}$/)
  .refine((v) => BigInt(v) <= 9_223_372_036_854_775_807n);
const cursorId = z.string().max(256);
const runCursorToken = z.object({ u: int8Text, i: cursorId });
const firingCursorToken = z.object({ f: int8Text.nullable(), i: cursorId });

function queryKey(kind: string, tenantKey: string, filter: object): string {
  return createHash("sha256")
    .update(JSON.stringify([kind, tenantKey, filter]))
    .digest("base64url")
    .slice(0, 16);
}

function encodePageToken(query: string, cursor: object): string {
  return Buffer.from(JSON.stringify({ q: query, c: cursor })).toString("base64url");
}

function decodePageToken<T>(raw: string, query: string, schema: z.ZodType<T>): T | null {
  if (raw === "") return null;
  let parsed: unknown;
  try {
    parsed = JSON.parse(Buffer.from(raw, "base64url").toString("utf8"));
  } catch {
    throw invalidArgument("page_token", "is not a token this service issued");
  }
  const token = z.object({ q: z.string(), c: schema }).safeParse(parsed);
  if (!token.success) throw invalidArgument("page_token", "is not a token this service issued");
  if (token.data.q !== query) throw invalidArgument("page_token", "was issued for a different tenant or different filters");
  return token.data.c as T;
}
