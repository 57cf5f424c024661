/**
 * The caller of an RPC, as the handlers see it: who it is (set by the wire's authenticator,
 * ../server/auth.ts, under identityKey before a handler runs) and the limits its token or client
 * certificate sets on the agents and tenants it may act for. A refusal is PERMISSION_DENIED.
 */
import { Code, ConnectError, createContextKey, type HandlerContext } from "@connectrpc/connect";
import type { Role } from "../domain/tokens.js";

/** Who is calling. `roles` is every role (the daemon runs open) or the token's one role. */
export interface Identity {
  readonly principal: string;
  readonly roles: ReadonlySet<Role>;
  /** undefined: every tenant. */
  readonly tenants: ReadonlySet<string> | undefined;
  /** The agent names its token may act as (exact, or a prefix ending in '*'); undefined: any. */
  readonly agents?: readonly string[];
  /** The agent names its client certificate may act as, the same way; undefined: any. Both limits hold. */
  readonly certAgents?: readonly string[];
}

/** The caller's identity, set by the auth interceptor; read it with ctx.values.get(identityKey). */
export const identityKey = createContextKey<Identity | undefined>(undefined, { description: "caller identity" });

/** The caller of a handler. The interceptor guarantees it for every non-public service. */
export function callerOf(ctx: HandlerContext): Identity {
  const id = ctx.values.get(identityKey);
  if (!id) throw new ConnectError("no caller identity on a protected call", Code.Internal);
  return id;
}

/** The caller's tenants as a store's filter takes them; undefined: every tenant. */
export const tenantLimit = (caller: Identity): string[] | undefined => (caller.tenants ? [...caller.tenants] : undefined);

/** Refuses an agent name the caller's token or client certificate may not act as. */
export function assertAgent(identity: Identity, name: string): void {
  for (const [limit, what] of [
    [identity.agents, "token"],
    [identity.certAgents, "client certificate"],
  ] as const)
    if (limit && !limit.some((p) => (p.endsWith("*") ? name.startsWith(p.slice(0, -1)) : name === p)))
      throw new ConnectError(`${what} may not act as agent '${name}' (it is limited to ${limit.map((p) => `'${p}'`).join(", ")})`, Code.PermissionDenied);
}

/** Refuses a tenant the caller's token is not limited to. */
export function assertTenant(identity: Identity, tenant: string): void {
  if (identity.tenants && !identity.tenants.has(tenant)) throw new ConnectError(`token may not act for tenant '${tenant}'`, Code.PermissionDenied);
}

/**
 * The tenants of `tenants` the caller's token is not limited to (none when it has no tenant limit).
 * A row that serves several tenants (an agent) is within a token's reach only when this is empty.
 */
export function tenantsOutside(identity: Identity, tenants: Iterable<string>): string[] {
  const limit = identity.tenants;
  return limit ? [...tenants].filter((t) => !limit.has(t)) : [];
}

/** Refuses a tenant-limited caller an agent that serves tenants outside its limit (the agent and ops services alike). */
export function assertAgentTenants(identity: Identity, agent: string, tenants: Iterable<string>): void {
  const outside = tenantsOutside(identity, tenants);
  if (outside.length > 0)
    throw new ConnectError(
      `agent '${agent}' serves tenant(s) ${outside.map((t) => `'${t}'`).join(", ")}, which this token may not act for`,
      Code.PermissionDenied,
    );
}
