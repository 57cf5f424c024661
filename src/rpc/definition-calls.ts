/**
 * GetDefinition and ListDefinitions, the same for DagService, GraphService and MachineService
 * (role `runs`, tenant-scoped like PutDefinition: a tenant's definitions are shared by everyone
 * the tenant's tokens name, as StartRun of a stored definition reads them).
 *
 * What must stay true: a definition comes back as PutDefinition stored it (its protobuf JSON,
 * read with the engine's schema); a page token names its tenant, and one issued for another
 * tenant is refused rather than continuing that tenant's list.
 */
import { fromJson, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import { timestampFromMs, type Timestamp } from "@bufbuild/protobuf/wkt";
import type { HandlerContext } from "@connectrpc/connect";
import { z } from "zod";
import { invalidArgument, notFound } from "../domain/errors.js";
import type { DefinitionKind, DefinitionReads, StoredDefinitionRow } from "../store/definitions.js";
import { decodeCursor, encodeCursor } from "./input/page-tokens.js";
import { optionalText } from "../domain/input.js";
import { scopeOf } from "./run-calls.js";

const PAGE_DEFAULT = 50;
const PAGE_MAX = 500;
const cursor = z.object({ t: z.string(), k: z.string() });
const LABEL: Record<DefinitionKind, string> = { dag: "DAG", graph: "graph", statemachine: "state-machine" };

export interface StoredDefinitionWire {
  definitionId: string;
  createdBy: string;
  createdOn: Timestamp;
  updatedBy: string;
  updatedOn: Timestamp;
}

function storedToWire(r: StoredDefinitionRow): StoredDefinitionWire {
  return {
    definitionId: r.definition_id,
    createdBy: r.createdby,
    createdOn: timestampFromMs(r.createdon),
    updatedBy: r.updatedby ?? r.createdby,
    updatedOn: timestampFromMs(r.updatedon ?? r.createdon),
  };
}

/** A request's definition id: required, at most the 256 characters a definition's id may have. */
export function definitionIdOf(raw: string): string {
  const id = optionalText(raw, "definition_id", 256);
  if (!id) throw invalidArgument("definition_id", "is required");
  return id;
}

/** The NOT_FOUND of a definition the tenant has not stored, saying how to store one. */
export const noDefinition = (kind: DefinitionKind, tenantKey: string, id: string) =>
  notFound(
    `tenant '${tenantKey}' has no stored ${LABEL[kind]} definition '${id.slice(0, 256)}' (store one with PutDefinition, or aiflowctl definitions put FILE --engine ${kind} --tenant ${tenantKey})`,
  );

export function definitionCalls<D extends DescMessage>(kind: DefinitionKind, reads: DefinitionReads, schema: D) {
  return {
    async getDefinition(
      req: { tenantKey: string; definitionId: string },
      ctx: HandlerContext,
    ): Promise<{ definition: MessageShape<D>; stored: StoredDefinitionWire }> {
      const { tenantKey } = scopeOf(req.tenantKey, ctx);
      const id = definitionIdOf(req.definitionId);
      const row = await reads.get(kind, tenantKey, id);
      if (!row) throw noDefinition(kind, tenantKey, id);
      return { definition: fromJson(schema, JSON.parse(row.body), { ignoreUnknownFields: true }), stored: storedToWire(row) };
    },

    async listDefinitions(
      req: { tenantKey: string; pageSize: number; pageToken: string },
      ctx: HandlerContext,
    ): Promise<{ definitions: StoredDefinitionWire[]; nextPageToken: string }> {
      const { tenantKey } = scopeOf(req.tenantKey, ctx);
      if (req.pageSize < 0) throw invalidArgument("page_size", `${req.pageSize} is negative`);
      const size = Math.min(req.pageSize || PAGE_DEFAULT, PAGE_MAX);
      const after = req.pageToken ? decodeCursor(req.pageToken, cursor) : null;
      if (after && after.t !== tenantKey) throw invalidArgument("page_token", "was issued for a different tenant");
      const rows = await reads.list(kind, tenantKey, after?.k ?? null, size + 1);
      const page = rows.slice(0, size);
      const last = page.at(-1);
      return { definitions: page.map(storedToWire), nextPageToken: rows.length > size && last ? encodeCursor({ t: tenantKey, k: last.definition_id }) : "" };
    },
  };
}
