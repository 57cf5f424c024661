/**
 * What a claim may take, defined once. A claim by agent A takes item I when all of these hold:
 *
 *   1. A may take work: ACTIVE and not deleted (canTakeWork, ../agents.ts).
 *   2. I is pending and due: status 'pending' and next_attempt_at <= now.
 *   3. A serves I's tenant and engine kind: both are among the tenants and engineKinds A registered.
 *   4. I's selector, when it has one, is satisfied by A's tags: jsonb containment, every selector
 *      pair among the tags (an agent without tags has '{}').
 *   5. I's affinity key is unbound, bound to A, or bound to another agent and movable to A. A key
 *      is bound per tenant (migration 0016): I's key is the binding of I's tenant and key, so one
 *      tenant's binding never holds another tenant's items.
 *
 * It takes such items in claim order, (priority, createdon, id) ascending, up to its max. Whether
 * one item comes first for another of its tenant and engine kind is asked of priorities alone
 * (`comesFirst`: the same or a higher priority, a lower or equal number). For an item created
 * earlier that is claim order exactly; for a later row of the same insert at the same priority it
 * answers "first" where claim order would not, which can only keep a row from being handed over.
 *
 * Three places decide by this rule, and each reads it from here, so what a claim may take is
 * changed here and nowhere else:
 * - the claim statement (./claim.ts): every term, over the table, in claim order;
 * - the insert's direct dispatch (./enqueue.ts): a row offered to a waiting claim goes in dispatched
 *   only when terms 1, 3 and 4 hold for its agent, the row is due and has no affinity key (term 5
 *   would need the claim's binding writes), and no due pending item of its tenant and engine kind
 *   comes first (whether or not this agent could take that item);
 * - the offers of waiting claims (../../queue/waiting-claims.ts), in memory: `dueNow` and
 *   `offerable` pick the rows an offer may carry, `byClaimOrder` and `comesFirst` order them and
 *   keep back a row that one of its own batch comes first for. The insert re-checks every term
 *   except that batch order, which only the offer can see (the statement's own rows are not in its
 *   snapshot).
 *
 * Where the insert and the offer simplify, they refuse: a refused row goes in pending, and a claim
 * takes it by the full rule. So a handed-over row is always one the claim would have taken.
 *
 * The SQL forms are fragments over the aliases the statements name; every value is bound. The ways
 * a statement reads the agent's registration are AgentTerms; a new term of the rule that reads it
 * is a new member there, which each form must then supply.
 */
import { sql, type FragmentSqlToken, type IdentifierSqlToken } from "slonik";
import { canTakeWork } from "../agents.js";

/** How a statement reads the claiming agent's registration (terms 3 and 4). */
export interface AgentTerms {
  /** Term 3 for the tenant. agentRow's form answers NULL, not false, for an agent without the list. */
  servesTenant(tenant: FragmentSqlToken): FragmentSqlToken;
  /** Term 3 for the engine kind (NULL as servesTenant). */
  servesKind(kind: FragmentSqlToken): FragmentSqlToken;
  /** The agent's tags as jsonb, '{}' when it has none. */
  tags: FragmentSqlToken;
}

/** An item's columns as a statement names them, for terms 3 and 4. */
export interface ItemTerms {
  tenant: FragmentSqlToken;
  engineKind: FragmentSqlToken;
  /** The item's selector (worker_params -> 'selector'), NULL when it has none. */
  selector: FragmentSqlToken;
}

/**
 * The claim's `agent` CTE: the claiming agent's lists, read once per statement (InitPlans), and no
 * row at all unless the agent may take work (term 1), so an agent that may not claim scans nothing.
 */
export function claimingAgentCte(agents: IdentifierSqlToken, name: string): FragmentSqlToken {
  return sql.fragment`SELECT ARRAY(SELECT jsonb_array_elements_text(metadata -> 'tenants')) AS tenants,
                 ARRAY(SELECT jsonb_array_elements_text(metadata -> 'engineKinds')) AS kinds,
                 COALESCE(metadata -> 'tags', '{}'::jsonb) AS tags
            FROM ${agents} WHERE name = ${name} AND ${canTakeWork()}`;
}

