/**
 * Table naming. The prefix (default aiflow_) and the schema are configuration applied here, never
 * baked into SQL text, so the same tables can be created side by side under another prefix.
 */
import { createHash } from "node:crypto";
import { sql, type IdentifierSqlToken } from "slonik";

export const TABLES = [
  "agent",
  "work_item",
  "affinity_binding",
  "concurrency_key",
  "tenant_share",
  "fair_share_turn",
  "rate_limit",
  "engine",
  "engine_run",
  "trigger_firing",
  "run",
  "task",
  "checkpoint",
  "trigger",
  "trigger_delivery",
  "graph_run",
  "machine_run",
  "engine_definition",
  "engine_event",
  "schema_migrations",
] as const;
export type TableName = (typeof TABLES)[number];

/** Tables an earlier migration created and a later one dropped (0017 folded the DAG's into the engines'): migrations may name them, the code may not. */
export const RETIRED_TABLES = ["dag_definition", "dag_event"] as const;

export interface Naming {
  readonly schema: string;
  readonly prefix: string;
}

/** A quoted SQL identifier; input is validated by config, quoting makes it safe regardless. */
export const quoteIdent = (name: string) => `"${name.replace(/"/g, '""')}"`;

export class Tables implements Naming {
  constructor(
    readonly schema: string,
    readonly prefix: string,
  ) {}

  /** The schema-qualified identifier of a table, for slonik queries. */
  id(table: TableName): IdentifierSqlToken {
    return sql.identifier([this.schema, this.prefix + table]);
  }

  /** The schema-qualified table name as SQL text, for DDL templates. */
  qualified(table: TableName): string {
    return `${quoteIdent(this.schema)}.${quoteIdent(this.prefix + table)}`;
  }

  /** A function a migration created under the prefix (migration 0008's agent_room, place and key_limit; 0009's rate_rule, rate_admit and stamp_turns), for slonik queries. */
  routine(name: "agent_room" | "place" | "key_limit" | "rate_rule" | "rate_admit" | "stamp_turns"): IdentifierSqlToken {
    return sql.identifier([this.schema, this.prefix + name]);
  }

  /** A prefixed object name (index, constraint), as SQL text. */
  objectName(suffix: string): string {
    return quoteIdent(this.prefix + suffix);
  }

  /**
   * The LISTEN/NOTIFY channel for a topic, scoped like the tables so two prefixes never cross-talk.
   * Postgres refuses channel names of 64 bytes or more, so the scope is a short hash, not the names.
   */
  channel(topic: string): string {
    const scope = createHash("sha256").update(`${this.schema}.${this.prefix}`).digest("hex").slice(0, 16);
    return `aiflow_${scope}_${topic}`;
  }
}
