/**
 * The --triggers-file: triggers an operator keeps beside the daemon's other configuration, put at
 * every start. A JSON object `{"triggers": [...]}`, each entry:
 *
 *   {"tenant": "acme", "name": "on-push", "type": "webhook", "action": "start", "definition_id": "deploy",
 *    "owner": "spiffe://aiflow/runs/ci", "secret_env": "AIFLOW_HOOK_ON_PUSH"}
 *   {"tenant": "acme", "name": "nightly", "type": "cron", "schedule": "0 2 * * *", "time_zone": "Europe/Berlin",
 *    "action": "start", "definition_id": "report", "owner": "spiffe://aiflow/runs/ci"}
 *
 * `owner` is the identity the runs belong to (a runs token's name or certificate identity), since
 * no caller puts these. A webhook's secret comes from an environment variable (`secret_env`) or a
 * file (`secret_file`), never the triggers file itself, which is configuration and may be committed.
 * The file's triggers that it no longer names are deleted; triggers put by RPC are left alone. A
 * file that does not read or check is a ConfigError naming the entry and field: the daemon does not
 * start on half a file.
 */
import { readFileSync } from "node:fs";
import { z } from "zod";
import { AppError, ConfigError } from "../domain/errors.js";
import { isTenantKey } from "../domain/names.js";
import type { TriggerStore, TriggerWrite } from "../store/triggers.js";
import { newId } from "../util/ids.js";
import { checkTrigger, firstTick } from "./definition.js";

const FLAG = "--triggers-file";

const entry = z
  .object({
    tenant: z.string(),
    name: z.string(),
    type: z.enum(["webhook", "cron"]),
    action: z.enum(["start", "signal"]),
    owner: z.string().min(1).max(256),
    definition_id: z.string().optional(),
    engine_kind: z.string().optional(),
    event: z.string().optional(),
    run_id: z.string().optional(),
    run_id_path: z.string().optional(),
    schedule: z.string().optional(),
    time_zone: z.string().optional(),
    secret_env: z.string().optional(),
    secret_file: z.string().optional(),
  })
  .strict();
const file = z.object({ triggers: z.array(entry).max(10_000) }).strict();

export interface FileTrigger {
  write: TriggerWrite;
  owner: string;
}

/** Reads and checks the file; every problem is a ConfigError that names the entry. */
export function readTriggersFile(path: string, env: NodeJS.ProcessEnv = process.env): FileTrigger[] {
  let parsed: z.infer<typeof file>;
  try {
    parsed = file.parse(JSON.parse(readFileSync(path, "utf8")));
  } catch (err) {
    const why = err instanceof z.ZodError ? err.issues.map((i) => `${i.path.join(".") || "(top)"}: ${i.message}`).join("; ") : (err as Error).message;
    throw new ConfigError(FLAG, `${path}: ${why}`);
  }
  const seen = new Set<string>();
  return parsed.triggers.map((e, i) => {
    const at = `${path}: triggers[${i}]`;
    if (!isTenantKey(e.tenant)) throw new ConfigError(FLAG, `${at}.tenant: '${e.tenant.slice(0, 80)}' is not a tenant key`);
    const key = `${e.tenant}/${e.name}`;
    if (seen.has(key)) throw new ConfigError(FLAG, `${at}: tenant '${e.tenant}' names trigger '${e.name}' twice`);
    seen.add(key);
    let secret = "";
    if (e.secret_env !== undefined && e.secret_file !== undefined) throw new ConfigError(FLAG, `${at}: give secret_env or secret_file, not both`);
    if (e.secret_env !== undefined) {
      secret = env[e.secret_env] ?? "";
      if (secret === "") throw new ConfigError(FLAG, `${at}.secret_env: the environment has no ${e.secret_env}`);
    }
    if (e.secret_file !== undefined) {
      try {
        secret = readFileSync(e.secret_file, "utf8").trim();
      } catch (err) {
        throw new ConfigError(FLAG, `${at}.secret_file: cannot read ${e.secret_file}: ${(err as NodeJS.ErrnoException).code ?? "error"}`);
      }
    }
    try {
      const write = checkTrigger(
        {
          tenantKey: e.tenant,
          name: e.name,
          type: e.type,
          action: e.action,
          definitionId: e.definition_id ?? "",
          engineKind: e.engine_kind ?? "",
          event: e.event ?? "",
          runId: e.run_id ?? "",
          runIdPath: e.run_id_path ?? "",
          schedule: e.schedule ?? "",
          timeZone: e.time_zone ?? "",
          secret,
        },
        "file",
        false,
        (f) => `${at}.${f === "secret" ? "secret_env" : f}`,
      );
      return { write, owner: e.owner };
    } catch (err) {
      if (err instanceof AppError) throw new ConfigError(FLAG, err.message);
      throw err;
    }
  });
}

/** Puts the file's triggers (a cron trigger that keeps its schedule keeps its next tick) and deletes the file's triggers it no longer names. */
export async function applyTriggersFile(store: TriggerStore, triggers: readonly FileTrigger[], nowMs: number): Promise<void> {
  for (const t of triggers) await store.put(t.write, firstTick(t.write.schedule, t.write.timeZone, nowMs), newId(nowMs), t.owner, nowMs);
  await store.deleteFileTriggersExcept(triggers.map((t) => ({ tenantKey: t.write.tenantKey, name: t.write.name })));
}
