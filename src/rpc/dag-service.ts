/**
 * DagService (role `runs`, tenant-scoped, and scoped to the caller): handlers validate, check the
 * tenant against the token, call the engine and shape the reply (./dag-messages.ts). Every run the
 * caller reaches is found with createdby = the caller in the statement itself, so another caller's
 * run id reads as NOT_FOUND, the same as one that does not exist.
 */
import { toJsonString } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { z } from "zod";
import { DefinitionSchema, RunStatus, type DagOpsService, type DagService } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import type { Config } from "../config.js";
import type { DagEngine, Scope } from "../dag/engine.js";
import { planOf } from "../dag/plan.js";
import { invalidArgument, notFound } from "../domain/errors.js";
import { assertTenant, callerOf } from "../server/auth.js";
import { newId } from "../util/ids.js";
import { decodeCursor, encodeCursor } from "./input/page-tokens.js";
import { identifier, jsonObject, jsonOrNull, optionalText } from "./input/validate.js";
import { runToWire, STATUS_FROM_WIRE } from "./dag-messages.js";
import { watchRun } from "./native-calls.js";
import type { Clock } from "../clock.js";

const PAGE_DEFAULT = 50;
const PAGE_MAX = 500;
const listCursor = z.object({ u: z.string().regex(/^\d{1,19}$/), i: z.string().max(64), q: z.string() });

export function dagServiceImpl(d: { engine: DagEngine; config: Config; clock: Clock; draining: AbortSignal }): ServiceImpl<typeof DagService> {
  const { engine, config } = d;
  const scopeOf = (tenantRaw: string, ctx: HandlerContext): Scope => {
    const caller = callerOf(ctx);
    const tenantKey = identifier(tenantRaw, "tenant_key");
    assertTenant(caller, tenantKey);
    return { by: caller.principal, tenantKey };
  };
  const runIdOf = (raw: string) => identifier(raw, "run_id");
  const viewOf = async (scope: Scope, runId: string, attempts = true) => {
    const v = await engine.view(scope, runId, attempts);
    if (!v) throw notFound(`tenant '${scope.tenantKey}' has no run '${runId}' of yours`);
    return runToWire(v);
  };

  return {
    async putDefinition(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      if (!req.definition) throw invalidArgument("definition", "is required");
      const plan = planOf(req.definition, config, false);
      const created = await engine.runs.putDefinition(scope.tenantKey, plan.definitionId, toJsonString(DefinitionSchema, req.definition), newId(d.clock.nowMs()), scope.by, d.clock.nowMs());
      return { definitionId: plan.definitionId, created };
    },

    async startRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      let plan;
      if (req.source.case === "definition") plan = planOf(req.source.value, config, true);
      else if (req.source.case === "definitionId") {
        const id = optionalText(req.source.value, "definition_id", 256);
        if (!id) throw invalidArgument("definition_id", "is required");
        plan = await engine.storedPlan(scope.tenantKey, id);
      } else throw invalidArgument("source", "give a definition or a definition_id");
      const context = jsonObject(req.contextJson, "context_json", config.payloadMaxBytes);
      const key = optionalText(req.idempotencyKey, "idempotency_key", 256);
      const { run, existing } = await engine.startRun(scope, plan, context, key);
      return { run: await viewOf(scope, run.id), existing };
    },

    async getRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      return { run: await viewOf(scope, runIdOf(req.runId)) };
    },

    async listRuns(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const statuses = req.statuses.map((s, i) => {
        const v = STATUS_FROM_WIRE[s];
        if (!v) throw invalidArgument(`statuses[${i}]`, `unknown status ${s}`);
        return v;
      });
      const definitionId = optionalText(req.definitionId, "definition_id", 256) ?? undefined;
      if (req.pageSize < 0) throw invalidArgument("page_size", `${req.pageSize} is negative`);
      const size = Math.min(req.pageSize || PAGE_DEFAULT, PAGE_MAX);
      const query = JSON.stringify([scope.tenantKey, [...statuses].sort(), definitionId ?? ""]);
      const cursor = req.pageToken ? decodeCursor(req.pageToken, listCursor) : null;
      if (cursor && cursor.q !== query) throw invalidArgument("page_token", "was issued for a different tenant or different filters");
      const rows = await engine.runs.list(scope, { statuses, definitionId }, cursor && { createdUs: BigInt(cursor.u), id: cursor.i }, size + 1);
      const page = rows.slice(0, size);
      const last = page.at(-1);
      return {
        runs: page.map((run) => runToWire({ run, tasks: [], items: new Map() }, false)),
        nextPageToken: rows.length > size && last ? encodeCursor({ u: last.createdUs.toString(), i: last.id, q: query }) : "",
      };
    },

    async cancelRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const runId = runIdOf(req.runId);
      const reason = optionalText(req.reason, "reason", 1024) ?? `cancelled by ${scope.by}`;
      await engine.change("cancel", scope, runId, (s) => s.cancel(reason));
      return { run: await viewOf(scope, runId) };
    },

    async signalRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const runId = runIdOf(req.runId);
      const event = optionalText(req.event, "event", 256);
      if (!event) throw invalidArgument("event", "is required");
      const payloadText = jsonOrNull(req.payloadJson, "payload_json", config.payloadMaxBytes);
      const payload = payloadText === null ? null : JSON.parse(payloadText);
      const { value } = await engine.change("signal", scope, runId, (s) => s.signal(event, payload));
      return { run: await viewOf(scope, runId), delivered: value };
    },

    async resumeRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const runId = runIdOf(req.runId);
      await engine.change("resume", scope, runId, (s) => s.resume());
      return { run: await viewOf(scope, runId) };
    },

    async *watchRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const runId = runIdOf(req.runId);
      yield* watchRun(engine, runId, async () => ({ run: await viewOf(scope, runId, req.withAttempts) }), (m) => m.run.status !== RunStatus.RUNNING, [ctx.signal, d.draining]);
    },
  };
}

/** DagOpsService (role `ops`): any run of a tenant, read-only, for operators and the console. */
export function dagOpsServiceImpl(engine: DagEngine): ServiceImpl<typeof DagOpsService> {
  return {
    async getRun(req, ctx) {
      const tenantKey = identifier(req.tenantKey, "tenant_key");
      assertTenant(callerOf(ctx), tenantKey);
      const runId = identifier(req.runId, "run_id");
      const v = await engine.view({ by: "", tenantKey }, runId, true, true);
      if (!v) throw notFound(`tenant '${tenantKey}' has no run '${runId}'`);
      return { run: runToWire(v) };
    },
  };
}
