/**
 * DagService (role `runs`, tenant-scoped, and scoped to the caller): handlers validate, check the
 * tenant against the token, call the engine and shape the reply (./dag-messages.ts). Every run the
 * caller reaches is found with createdby = the caller in the statement itself, so another caller's
 * run id reads as NOT_FOUND, the same as one that does not exist.
 */
import type { ServiceImpl } from "@connectrpc/connect";
import { DefinitionSchema, RunStatus, type DagOpsService, type DagService } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import type { Config } from "../config.js";
import type { DagEngine, Scope } from "../engines/dag/engine.js";
import type { DefinitionReads } from "../store/definitions.js";
import { definitionCalls } from "./definition-calls.js";
import { planOf } from "../engines/dag/plan.js";
import { invalidArgument, notFound } from "../domain/errors.js";
import { assertTenant, callerOf } from "./caller.js";
import { identifier, jsonObject, jsonOrNull, optionalText } from "../domain/input.js";
import { runToWire, STATUS_FROM_WIRE } from "./dag-messages.js";
import { pageOf, planFrom, runIdOf, scopeOf, watchRun } from "./run-calls.js";

export function dagServiceImpl(d: { engine: DagEngine; definitions: DefinitionReads; config: Config; draining: AbortSignal }): ServiceImpl<typeof DagService> {
  const { engine, config } = d;
  const viewOf = async (scope: Scope, runId: string, attempts = true) => {
    const v = await engine.view(scope, runId, attempts);
    if (!v) throw notFound(`tenant '${scope.tenantKey}' has no run '${runId}' of yours`);
    return runToWire(v);
  };

  return {
    ...definitionCalls("dag", d.definitions, DefinitionSchema),

    async putDefinition(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      if (!req.definition) throw invalidArgument("definition", "is required");
      return engine.putDefinition(scope, req.definition);
    },

    async startRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const plan = await planFrom(
        req.source,
        (def) => planOf(def, config, true),
        (id) => engine.storedPlan(scope.tenantKey, id),
      );
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
      const query = [scope.tenantKey, [...statuses].sort(), definitionId ?? ""];
      const { rows, nextPageToken } = await pageOf(req, query, (cursor, limit) => engine.runs.list(scope, { statuses, definitionId }, cursor, limit));
      return { runs: rows.map((run) => runToWire({ run, tasks: [], items: new Map() }, false)), nextPageToken };
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
      yield* watchRun(
        engine.watches,
        runId,
        async () => ({ run: await viewOf(scope, runId, req.withAttempts) }),
        (m) => m.run.status !== RunStatus.RUNNING,
        [ctx.signal, d.draining],
      );
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
