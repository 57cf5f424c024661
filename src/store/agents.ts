/**
 * SQL for aiflow_agent, all of it. Agents are addressed by name (unique); the ULID id is generated on
 * first registration and never changes. Times come from the caller's clock.
 *
 * Drain state lives in metadata.drain (a key only the daemon writes), so a drain survives the agent
 * reconnecting, re-registering (which replaces the rest of metadata) and even going inactive.
 */
import { sql, type CommonQueryMethods, type FragmentSqlToken } from "slonik";
import { ts } from "../db/values.js";
import { ulid } from "ulid";
import { z } from "zod";
import type { Tables } from "../db/tables.js";
import { withDbErrors } from "../db/errors.js";
import { permissionDenied } from "../domain/errors.js";

export type AgentStatus = "active" | "draining" | "inactive";

/**
 * A row of aiflow_agent that may take work: active, and not removed. The claim, the handoff, the
 * affinity rebind checks and the stranded sweep each ask it of a row under their own alias (none:
 * the table's own columns).
 */
export function canTakeWork(alias?: string): FragmentSqlToken {
  if (alias === undefined) return sql.fragment`(status = 'active' AND deletedon IS NULL)`;
  const a = sql.identifier([alias]);
  return sql.fragment`(${a}.status = 'active' AND ${a}.deletedon IS NULL)`;
}

export const drainSchema = z.object({
  reason: z.string(),
  /** Epoch ms, or null for no deadline. */
  deadline: z.number().nullable(),
  startedAt: z.number(),
  inFlightAtStart: z.number(),
  by: z.string(),
});
export type DrainState = z.infer<typeof drainSchema>;

const agentRow = z.object({
  id: z.string(),
  name: z.string(),
  http_address: z.string().nullable(),
  grpc_address: z.string().nullable(),
  infra_address: z.string().nullable(),
  agentversion: z.string().nullable(),
  binarypath: z.string().nullable(),
  agenttype: z.string().nullable(),
  status: z.enum(["active", "draining", "inactive"]).nullable(),
  metrics: z.record(z.unknown()).nullable(),
  metadata: z.record(z.unknown()).nullable(),
  createdby: z.string(),
  createdon: z.number(),
  updatedby: z.string().nullable(),
  updatedon: z.number().nullable(),
  deletedby: z.string().nullable(),
  deletedon: z.number().nullable(),
});
export type AgentRow = z.infer<typeof agentRow>;

export interface RegisterInput {
  name: string;
  httpAddress: string | null;
  grpcAddress: string | null;
  infraAddress: string | null;
  agentVersion: string | null;
  binaryPath: string | null;
  agentType: string | null;
  metadata: Record<string, unknown>;
}

/** The agent columns a registration writes, for the audit record. */
export const REGISTER_FIELDS = [
  "http_address",
  "grpc_address",
  "infra_address",
  "agentversion",
  "binarypath",
  "agenttype",
  "metadata",
  "status",
  "updatedby",
  "updatedon",
];

const registered = z.object({ id: z.string(), status: z.enum(["active", "draining", "inactive"]), created: z.boolean() });
const nameStatus = z.object({ id: z.string(), name: z.string(), status: z.enum(["active", "draining", "inactive"]), drain: drainSchema.nullable() });
export type NameStatus = z.infer<typeof nameStatus>;

/** What the liveness sweep knows of the daemons that may hold unwritten beats (see markStaleInactive). */
export interface SweepHolders {
  /** The sweeping daemon instance (its aiflow_engine.engineid); null: none. */
  self: string | null;
  /** The agents whose last written beat the sweeping daemon wrote, with that beat's time. */
  ownBeats: readonly { name: string; at: number }[];
  /** A daemon whose keepalive is older than this is presumed dead; null: none is. */
  presumedDeadBeforeMs: number | null;
}

const NO_HOLDERS: SweepHolders = { self: null, ownBeats: [], presumedDeadBeforeMs: null };

export interface HeartbeatWrite {
  name: string;
  metrics: Record<string, unknown>;
  /** Epoch ms the heartbeat arrived at the daemon (not when it could be written): what updatedon records. */
  at: number;
}

