/**
 * SQL for aiflow_trigger and aiflow_trigger_delivery, all of it (migration 0011).
 *
 * What must stay true:
 * - A cron trigger's tick fires once across daemons: `lockTick` takes the trigger FOR UPDATE SKIP
 *   LOCKED while its next_fire_ns is still that tick, and `moveCron` moves next_fire_ns on in the
 *   same transaction as the firing's row and run, so a tick is either wholly fired (and past) or
 *   not at all.
 * - A delivery acts once: `claimDelivery` inserts each of its replay keys (its delivery id, and the
 *   digest of what its signature covers: ../triggers/signature.ts) in the transaction that starts or
 *   moves the run; a second delivery with any of those keys finds the row (or waits for the first
 *   to commit) and inserts nothing. Digest keys contain a space, which a delivery id (visible ASCII)
 *   never does, so the two kinds share aiflow_trigger_delivery without colliding.
 * - The secret is read only by the webhook path (`forWebhook`); every other read leaves it out.
 * Nothing here calls now(): times come from the caller's clock.
 */
import { sql, type CommonQueryMethods } from "slonik";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import { ts } from "../db/values.js";

const triggerRow = z.object({
  id: z.string(),
  tenant_key: z.string(),
  name: z.string(),
  trigger_type: z.enum(["webhook", "cron"]),
  action: z.enum(["start", "signal"]),
  definition_id: z.string().nullable(),
  /** A start's engine; null: dag. */
  engine_kind: z.enum(["graph", "statemachine"]).nullable(),
  event: z.string().nullable(),
  run_id: z.string().nullable(),
  run_id_path: z.string().nullable(),
  schedule: z.string().nullable(),
  time_zone: z.string().nullable(),
  has_secret: z.boolean(),
  source: z.enum(["rpc", "file"]),
  owner: z.string(),
  next_fire_ns: z.bigint().nullable(),
  createdby: z.string(),
  /** Epoch ms. */
  createdon: z.number(),
  updatedby: z.string().nullable(),
  updatedon: z.number().nullable(),
});
export type TriggerRow = z.infer<typeof triggerRow>;

/** A trigger as put: what a definer says (validated by ../triggers/definition.ts). */
export interface TriggerWrite {
  tenantKey: string;
  name: string;
  type: "webhook" | "cron";
  action: "start" | "signal";
  definitionId: string | null;
  /** A start's engine; null: dag. */
  engineKind: "graph" | "statemachine" | null;
  event: string | null;
  runId: string | null;
  runIdPath: string | null;
  schedule: string | null;
  timeZone: string | null;
  /** null: keep the stored one. */
  secret: string | null;
  source: "rpc" | "file";
}

const COLUMNS = sql.fragment`id, tenant_key, name, trigger_type, action, definition_id, engine_kind, event, run_id, run_id_path, schedule, time_zone,
  secret IS NOT NULL AS has_secret, source, owner, next_fire_ns, createdby, createdon, updatedby, updatedon`;

