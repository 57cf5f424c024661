/**
 * Reads of the definitions each engine stores (GetDefinition, ListDefinitions, and a trigger's
 * check that what it would start exists), all in aiflow_engine_definition (migrations 0012 and
 * 0017), one row per tenant, engine and definition id. The writes stay with their engines
 * (EngineDefinitionStore.put), which validate what they store.
 *
 * What must stay true: every read names the tenant in its statement, so one tenant never sees
 * another's definitions; a list is in order of definition id, so a page's last id is its cursor.
 */
import { sql, type CommonQueryMethods } from "slonik";
import { z } from "zod";
import { withDbErrors } from "../db/errors.js";
import type { Tables } from "../db/tables.js";
import type { EngineKind } from "../domain/engine-kinds.js";

/** An engine that stores definitions, as triggers and the run directory name it. */
export type DefinitionKind = EngineKind;

const storedRow = z.object({
  definition_id: z.string(),
  createdby: z.string(),
  createdon: z.number(),
  updatedby: z.string().nullable(),
  updatedon: z.number().nullable(),
});
export type StoredDefinitionRow = z.infer<typeof storedRow>;

export class DefinitionReads {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /** The table a kind's definitions are in, and the condition that picks the tenant's of that kind. */
  #of(kind: DefinitionKind, tenantKey: string) {
    return { table: this.t.id("engine_definition"), where: sql.fragment`tenant_key = ${tenantKey} AND engine_kind = ${kind}` };
  }

  /** The tenant's stored definition (its protobuf JSON text) and its record, or null. */
  get(kind: DefinitionKind, tenantKey: string, definitionId: string): Promise<(StoredDefinitionRow & { body: string }) | null> {
    const { table, where } = this.#of(kind, tenantKey);
    return withDbErrors(() =>
      this.db.maybeOne(
        sql.type(storedRow.extend({ body: z.string() }))`
          SELECT definition_id, createdby, createdon, updatedby, updatedon, body::text AS body
            FROM ${table} WHERE ${where} AND definition_id = ${definitionId}`,
      ),
    );
  }

  /** Whether the tenant has stored a definition of this id. */
  exists(kind: DefinitionKind, tenantKey: string, definitionId: string): Promise<boolean> {
    const { table, where } = this.#of(kind, tenantKey);
    return withDbErrors(() => this.db.exists(sql.unsafe`SELECT 1 FROM ${table} WHERE ${where} AND definition_id = ${definitionId}`));
  }

  /** Up to `limit` of the tenant's definitions with ids after `after`, in order of id, without bodies. */
  list(kind: DefinitionKind, tenantKey: string, after: string | null, limit: number): Promise<readonly StoredDefinitionRow[]> {
    const { table, where } = this.#of(kind, tenantKey);
    const from = after === null ? sql.fragment`TRUE` : sql.fragment`definition_id > ${after}`;
    return withDbErrors(() =>
      this.db.any(
        sql.type(storedRow)`
          SELECT definition_id, createdby, createdon, updatedby, updatedon
            FROM ${table} WHERE ${where} AND ${from}
           ORDER BY definition_id LIMIT ${limit}`,
      ),
    );
  }
}