/** The claiming agent as the claim statement reads it: from its `agent` CTE (claimingAgentCte). */
export const CLAIMING_AGENT: AgentTerms = {
  servesTenant: (tenant) => sql.fragment`${tenant} = ANY((SELECT tenants FROM agent)::text[])`,
  servesKind: (kind) => sql.fragment`${kind} = ANY((SELECT kinds FROM agent)::text[])`,
  tags: sql.fragment`(SELECT tags FROM agent)`,
};

/**
 * An agent row the statement joins as `alias`, its registration read by jsonb operators where the
 * row is: what a statement that checks a few rows against their agents wants (the insert's offers).
 */
export function agentRow(alias: string): AgentTerms {
  const a = sql.identifier([alias]);
  return {
    servesTenant: (tenant) => sql.fragment`${a}.metadata -> 'tenants' ? ${tenant}`,
    servesKind: (kind) => sql.fragment`${a}.metadata -> 'engineKinds' ? ${kind}`,
    tags: sql.fragment`COALESCE(${a}.metadata -> 'tags', '{}'::jsonb)`,
  };
}

/**
 * An agent row joined as `alias`, its lists expanded as the claim's `agent` CTE expands them, and
 * false (not NULL) for an agent without one, so NOT of it holds: the sweep that looks for agents
 * that may not run their keys' items (./sweeps.ts) asks it that way.
 */
export function agentLists(alias: string): AgentTerms {
  const a = sql.identifier([alias]);
  return {
    servesTenant: (tenant) => sql.fragment`${tenant} = ANY(ARRAY(SELECT jsonb_array_elements_text(${a}.metadata -> 'tenants')))`,
    servesKind: (kind) => sql.fragment`${kind} = ANY(ARRAY(SELECT jsonb_array_elements_text(${a}.metadata -> 'engineKinds')))`,
    tags: sql.fragment`COALESCE(${a}.metadata -> 'tags', '{}'::jsonb)`,
  };
}

/** A row of the work item table as `alias`. */
export function tableItem(alias: string): ItemTerms {
  const w = sql.identifier([alias]);
  return { tenant: sql.fragment`${w}.tenant_key`, engineKind: sql.fragment`${w}.engine_kind`, selector: sql.fragment`${w}.worker_params -> 'selector'` };
}

/** Terms 3 and 4: the agent serves the item's tenant and engine kind, and its tags satisfy the item's selector. */
export function serves(agent: AgentTerms, item: ItemTerms): FragmentSqlToken {
  return sql.fragment`${agent.servesTenant(item.tenant)}
             AND ${servesInTenant(agent, item)}`;
}

/**
 * Terms 3 and 4 but the tenant, for a scan already held to one tenant the agent serves (the shared
 * claim's walk of a tenant's items, ./fair-share.ts): asked again per row there, the agent's list of
 * tenants is an array the scan would search on every rescan.
 */
export function servesInTenant(agent: AgentTerms, item: ItemTerms): FragmentSqlToken {
  return sql.fragment`${agent.servesKind(item.engineKind)}
             AND (${item.selector} IS NULL OR ${agent.tags} @> (${item.selector}))`;
}

/**
 * Term 2 over the table as `alias`. "+ 0" keeps the planner off the due index (when most pending
 * items wait on a backoff, it would otherwise fetch every due row and sort them all) and matches the
 * claim index's last key, so items not yet due are passed over on their index entries (migration 0005).
 */
export function pendingAndDue(alias: string, nowNs: string): FragmentSqlToken {
  const w = sql.identifier([alias]);
  return sql.fragment`${w}.status = 'pending'
             AND ${w}.next_attempt_at + 0 <= ${nowNs}`;
}

/**
 * Terms 2 and 5 for a row an insert offers, named by its expressions: the row goes in pending, so
 * term 2 asks only that it is due; term 5 only that it has no key, since a key needs the claim's
 * binding writes.
 */
export function offeredDueUnkeyed(nextAttemptAt: FragmentSqlToken, affinityKey: FragmentSqlToken, nowNs: string): FragmentSqlToken {
  return sql.fragment`${nextAttemptAt} <= ${nowNs} AND ${affinityKey} IS NULL`;
}