export class AgentStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /**
   * Create-or-update by name in one statement; the unique index settles racing registrations.
   * A soft-deleted agent that registers again is revived (a machine rebuilt under its old name).
   *
   * With `tenantLimit` (the caller's token is limited to these tenants), an existing row that serves
   * any other tenant is left alone (PERMISSION_DENIED): checked in the statement, so no
   * registration can slip in between a check and the write.
   */
  async register(input: RegisterInput, nowMs: number, by: string, tenantLimit: readonly string[] | null = null): Promise<z.infer<typeof registered>> {
    const agent = this.t.id("agent");
    const within = tenantLimit
      ? sql.fragment`WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(COALESCE(a.metadata -> 'tenants', '[]'::jsonb)) AS s(t)
                                        WHERE s.t <> ALL(${sql.array([...tenantLimit], "text")}))`
      : sql.fragment``;
    const row = await withDbErrors(() =>
      this.db.maybeOne(sql.type(registered)`
        INSERT INTO ${agent} AS a (id, name, http_address, grpc_address, infra_address, agentversion, binarypath, agenttype,
                                   status, metadata, createdby, createdon, updatedby, updatedon)
        VALUES (${ulid(nowMs)}, ${input.name}, ${input.httpAddress}, ${input.grpcAddress}, ${input.infraAddress}, ${input.agentVersion},
                ${input.binaryPath}, ${input.agentType}, 'active', ${sql.jsonb(input.metadata as never)}, ${by}, ${ts(nowMs)}, ${by}, ${ts(nowMs)})
        ON CONFLICT (name) DO UPDATE SET
          http_address = EXCLUDED.http_address,
          grpc_address = EXCLUDED.grpc_address,
          infra_address = EXCLUDED.infra_address,
          agentversion = EXCLUDED.agentversion,
          binarypath = EXCLUDED.binarypath,
          agenttype = EXCLUDED.agenttype,
          metadata = EXCLUDED.metadata || CASE WHEN a.metadata ? 'drain' AND a.deletedon IS NULL
                                               THEN jsonb_build_object('drain', a.metadata -> 'drain') ELSE '{}'::jsonb END,
          status = CASE WHEN a.metadata ? 'drain' AND a.deletedon IS NULL THEN 'draining' ELSE 'active' END,
          deletedby = NULL,
          deletedon = NULL,
          updatedby = EXCLUDED.updatedby,
          updatedon = EXCLUDED.updatedon
        ${within}
        RETURNING id, status, (xmax = 0) AS created`),
    );
    if (row) return row;
    const stored = (await this.workScope(input.name))?.tenants ?? [];
    const outside = stored.filter((t) => !tenantLimit?.includes(t));
    throw permissionDenied(`agent '${input.name}' is registered for tenant(s) ${outside.map((t) => `'${t}'`).join(", ")}, which this token may not act for`);
  }

  /**
   * Writes a batch of coalesced heartbeats in one statement and returns each agent's current status,
   * which is how drains issued on another daemon reach this one's cache. A heartbeat never revives
   * an inactive agent: its leases are gone, and the reply tells it to register again.
   */
  writeHeartbeats(batch: readonly HeartbeatWrite[]): Promise<readonly NameStatus[]> {
    if (batch.length === 0) return Promise.resolve([]);
    const agent = this.t.id("agent");
    return withDbErrors(() =>
      this.db.any(sql.type(nameStatus)`
        UPDATE ${agent} AS a
           SET metrics = v.metrics, updatedon = GREATEST(a.updatedon, v.at), updatedby = a.name
          FROM unnest(${sql.array(
            batch.map((b) => b.name),
            "text",
          )},
                      ${sql.array(
                        batch.map((b) => JSON.stringify(b.metrics)),
                        "jsonb",
                      )},
                      ${sql.array(
                        batch.map((b) => new Date(b.at).toISOString()),
                        "timestamptz",
                      )}) AS v(name, metrics, at)
         WHERE a.name = v.name AND a.deletedon IS NULL
        RETURNING a.id, a.name, a.status, a.metadata -> 'drain' AS drain`),
    );
  }

  /** Marks an agent inactive at once (a clean exit). Returns false when it does not exist. */
  async deregister(name: string, nowMs: number, by: string): Promise<{ id: string } | null> {
    const agent = this.t.id("agent");
    return withDbErrors(() =>
      this.db.maybeOne(sql.type(z.object({ id: z.string() }))`
        UPDATE ${agent} SET status = 'inactive', updatedby = ${by}, updatedon = ${ts(nowMs)}
         WHERE name = ${name} AND deletedon IS NULL
        RETURNING id`),
    );
  }

  /**
   * The liveness sweep: one statement, safe when every daemon runs it at once (row locks serialise
   * the updates and the re-checked WHERE skips rows another sweep already flipped).
   *
   * An agent whose last sign of life is older than `staleBeforeMs` goes inactive unless a daemon
   * may still hold a newer beat of it, unwritten: a daemon that is running or stale (a clean stop
   * writes what it holds), not presumed dead, whose keepalive (aiflow_engine.updatedon: the time up
   * to which it has written every beat it received) is older than the agent's deadline (last sign
   * of life + window). Which daemons may: only the sweeping one when it wrote the agent's last beat
   * (`holders.ownBeats`); any, when another did. A last write that was no heartbeat (updatedby is
   * not the agent's name: a registration, a deregistration) is judged by its time alone.
   */
  markStaleInactive(nowMs: number, staleBeforeMs: number, holders: SweepHolders = NO_HOLDERS): Promise<readonly { id: string; name: string }[]> {
    const agent = this.t.id("agent");
    const engine = this.t.id("engine");
    const own = holders.ownBeats;
    const alive = holders.presumedDeadBeforeMs === null ? sql.fragment`` : sql.fragment`AND max(e.updatedon) >= ${ts(holders.presumedDeadBeforeMs)}`;
    return withDbErrors(() =>
      this.db.any(sql.type(z.object({ id: z.string(), name: z.string() }))`
        WITH own AS (
          SELECT * FROM unnest(${sql.array(
            own.map((o) => o.name),
            "text",
          )},
                               ${sql.array(
                                 own.map((o) => new Date(o.at).toISOString()),
                                 "timestamptz",
                               )}) AS o(name, at))
        UPDATE ${agent} AS a SET status = 'inactive', updatedby = 'liveness-sweep', updatedon = ${ts(nowMs)}
         WHERE a.status IN ('active', 'draining') AND a.deletedon IS NULL AND a.updatedon < ${ts(staleBeforeMs)}
           AND (a.updatedby IS DISTINCT FROM a.name OR NOT EXISTS (
                 SELECT 1 FROM ${engine} e
                  WHERE e.status IN ('running', 'stale')
                    AND (e.engineid = ${holders.self}::text OR NOT EXISTS (SELECT 1 FROM own WHERE own.name = a.name AND own.at = a.updatedon))
                  GROUP BY e.engineid
                 HAVING max(e.updatedon) < a.updatedon + (${ts(nowMs)} - ${ts(staleBeforeMs)}) ${alive}))
        RETURNING a.id, a.name`),
    );
  }

  /** Status of one agent (not soft-deleted), or null. */
  status(name: string): Promise<NameStatus | null> {
    const agent = this.t.id("agent");
    return withDbErrors(() =>
      this.db.maybeOne(sql.type(nameStatus)`
        SELECT id, name, status, metadata -> 'drain' AS drain FROM ${agent} WHERE name = ${name} AND deletedon IS NULL`),
    );
  }

  get(name: string): Promise<AgentRow | null> {
    const agent = this.t.id("agent");
    return withDbErrors(() => this.db.maybeOne(sql.type(agentRow)`SELECT * FROM ${agent} WHERE name = ${name} AND deletedon IS NULL`));
  }

  /** Every registered (not removed) agent's tenants, engine kinds and capacity: what could ever run work that states requirements. */
  capacities(): Promise<readonly { tenants: string[]; kinds: string[]; capacity: Record<string, unknown> | null }[]> {
    const agent = this.t.id("agent");
    return withDbErrors(() =>
      this.db.any(sql.type(z.object({ tenants: z.array(z.string()), kinds: z.array(z.string()), capacity: z.record(z.unknown()).nullable() }))`
        SELECT COALESCE(ARRAY(SELECT jsonb_array_elements_text(metadata -> 'tenants')), '{}') AS tenants,
               COALESCE(ARRAY(SELECT jsonb_array_elements_text(metadata -> 'engineKinds')), '{}') AS kinds,
               metadata -> 'capacity' AS capacity
          FROM ${agent} WHERE deletedon IS NULL`),
    );
  }

  /** The tenants, engine kinds and slots an agent registered with (what its claims can take, and how many at once). */
  workScope(name: string): Promise<{ tenants: string[]; kinds: string[]; slots: number } | null> {
    const agent = this.t.id("agent");
    return withDbErrors(() =>
      this.db.maybeOne(sql.type(z.object({ tenants: z.array(z.string()), kinds: z.array(z.string()), slots: z.number() }))`
        SELECT ARRAY(SELECT jsonb_array_elements_text(metadata -> 'tenants')) AS tenants,
               ARRAY(SELECT jsonb_array_elements_text(metadata -> 'engineKinds')) AS kinds,
               CASE WHEN jsonb_typeof(metadata -> 'slots') = 'number' THEN (metadata ->> 'slots')::numeric::int4 ELSE 0 END AS slots
          FROM ${agent} WHERE name = ${name} AND deletedon IS NULL`),
    );
  }
}

