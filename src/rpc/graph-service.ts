/**
 * GraphService (role `runs`, tenant-scoped, and scoped to the caller): handlers validate, call the
 * graph engine (../engines/graph/engine.ts) and shape the reply. Another caller's run id reads as
 * NOT_FOUND, like one that does not exist.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { DefinitionSchema, RunStatus, type GraphService, type RunSchema } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import type { Config } from "../config.js";
import type { Scope } from "../engines/engine.js";
import { invalidArgument, notFound } from "../domain/errors.js";
import type { GraphEngine } from "../engines/graph/engine.js";
import { graphPlanOf } from "../engines/graph/plan.js";
import type { DefinitionReads } from "../store/definitions.js";
import type { GraphRunRow } from "../store/graph-runs.js";
import { definitionCalls } from "./definition-calls.js";
import { jsonObject, optionalText } from "../domain/input.js";
import { pageOf, planFrom, runIdOf, scopeOf, watchRun } from "./run-calls.js";

const STATUS: Record<GraphRunRow["status"], RunStatus> = {
  running: RunStatus.RUNNING,
  completed: RunStatus.COMPLETED,
  stopped: RunStatus.STOPPED,
  failed: RunStatus.FAILED,
  cancelled: RunStatus.CANCELLED,
};

export function graphRunToWire(r: GraphRunRow): MessageInitShape<typeof RunSchema> {
  return {
    runId: r.runId,
    tenantKey: r.tenantKey,
    definitionId: r.definitionId,
    status: STATUS[r.status],
    task: r.task,
    steps: BigInt(r.steps),
    path: r.path,
    pathDropped: BigInt(r.pathDropped),
    runCounts: Object.fromEntries(Object.entries(r.runCounts).map(([k, v]) => [k, BigInt(v)])),
    stateJson: JSON.stringify(r.state),
    reason: r.reason ?? "",
    error: r.error ?? "",
    workItemId: r.workItemId ?? "",
    createdBy: r.createdBy,
    createdOn: timestampFromMs(r.createdOn),
  };
}

export function graphServiceImpl(d: {
  engine: GraphEngine;
  definitions: DefinitionReads;
  config: Config;
  draining: AbortSignal;
}): ServiceImpl<typeof GraphService> {
  const { engine, config } = d;
  const runOf = async (scope: Scope, runId: string) => {
    const run = await engine.get(scope, runId);
    if (!run) throw notFound(`tenant '${scope.tenantKey}' has no graph run '${runId}' of yours`);
    return run;
  };
  return {
    ...definitionCalls("graph", d.definitions, DefinitionSchema),

    async putDefinition(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      if (!req.definition) throw invalidArgument("definition", "is required");
      return engine.putDefinition(scope, req.definition);
    },

    async startRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const plan = await planFrom(
        req.source,
        (def) => graphPlanOf(def, config, true),
        (id) => engine.storedPlan(scope.tenantKey, id),
      );
      const run = await engine.startRun(scope, plan, jsonObject(req.stateJson, "state_json", config.payloadMaxBytes));
      return { run: graphRunToWire(run) };
    },

    async getRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      return { run: graphRunToWire(await runOf(scope, runIdOf(req.runId))) };
    },

    async listRuns(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const { rows, nextPageToken } = await pageOf(req, ["graph", scope.tenantKey], (cursor, limit) => engine.runs.list(scope, cursor, limit));
      return { runs: rows.map(graphRunToWire), nextPageToken };
    },

    async cancelRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const reason = optionalText(req.reason, "reason", 1024) ?? `cancelled by ${scope.by}`;
      return { run: graphRunToWire(await engine.cancel(scope, runIdOf(req.runId), reason)) };
    },

    async *watchRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const runId = runIdOf(req.runId);
      for await (const run of watchRun(
        engine.watches,
        runId,
        () => runOf(scope, runId),
        (r) => r.status !== "running",
        [ctx.signal, d.draining],
      ))
        yield { run: graphRunToWire(run) };
    },
  };
}