/** Claim order over the table as `alias`: the claim index's order, so a LIMIT stops its scan early. */
export function claimOrder(alias: string): FragmentSqlToken {
  const w = sql.identifier([alias]);
  return sql.fragment`${w}.priority, ${w}.createdon, ${w}.id`;
}

/** SQL `comesFirst`: an item of priority `other` comes first for one of priority `priority` (see the header). */
export function comesFirstSql(other: FragmentSqlToken, priority: FragmentSqlToken): FragmentSqlToken {
  return sql.fragment`${other} <= ${priority}`;
}

/**
 * Term 5's move: the key's binding row `bb` (version `version` when a compare-and-swap needs it)
 * moves from its agent to the claiming one under the rebind policy, once the grace has passed since
 * the key's last dispatch, when its agent cannot take work and none of the key's items (of the
 * binding's tenant) is in flight.
 */
export function movable(m: {
  agents: IdentifierSqlToken;
  items: IdentifierSqlToken;
  rebind: string;
  graceEdge: FragmentSqlToken;
  version?: FragmentSqlToken;
}): FragmentSqlToken {
  const version = m.version ? sql.fragment` AND bb.xmin::text = ${m.version}` : sql.fragment``;
  return sql.fragment`(${m.rebind}${version} AND bb.updatedon < ${m.graceEdge}
                      AND NOT EXISTS (SELECT 1 FROM ${m.agents} ba WHERE ba.name = bb.agent_id AND ${canTakeWork("ba")})
                      AND NOT EXISTS (SELECT 1 FROM ${m.items} wd WHERE wd.affinity_key = bb.affinity_key AND wd.tenant_key = bb.tenant_key AND wd.status = 'dispatched'))`;
}

/**
 * Term 5 over the table as `alias`, as the claim's scan asks it: the key is unbound, bound to the
 * claiming agent, or bound to another agent and movable. The claim then writes the binding row
 * (./claim.ts), which decides a race for the key.
 */
export function keyAllows(
  alias: string,
  m: { items: IdentifierSqlToken; bindings: IdentifierSqlToken; agents: IdentifierSqlToken; agent: string; rebind: string; graceEdge: FragmentSqlToken },
): FragmentSqlToken {
  const w = sql.identifier([alias]);
  return sql.fragment`(${w}.affinity_key IS NULL OR NOT EXISTS (
                   SELECT 1 FROM ${m.bindings} bb
                    WHERE bb.tenant_key = ${w}.tenant_key AND bb.affinity_key = ${w}.affinity_key AND bb.agent_id <> ${m.agent}
                      AND NOT ${movable({ agents: m.agents, items: m.items, rebind: m.rebind, graceEdge: m.graceEdge })}))`;
}

/** `comesFirst` in memory: an item of priority `other` (none: undefined) comes first for one of `priority`. */
export const comesFirst = (other: number | undefined, priority: number): boolean => other !== undefined && other <= priority;

/** Term 2 for a row an insert brings (it goes in pending): due at `nowNs`. */
export const dueNow = (item: { notBeforeNs: bigint }, nowNs: bigint): boolean => item.notBeforeNs <= nowNs;

/**
 * Of one insert's due rows, those an offer to a waiting claim may carry: no affinity key (term 5),
 * and no worker params, since term 4 needs the agent's tags, which a waiting claim does not hold (a
 * row with a selector is left to the claim, as is any row with worker params). Terms 1 and 3 the
 * insert checks against the agent's row; an offer goes only to claims waiting on the row's tenant
 * and engine kind.
 */
export const offerable = (item: { workerParams: unknown; affinityKey: string | null }): boolean => !item.workerParams && !item.affinityKey;

/**
 * Claim order for rows of one insert by their index: priority, then arrival (their createdon and ids
 * ascend with it). `rows` indexed as the insert's.
 */
export const byClaimOrder =
  (rows: readonly { item: { priority: number } }[]) =>
  (x: number, y: number): number =>
    rows[x]!.item.priority - rows[y]!.item.priority || x - y;