/** A registry row with the number of items dispatched to it now. */
export const agentWithLoad = agentRow.extend({ in_flight: z.number() });
export type AgentWithLoad = z.infer<typeof agentWithLoad>;

export interface AgentFilter {
  statuses: AgentStatus[];
  /** Every pair must be among the agent's tags. */
  tags: Record<string, string>;
  version?: string;
  names?: string[];
  includeRemoved: boolean;
}

/** An agent as /metrics reports it: its heartbeat's metrics and the items dispatched to it. */
export const agentGaugeRow = z.object({
  name: z.string(),
  status: z.enum(["active", "draining"]),
  metrics: z.record(z.unknown()).nullable(),
  in_flight: z.number(),
});
export type AgentGaugeRow = z.infer<typeof agentGaugeRow>;

/** Ops queries on the registry: listing, drains, removal. Kept beside the agent SQL above. */
export class AgentOpsStore {
  constructor(
    private readonly db: CommonQueryMethods,
    private readonly t: Tables,
  ) {}

  /**
   * The fleet's gauges for /metrics: agents by status (removed ones left out), and the first
   * `limit` agents by name that are active or draining (an inactive agent's last heartbeat says
   * nothing about now), each with the items dispatched to it.
   */
  async gauges(limit: number): Promise<{ byStatus: readonly { status: AgentStatus; n: number }[]; agents: readonly AgentGaugeRow[] }> {
    const a = this.t.id("agent");
    const w = this.t.id("work_item");
    return withDbErrors(async () => ({
      byStatus: await this.db.any(sql.type(z.object({ status: z.enum(["active", "draining", "inactive"]), n: z.number() }))`
        SELECT status, count(*)::int AS n FROM ${a} WHERE deletedon IS NULL AND status IS NOT NULL GROUP BY status`),
      agents:
        limit === 0
          ? []
          : await this.db.any(sql.type(agentGaugeRow)`
        SELECT a.name, a.status, a.metrics, (SELECT count(*)::int FROM ${w} wi WHERE wi.agent_id = a.name AND wi.status = 'dispatched') AS in_flight
          FROM ${a} a WHERE a.deletedon IS NULL AND a.status IN ('active', 'draining') ORDER BY a.name LIMIT ${limit}`),
    }));
  }

