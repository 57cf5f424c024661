/**
 * What a trigger is, checked once for both ways of defining one (TriggerService.PutTrigger and the
 * --triggers-file): every refusal names the field and says what would be accepted. A definition
 * that passes here can always fire: its schedule parses in its time zone, an action has what it
 * needs, a webhook has a secret (or keeps its stored one).
 *
 * Cron schedules are five fields evaluated by croner (zero dependencies, IANA zones through Intl):
 * a day-of-month and a day-of-week that are both restricted match either, as classic cron does; a
 * local time skipped by a daylight-saving change fires at the first instant after it.
 */
import { Cron } from "croner";
import { msToNs } from "../clock.js";
import { ENGINE_KINDS, isEngineKind, type EngineKind } from "../domain/engine-kinds.js";
import { invalidArgument } from "../domain/errors.js";
import type { TriggerWrite } from "../store/triggers.js";

export const TRIGGER_NAME = /^[A-Za-z0-9_.:-]{1,64}$/;
const RUN_ID_PATH = /^[A-Za-z0-9_-]{1,128}(\.[A-Za-z0-9_-]{1,128}){0,15}$/;
const SECRET_MIN = 16;
const SECRET_MAX = 1024;
const NAME_MAX = 256;

/** What a definer says, before it is checked; strings empty when not given. */
export interface TriggerInput {
  tenantKey: string;
  name: string;
  type: "webhook" | "cron" | "";
  action: "start" | "signal" | "";
  definitionId: string;
  /** A start's engine: "" (dag), dag, graph or statemachine. */
  engineKind: string;
  event: string;
  runId: string;
  runIdPath: string;
  schedule: string;
  timeZone: string;
  secret: string;
}

/**
 * The checked trigger. `field` turns a field's name into what the definer calls it (a protobuf
 * field in an RPC, `triggers[3].schedule` in the file). `hasStoredSecret`: a replacement may omit
 * the webhook secret and keep the stored one.
 */
export function checkTrigger(i: TriggerInput, source: "rpc" | "file", hasStoredSecret: boolean, field: (f: string) => string = (f) => f): TriggerWrite {
  const bad = (f: string, why: string) => invalidArgument(field(f), why);
  if (!TRIGGER_NAME.test(i.name)) throw bad("name", `'${i.name.slice(0, 80)}' is not 1-64 of letters, digits, '_', '.', ':' and '-'`);
  if (i.type !== "webhook" && i.type !== "cron") throw bad("type", "give webhook or cron");
  if (i.action !== "start" && i.action !== "signal") throw bad("action", "give start or signal");
  const text = (f: string, v: string) => {
    if (v.length > NAME_MAX) throw bad(f, `is longer than ${NAME_MAX} characters`);
    return v === "" ? null : v;
  };
  const write: TriggerWrite = {
    tenantKey: i.tenantKey,
    name: i.name,
    type: i.type,
    action: i.action,
    definitionId: null,
    engineKind: null,
    event: null,
    runId: null,
    runIdPath: null,
    schedule: null,
    timeZone: null,
    secret: null,
    source,
  };
  if (i.action === "start") {
    write.definitionId = text("definition_id", i.definitionId);
    if (!write.definitionId) throw bad("definition_id", "is required to start a run: name a definition stored with its engine's PutDefinition");
    if (i.engineKind !== "" && !isEngineKind(i.engineKind))
      throw bad("engine_kind", `'${i.engineKind.slice(0, 40)}' is not an engine: give ${ENGINE_KINDS.slice(0, -1).join(", ")} or ${ENGINE_KINDS.at(-1)}`);
    write.engineKind = i.engineKind === "" || i.engineKind === "dag" ? null : (i.engineKind as Exclude<EngineKind, "dag">);
    for (const [f, v] of [
      ["event", i.event],
      ["run_id", i.runId],
      ["run_id_path", i.runIdPath],
    ] as const)
      if (v !== "") throw bad(f, "is for a signal; a start trigger starts a new run");
  } else {
    write.event = text("event", i.event);
    if (!write.event) throw bad("event", "is required to signal a run: the event its wait node waits for");
    if (i.definitionId !== "") throw bad("definition_id", "is for a start; a signal trigger moves an existing run");
    if (i.engineKind !== "") throw bad("engine_kind", "is for a start; a signal goes to whichever engine the run directory names for the run");
    if ((i.runId === "") === (i.runIdPath === ""))
      throw bad("run_id", "give the run to signal as run_id, or (webhooks) as run_id_path into the body, not both");
    if (i.runIdPath !== "") {
      if (i.type !== "webhook") throw bad("run_id_path", "only a webhook has a body to read the run from; give run_id");
      if (!RUN_ID_PATH.test(i.runIdPath))
        throw bad("run_id_path", `'${i.runIdPath.slice(0, 80)}' is not a dotted path of keys such as 'run_id' or 'deployment.run'`);
      write.runIdPath = i.runIdPath;
    } else write.runId = text("run_id", i.runId);
  }
  if (i.type === "cron") {
    if (i.secret !== "") throw bad("secret", "is for a webhook; a cron trigger has no sender");
    write.schedule = i.schedule.trim();
    write.timeZone = i.timeZone === "" ? null : i.timeZone;
    cronOf(write.schedule, write.timeZone, field);
  } else {
    if (i.schedule !== "" || i.timeZone !== "") throw bad(i.schedule !== "" ? "schedule" : "time_zone", "is for a cron trigger");
    if (i.secret === "" && !hasStoredSecret)
      throw bad("secret", `a webhook needs a secret (${SECRET_MIN}-${SECRET_MAX} bytes) that senders sign its body with`);
    if (i.secret !== "") {
      const n = Buffer.byteLength(i.secret);
      // The length only: a secret never appears in an error.
      if (n < SECRET_MIN || n > SECRET_MAX) throw bad("secret", `is ${n} bytes; give ${SECRET_MIN}-${SECRET_MAX}`);
      write.secret = i.secret;
    }
  }
  return write;
}

/** The schedule as croner reads it, refused naming the field when it does not parse or the zone is unknown. */
export function cronOf(schedule: string, timeZone: string | null, field: (f: string) => string = (f) => f): Cron {
  if (schedule.split(/\s+/).filter(Boolean).length !== 5)
    throw invalidArgument(field("schedule"), `'${schedule.slice(0, 80)}' is not five fields (minute hour day-of-month month day-of-week), e.g. '*/5 * * * *'`);
  if (timeZone !== null) {
    try {
      new Intl.DateTimeFormat("en-US", { timeZone });
    } catch {
      throw invalidArgument(field("time_zone"), `'${timeZone.slice(0, 80)}' is not an IANA time zone such as 'Europe/Berlin' or 'UTC'`);
    }
  }
  try {
    return new Cron(schedule, { paused: true, mode: "5-part", ...(timeZone ? { timezone: timeZone } : {}) });
  } catch (err) {
    throw invalidArgument(field("schedule"), `'${schedule.slice(0, 80)}' does not parse: ${(err as Error).message.replace(/^CronPattern: /, "")}`);
  }
}

/** The schedule's first tick strictly after `afterMs`, in epoch ms; null when it has none. */
export function nextTick(cron: Cron, afterMs: number): number | null {
  return cron.nextRun(new Date(afterMs))?.getTime() ?? null;
}

/** A cron trigger's first tick after `nowMs` (epoch ns); null for a webhook. */
export function firstTick(schedule: string | null, timeZone: string | null, nowMs: number): bigint | null {
  if (schedule === null) return null;
  const next = nextTick(cronOf(schedule, timeZone), nowMs);
  return next === null ? null : msToNs(next);
}
