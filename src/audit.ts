/**
 * The audit stream for audited tables (aiflow_agent). Each create, update and delete records the
 * table, the primary key, the NAMES of the fields written, who wrote them and when — never a value,
 * so metrics, addresses and tokens cannot leak through it. Records are pino JSON lines tagged
 * `"stream":"audit"` on the audit logger, which is the daemon's log unless --audit-log names a file.
 */
import type { Logger } from "./log.js";

export type AuditAction = "create" | "update" | "delete";

export interface AuditRecord {
  table: string;
  action: AuditAction;
  /** Primary keys of the rows written. */
  ids: readonly string[];
  fields: readonly string[];
  by: string;
  /** Epoch milliseconds of the write, from the daemon's clock. */
  at: number;
}

export class AuditLog {
  readonly #log: Logger;

  constructor(log: Logger) {
    this.#log = log.child({ stream: "audit" });
  }

  record(r: AuditRecord): void {
    if (r.ids.length === 0) return;
    this.#log.info({ table: r.table, action: r.action, ids: r.ids, fields: [...r.fields].sort(), by: r.by, at: new Date(r.at).toISOString() }, "audit");
  }
}
