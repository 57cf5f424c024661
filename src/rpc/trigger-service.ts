/**
 * TriggerService (role `runs`, tenant-scoped): handlers validate (../triggers/definition.ts), check
 * the tenant against the caller's token, call the store and shape the reply. A trigger belongs to
 * its tenant; whoever puts it last owns the runs it starts. The secret goes in and never comes out.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { Action, TriggerType, type TriggerSchema, type TriggerService } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import type { Clock } from "../clock.js";
import { failedPrecondition, invalidArgument, notFound, resourceExhausted } from "../domain/errors.js";
import { assertTenant, callerOf } from "./caller.js";
import type { DefinitionReads } from "../store/definitions.js";
import type { TriggerRow, TriggerStore } from "../store/triggers.js";
import { checkTrigger, firstTick, TRIGGER_NAME, type TriggerInput } from "../triggers/definition.js";
import { newId } from "../util/ids.js";
import { identifier } from "../domain/input.js";

/** Triggers one tenant may have: ListTriggers answers them all in one message. */
export const TRIGGERS_PER_TENANT = 1_000;

export function triggerServiceImpl(d: { triggers: TriggerStore; definitions: DefinitionReads; clock: Clock }): ServiceImpl<typeof TriggerService> {
  const tenantOf = (raw: string, ctx: HandlerContext) => {
    const tenantKey = identifier(raw, "tenant_key");
    assertTenant(callerOf(ctx), tenantKey);
    return tenantKey;
  };
  const nameOf = (raw: string) => {
    if (!TRIGGER_NAME.test(raw))
      throw invalidArgument(
        "name",
        raw === "" ? "is required" : `'${raw.slice(0, 80)}' is not a trigger name (1-64 of letters, digits, '_', '.', ':' and '-')`,
      );
    return raw;
  };
  return {
    async putTrigger(req, ctx) {
      const tenantKey = tenantOf(req.tenantKey, ctx);
      const t = req.trigger;
      const input: TriggerInput = {
        tenantKey,
        name: t?.name ?? "",
        type: t?.type === TriggerType.WEBHOOK ? "webhook" : t?.type === TriggerType.CRON ? "cron" : "",
        action: t?.action === Action.START ? "start" : t?.action === Action.SIGNAL ? "signal" : "",
        definitionId: t?.definitionId ?? "",
        engineKind: t?.engineKind ?? "",
        event: t?.event ?? "",
        runId: t?.runId ?? "",
        runIdPath: t?.runIdPath ?? "",
        schedule: t?.schedule ?? "",
        timeZone: t?.timeZone ?? "",
        secret: t?.secret ?? "",
      };
      const stored = TRIGGER_NAME.test(input.name) ? await d.triggers.get(tenantKey, input.name) : null;
      const write = checkTrigger(input, "rpc", stored?.has_secret === true && stored.trigger_type === "webhook", (f) => `trigger.${f}`);
      // A start names a definition the tenant has stored: one that is not there would only fail at
      // every firing (a webhook's sender sees 404), so the mistake is refused where it is made.
      // (The --triggers-file is applied before any RPC can store one, so it is not checked there.)
      const kind = write.engineKind ?? "dag";
      if (write.definitionId !== null && !(await d.definitions.exists(kind, tenantKey, write.definitionId)))
        throw failedPrecondition(
          `trigger.definition_id: tenant '${tenantKey}' has no stored ${kind} definition '${write.definitionId}': store it first (PutDefinition, or aiflowctl definitions put FILE --engine ${kind} --tenant ${tenantKey})`,
        );
      if (!stored && (await d.triggers.count(tenantKey)) >= TRIGGERS_PER_TENANT)
        throw resourceExhausted(`tenant '${tenantKey}' has ${TRIGGERS_PER_TENANT} triggers, the most it may have; delete one first`);
      const nowMs = d.clock.nowMs();
      const next = firstTick(write.schedule, write.timeZone, nowMs);
      const { row, created } = await d.triggers.put(write, next, newId(nowMs), callerOf(ctx).principal, nowMs);
      return { trigger: triggerToWire(row), created };
    },

    async getTrigger(req, ctx) {
      const tenantKey = tenantOf(req.tenantKey, ctx);
      const name = nameOf(req.name);
      const row = await d.triggers.get(tenantKey, name);
      if (!row) throw notFound(`tenant '${tenantKey}' has no trigger '${name.slice(0, 80)}'`);
      return { trigger: triggerToWire(row) };
    },

    async listTriggers(req, ctx) {
      const tenantKey = tenantOf(req.tenantKey, ctx);
      return { triggers: (await d.triggers.list(tenantKey, TRIGGERS_PER_TENANT)).map(triggerToWire) };
    },

    async deleteTrigger(req, ctx) {
      const tenantKey = tenantOf(req.tenantKey, ctx);
      const name = nameOf(req.name);
      if (!(await d.triggers.delete(tenantKey, name))) throw notFound(`tenant '${tenantKey}' has no trigger '${name.slice(0, 80)}'`);
      return {};
    },
  };
}

export function triggerToWire(r: TriggerRow): MessageInitShape<typeof TriggerSchema> {
  return {
    name: r.name,
    type: r.trigger_type === "webhook" ? TriggerType.WEBHOOK : TriggerType.CRON,
    action: r.action === "start" ? Action.START : Action.SIGNAL,
    definitionId: r.definition_id ?? "",
    engineKind: r.action === "start" ? (r.engine_kind ?? "dag") : "",
    event: r.event ?? "",
    runId: r.run_id ?? "",
    runIdPath: r.run_id_path ?? "",
    schedule: r.schedule ?? "",
    timeZone: r.time_zone ?? "",
    hasSecret: r.has_secret,
    owner: r.owner,
    source: r.source,
    nextFire: r.next_fire_ns === null ? undefined : timestampFromMs(Number(r.next_fire_ns / 1_000_000n)),
    createdOn: timestampFromMs(r.createdon),
    updatedOn: r.updatedon === null ? undefined : timestampFromMs(r.updatedon),
  };
}