export class TriggerStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /**
   * Creates or replaces the trigger of (tenant, name), owned by `by`. A cron trigger is next due at
   * `nextFireNs`, except that a replacement that keeps its schedule and time zone keeps its place
   * (a file read again at a restart must not skip or repeat a tick).
   */
  async put(w: TriggerWrite, nextFireNs: bigint | null, id: string, by: string, nowMs: number): Promise<{ row: TriggerRow; created: boolean }> {
    const trigger = this.t.id("trigger");
    const next = nextFireNs === null ? null : nextFireNs.toString();
    const row = await withDbErrors(() =>
      this.db.one(sql.type(triggerRow.extend({ created: z.boolean() }))`
        INSERT INTO ${trigger} AS t (id, tenant_key, name, trigger_type, action, definition_id, engine_kind, event, run_id, run_id_path, schedule, time_zone, secret, source,
                                     owner, next_fire_ns, createdby, createdon, updatedby, updatedon)
        VALUES (${id}, ${w.tenantKey}, ${w.name}, ${w.type}, ${w.action}, ${w.definitionId}, ${w.engineKind}, ${w.event}, ${w.runId}, ${w.runIdPath}, ${w.schedule}, ${w.timeZone},
                ${w.secret}, ${w.source}, ${by}, ${next}::int8, ${by}, ${ts(nowMs)}, ${by}, ${ts(nowMs)})
        ON CONFLICT (tenant_key, name) DO UPDATE SET
          trigger_type = EXCLUDED.trigger_type, action = EXCLUDED.action, definition_id = EXCLUDED.definition_id, engine_kind = EXCLUDED.engine_kind, event = EXCLUDED.event,
          run_id = EXCLUDED.run_id, run_id_path = EXCLUDED.run_id_path, schedule = EXCLUDED.schedule, time_zone = EXCLUDED.time_zone,
          secret = CASE WHEN EXCLUDED.trigger_type <> 'webhook' THEN NULL ELSE coalesce(EXCLUDED.secret, t.secret) END,
          source = EXCLUDED.source,
          next_fire_ns = CASE WHEN t.trigger_type = 'cron' AND EXCLUDED.trigger_type = 'cron'
                                    AND t.schedule IS NOT DISTINCT FROM EXCLUDED.schedule AND t.time_zone IS NOT DISTINCT FROM EXCLUDED.time_zone
                              THEN t.next_fire_ns ELSE EXCLUDED.next_fire_ns END,
          owner = EXCLUDED.owner, updatedby = EXCLUDED.updatedby, updatedon = EXCLUDED.updatedon
        RETURNING ${COLUMNS}, (xmax = 0) AS created`),
    );
    const { created, ...rest } = row;
    return { row: rest, created };
  }

  get(tenantKey: string, name: string): Promise<TriggerRow | null> {
    const trigger = this.t.id("trigger");
    return withDbErrors(() => this.db.maybeOne(sql.type(triggerRow)`SELECT ${COLUMNS} FROM ${trigger} WHERE tenant_key = ${tenantKey} AND name = ${name}`));
  }

  /** The tenant's triggers by name, at most `limit`. */
  list(tenantKey: string, limit: number): Promise<readonly TriggerRow[]> {
    const trigger = this.t.id("trigger");
    return withDbErrors(() =>
      this.db.any(sql.type(triggerRow)`SELECT ${COLUMNS} FROM ${trigger} WHERE tenant_key = ${tenantKey} ORDER BY name LIMIT ${limit}`),
    );
  }

  count(tenantKey: string): Promise<number> {
    const trigger = this.t.id("trigger");
    return withDbErrors(() =>
      this.db.oneFirst(sql.type(z.object({ n: z.number() }))`SELECT count(*)::int AS n FROM ${trigger} WHERE tenant_key = ${tenantKey}`),
    );
  }

  /** True when there was one to delete. */
  async delete(tenantKey: string, name: string): Promise<boolean> {
    const trigger = this.t.id("trigger");
    const res = await withDbErrors(() => this.db.query(sql.unsafe`DELETE FROM ${trigger} WHERE tenant_key = ${tenantKey} AND name = ${name}`));
    return res.rowCount > 0;
  }

  /** Deletes the file's triggers that the file no longer names (`keep`: tenant/name pairs). */
  async deleteFileTriggersExcept(keep: readonly { tenantKey: string; name: string }[]): Promise<number> {
    const trigger = this.t.id("trigger");
    const res = await withDbErrors(() =>
      this.db.query(sql.unsafe`
        DELETE FROM ${trigger} WHERE source = 'file'
           AND (tenant_key, name) NOT IN (SELECT * FROM unnest(${sql.array(
             keep.map((k) => k.tenantKey),
             "text",
           )}, ${sql.array(
             keep.map((k) => k.name),
             "text",
           )}))`),
    );
    return res.rowCount;
  }

  /** A webhook trigger with its secret, for the one path that verifies signatures. */
  forWebhook(tenantKey: string, name: string): Promise<(TriggerRow & { secret: string | null }) | null> {
    const trigger = this.t.id("trigger");
    return withDbErrors(() =>
      this.db.maybeOne(
        sql.type(
          triggerRow.extend({ secret: z.string().nullable() }),
        )`SELECT ${COLUMNS}, secret FROM ${trigger} WHERE tenant_key = ${tenantKey} AND name = ${name}`,
      ),
    );
  }

  /** Cron triggers due at `nowNs`, earliest tick first (read without a lock: `lockTick` decides who fires). */
  dueCron(nowNs: bigint, limit: number): Promise<readonly TriggerRow[]> {
    const trigger = this.t.id("trigger");
    return withDbErrors(() =>
      this.db.any(sql.type(triggerRow)`
        SELECT ${COLUMNS} FROM ${trigger}
         WHERE next_fire_ns IS NOT NULL AND next_fire_ns <= ${nowNs.toString()}::int8 AND trigger_type = 'cron'
         ORDER BY next_fire_ns
         LIMIT ${limit}`),
    );
  }

  /**
   * Locks a cron trigger for its tick `tickNs` until the transaction ends: false when another daemon
   * holds it (SKIP LOCKED) or has fired that tick already (next_fire_ns moved on).
   */
  async lockTick(id: string, tickNs: bigint): Promise<boolean> {
    const trigger = this.t.id("trigger");
    const row = await withDbErrors(() =>
      this.db.maybeOne(sql.type(z.object({ id: z.string() }))`
        SELECT id FROM ${trigger} WHERE id = ${id} AND next_fire_ns = ${tickNs.toString()}::int8 FOR UPDATE SKIP LOCKED`),
    );
    return row !== null;
  }

  /** Moves a locked cron trigger's next tick on (null: its schedule has no more ticks). */
  async moveCron(id: string, nextFireNs: bigint | null): Promise<void> {
    const trigger = this.t.id("trigger");
    const next = nextFireNs === null ? null : nextFireNs.toString();
    await withDbErrors(() => this.db.query(sql.unsafe`UPDATE ${trigger} SET next_fire_ns = ${next}::int8 WHERE id = ${id}`));
  }

  /**
   * The webhook triggers' tenants: true when `tenantKey` has at least one. Only their firing logs
   * take refusals of deliveries that proved nothing (../triggers/webhook.ts).
   */
  async servesWebhooks(tenantKey: string): Promise<boolean> {
    const trigger = this.t.id("trigger");
    const row = await withDbErrors(() =>
      this.db.maybeOne(
        sql.type(z.object({ one: z.number() }))`SELECT 1 AS one FROM ${trigger} WHERE tenant_key = ${tenantKey} AND trigger_type = 'webhook' LIMIT 1`,
      ),
    );
    return row !== null;
  }

  /** The first of `keys` already acted on, with the firing that acted on it, or null (read without a lock: `claimDelivery` decides). */
  async claimed(tenantKey: string, triggerName: string, keys: readonly string[]): Promise<{ key: string; firingId: string } | null> {
    if (keys.length === 0) return null;
    const delivery = this.t.id("trigger_delivery");
    const rows = await withDbErrors(() =>
      this.db.any(sql.type(z.object({ delivery_id: z.string(), firing_id: z.string() }))`
        SELECT delivery_id, firing_id FROM ${delivery}
         WHERE tenant_key = ${tenantKey} AND trigger_name = ${triggerName} AND delivery_id = ANY(${sql.array([...keys], "text")})`),
    );
    const key = keys.find((k) => rows.some((r) => r.delivery_id === k));
    return key === undefined ? null : { key, firingId: rows.find((r) => r.delivery_id === key)!.firing_id };
  }

  /** Records a delivery's replay key as acted on; false when it already was (a replay). */
  async claimDelivery(tenantKey: string, triggerName: string, deliveryId: string, firingId: string, nowMs: number): Promise<boolean> {
    const delivery = this.t.id("trigger_delivery");
    const row = await withDbErrors(() =>
      this.db.maybeOne(sql.type(z.object({ firing_id: z.string() }))`
        INSERT INTO ${delivery} (tenant_key, trigger_name, delivery_id, firing_id, createdon)
        VALUES (${tenantKey}, ${triggerName}, ${deliveryId}, ${firingId}, ${ts(nowMs)})
        ON CONFLICT DO NOTHING
        RETURNING firing_id`),
    );
    return row !== null;
  }

  /**
   * Forgets replay keys recorded before `cutoffMs` (the firing retention: the firings they point at
   * are gone too). From then on a GitHub-signed body that acted then could act again: docs/engines.md
   * says so.
   */
  async sweepDeliveries(cutoffMs: number): Promise<number> {
    const delivery = this.t.id("trigger_delivery");
    const res = await withDbErrors(() => this.db.query(sql.unsafe`DELETE FROM ${delivery} WHERE createdon < ${ts(cutoffMs)}`));
    return res.rowCount;
  }
}
