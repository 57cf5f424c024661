/**
 * MachineService (role `runs`, tenant-scoped, and scoped to the caller): handlers validate, call the
 * state-machine engine (../engines/machine/engine.ts) and shape the reply. Another caller's run id
 * reads as NOT_FOUND, like one that does not exist.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { ServiceImpl } from "@connectrpc/connect";
import { DefinitionSchema, type MachineService, type RunSchema } from "@aiflow/wire/gen/aiflow/machine/v1/machine_pb.js";
import type { Config } from "../config.js";
import type { Scope } from "../engines/engine.js";
import { invalidArgument, notFound } from "../domain/errors.js";
import type { MachineEngine } from "../engines/machine/engine.js";
import { EVENT, machinePlanOf } from "../engines/machine/plan.js";
import type { DefinitionReads } from "../store/definitions.js";
import type { MachineRunRow } from "../store/machine-runs.js";
import { definitionCalls } from "./definition-calls.js";
import { jsonObject, jsonOrNull, optionalText } from "../domain/input.js";
import { pageOf, planFrom, runIdOf, scopeOf, watchRun } from "./run-calls.js";

export function machineRunToWire(r: MachineRunRow): MessageInitShape<typeof RunSchema> {
  return {
    runId: r.runId,
    tenantKey: r.tenantKey,
    definitionId: r.definitionId,
    state: r.state,
    contextJson: JSON.stringify(r.context),
    history: r.history,
    historyDropped: BigInt(r.historyDropped),
    live: r.live,
    suspended: r.suspended,
    failure: r.failure ?? "",
    reason: r.reason ?? "",
    pendingEvent: r.pending?.event ?? "",
    pendingTo: r.pending?.to ?? "",
    workItemId: r.workItemId ?? "",
    createdBy: r.createdBy,
    createdOn: timestampFromMs(r.createdOn),
  };
}

/** An event's name, as a transition names it. */
export function eventName(raw: string): string {
  if (!EVENT.test(raw)) throw invalidArgument("event", raw === "" ? "is required" : `'${raw.slice(0, 40)}' must be 1-128 of letters, digits and '_.:-'`);
  return raw;
}

export function machineServiceImpl(d: {
  engine: MachineEngine;
  definitions: DefinitionReads;
  config: Config;
  draining: AbortSignal;
}): ServiceImpl<typeof MachineService> {
  const { engine, config } = d;
  const runOf = async (scope: Scope, runId: string) => {
    const run = await engine.get(scope, runId);
    if (!run) throw notFound(`tenant '${scope.tenantKey}' has no machine run '${runId}' of yours`);
    return run;
  };
  return {
    ...definitionCalls("statemachine", d.definitions, DefinitionSchema),

    async putDefinition(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      if (!req.definition) throw invalidArgument("definition", "is required");
      return engine.putDefinition(scope, req.definition);
    },

    async startRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const plan = await planFrom(
        req.source,
        (def) => machinePlanOf(def, config, true),
        (id) => engine.storedPlan(scope.tenantKey, id),
      );
      const run = await engine.startRun(scope, plan, jsonObject(req.contextJson, "context_json", config.payloadMaxBytes));
      return { run: machineRunToWire(run) };
    },

    async getRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      return { run: machineRunToWire(await runOf(scope, runIdOf(req.runId))) };
    },

    async listRuns(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const { rows, nextPageToken } = await pageOf(req, ["statemachine", scope.tenantKey], (cursor, limit) => engine.runs.list(scope, cursor, limit));
      return { runs: rows.map(machineRunToWire), nextPageToken };
    },

    async signalRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const runId = runIdOf(req.runId);
      const event = eventName(req.event);
      const text = jsonOrNull(req.payloadJson, "payload_json", config.payloadMaxBytes);
      const { run, to, actionStarted } = await engine.signal(scope, runId, event, text === null ? null : JSON.parse(text));
      return { run: machineRunToWire(run), to, actionStarted };
    },

    async cancelRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const reason = optionalText(req.reason, "reason", 1024) ?? `cancelled by ${scope.by}`;
      return { run: machineRunToWire(await engine.cancel(scope, runIdOf(req.runId), reason)) };
    },

    async *watchRun(req, ctx) {
      const scope = scopeOf(req.tenantKey, ctx);
      const runId = runIdOf(req.runId);
      for await (const run of watchRun(
        engine.watches,
        runId,
        () => runOf(scope, runId),
        (r) => !r.live,
        [ctx.signal, d.draining],
      ))
        yield { run: machineRunToWire(run) };
    },
  };
}