  /** Agents ordered by name (the spec's order), each with its in-flight count. */
  list(f: AgentFilter): Promise<readonly AgentWithLoad[]> {
    const a = this.t.id("agent");
    const w = this.t.id("work_item");
    const conds = [f.includeRemoved ? sql.fragment`true` : sql.fragment`a.deletedon IS NULL`];
    if (f.statuses.length > 0) conds.push(sql.fragment`a.status = ANY(${sql.array(f.statuses, "text")})`);
    if (Object.keys(f.tags).length > 0) conds.push(sql.fragment`COALESCE(a.metadata -> 'tags', '{}'::jsonb) @> ${sql.jsonb(f.tags)}`);
    if (f.version) conds.push(sql.fragment`a.agentversion = ${f.version}`);
    if (f.names) conds.push(sql.fragment`a.name = ANY(${sql.array(f.names, "text")})`);
    return withDbErrors(() =>
      this.db.any(sql.type(agentWithLoad)`
        SELECT a.*, (SELECT count(*)::int FROM ${w} wi WHERE wi.agent_id = a.name AND wi.status = 'dispatched') AS in_flight
          FROM ${a} a WHERE ${sql.join(conds, sql.fragment` AND `)} ORDER BY a.name`),
    );
  }

  /**
   * Starts (or updates) drains in one statement. A re-drain keeps the original start and in-flight
   * count; an inactive agent stays inactive but will come back draining.
   *
   * Drains and undrains leave updatedon alone: it is the agent's last sign of life (heartbeats and
   * registrations write it; the liveness sweep and last_seen_age read it), and an operator's action
   * is not one. Who drained is in metadata.drain and the audit log.
   */
  startDrain(
    names: readonly string[],
    drain: { reason: string; deadline: number | null; by: string },
    nowMs: number,
  ): Promise<readonly { id: string; name: string; status: AgentStatus }[]> {
    const a = this.t.id("agent");
    const w = this.t.id("work_item");
    return withDbErrors(() =>
      this.db.any(sql.type(z.object({ id: z.string(), name: z.string(), status: z.enum(["active", "draining", "inactive"]) }))`
        UPDATE ${a} a SET
               status = CASE WHEN a.status = 'inactive' THEN 'inactive' ELSE 'draining' END,
               metadata = COALESCE(a.metadata, '{}'::jsonb) || jsonb_build_object('drain', jsonb_build_object(
                 'reason', ${drain.reason}::text,
                 -- A re-drain without a deadline keeps the one already set.
                 'deadline', COALESCE(${drain.deadline}::bigint, (a.metadata -> 'drain' ->> 'deadline')::bigint),
                 'by', ${drain.by}::text,
                 'startedAt', COALESCE((a.metadata -> 'drain' -> 'startedAt')::bigint, ${nowMs}::bigint),
                 'inFlightAtStart', COALESCE((a.metadata -> 'drain' -> 'inFlightAtStart')::int,
                    (SELECT count(*)::int FROM ${w} wi WHERE wi.agent_id = a.name AND wi.status = 'dispatched')),
                 'releasedAtDeadline', COALESCE((a.metadata -> 'drain' -> 'releasedAtDeadline')::int, 0)))
         WHERE a.name = ANY(${sql.array([...names], "text")}) AND a.deletedon IS NULL
        RETURNING a.id, a.name, a.status`),
    );
  }

