/**
 * SQL for the definitions the engines store (aiflow_engine_definition, migrations 0012 and 0017):
 * one row per tenant, engine kind and definition id, replaced by a later put. Reads for callers
 * (GetDefinition, ListDefinitions) are ./definitions.ts's.
 */
import { sql, type CommonQueryMethods } from "slonik";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import { ts } from "../db/values.js";
import type { EngineKind } from "../domain/engine-kinds.js";

export class EngineDefinitionStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /** Stores a definition (protobuf JSON) under its id; true when it is new. */
  put(kind: EngineKind, tenantKey: string, definitionId: string, bodyJson: string, id: string, by: string, nowMs: number): Promise<boolean> {
    const def = this.t.id("engine_definition");
    return withDbErrors(() =>
      this.db.oneFirst(sql.type(z.object({ created: z.boolean() }))`
        INSERT INTO ${def} AS d (id, tenant_key, engine_kind, definition_id, body, createdby, createdon, updatedby, updatedon)
        VALUES (${id}, ${tenantKey}, ${kind}, ${definitionId}, ${bodyJson}::jsonb, ${by}, ${ts(nowMs)}, ${by}, ${ts(nowMs)})
        ON CONFLICT (tenant_key, engine_kind, definition_id) DO UPDATE SET body = EXCLUDED.body, updatedby = EXCLUDED.updatedby, updatedon = EXCLUDED.updatedon
        RETURNING (xmax = 0) AS created`),
    );
  }

  /** A stored definition's protobuf JSON text, or null. */
  get(kind: EngineKind, tenantKey: string, definitionId: string): Promise<string | null> {
    const def = this.t.id("engine_definition");
    return withDbErrors(() =>
      this.db.maybeOneFirst(
        sql.type(
          z.object({ body: z.string() }),
        )`SELECT body::text AS body FROM ${def} WHERE tenant_key = ${tenantKey} AND engine_kind = ${kind} AND definition_id = ${definitionId}`,
      ),
    );
  }
}