  /** Ends a drain: a draining agent becomes active again. */
  undrain(name: string): Promise<{ id: string; status: AgentStatus } | null> {
    const a = this.t.id("agent");
    return withDbErrors(() =>
      this.db.maybeOne(sql.type(z.object({ id: z.string(), status: z.enum(["active", "draining", "inactive"]) }))`
        UPDATE ${a} SET status = CASE WHEN status = 'draining' THEN 'active' ELSE status END, metadata = metadata - 'drain'
         WHERE name = ${name} AND deletedon IS NULL
        RETURNING id, status`),
    );
  }

  /** Draining agents whose deadline has passed. */
  drainsPastDeadline(nowMs: number): Promise<readonly { name: string }[]> {
    const a = this.t.id("agent");
    return withDbErrors(() =>
      this.db.any(sql.type(z.object({ name: z.string() }))`
        SELECT name FROM ${a}
         WHERE status IN ('draining', 'inactive') AND deletedon IS NULL
           AND jsonb_typeof(metadata -> 'drain' -> 'deadline') = 'number' AND (metadata -> 'drain' ->> 'deadline')::bigint <= ${nowMs}`),
    );
  }

  /** Records how many items a drain deadline gave back. */
  addReleasedAtDeadline(name: string, count: number): Promise<unknown> {
    const a = this.t.id("agent");
    return withDbErrors(() =>
      this.db.query(sql.unsafe`
        UPDATE ${a} SET metadata = jsonb_set(metadata, '{drain,releasedAtDeadline}',
                                             to_jsonb(COALESCE((metadata -> 'drain' ->> 'releasedAtDeadline')::int, 0) + ${count}::int))
         WHERE name = ${name} AND metadata ? 'drain'`),
    );
  }

  /** Soft-deletes an agent (deletedby, deletedon); it also goes inactive. */
  remove(name: string, nowMs: number, by: string): Promise<{ id: string } | null> {
    const a = this.t.id("agent");
    return withDbErrors(() =>
      this.db.maybeOne(sql.type(z.object({ id: z.string() }))`
        UPDATE ${a} SET status = 'inactive', deletedby = ${by}, deletedon = ${ts(nowMs)}, updatedby = ${by}, updatedon = ${ts(nowMs)}
         WHERE name = ${name} AND deletedon IS NULL
        RETURNING id`),
    );
  }
}
