/**
 * Authentication and authorisation, deny by default. Every service is mapped to the role that may
 * call it; a service that is not in the map is refused for everyone. Health is the one open service,
 * so load balancers and probes can check the daemon without a secret.
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { Code, ConnectError, createContextKey, type HandlerContext, type Interceptor } from "@connectrpc/connect";
import type { Role, TokenGrant } from "./tokens.js";

/** Who is calling. `roles` is every role (the daemon runs open) or the token's one role. */
export interface Identity {
  readonly principal: string;
  readonly roles: ReadonlySet<Role>;
  /** undefined: every tenant. */
  readonly tenants: ReadonlySet<string> | undefined;
  /** The agent names it may act as (exact, or a prefix ending in '*'); undefined: any. */
  readonly agents?: readonly string[];
}

const OPEN_IDENTITY: Identity = { principal: "anonymous", roles: new Set(["agent", "engine", "ops"]), tenants: undefined };

/** The caller's identity, set by the auth interceptor; read it with ctx.values.get(identityKey). */
export const identityKey = createContextKey<Identity | undefined>(undefined, { description: "caller identity" });

/** Which role each service requires; "public" needs no token, "any" needs a valid token of any role. */
export type Access = Role | "public" | "any";

export class Authenticator {
  /** By the token's digest: the grant's digest and its identity, both made once (every call needs them). */
  readonly #byHash = new Map<string, { digest: Buffer; identity: Identity }>();
  readonly open: boolean;

  constructor(grants: readonly TokenGrant[]) {
    for (const g of grants) {
      const h = hash(g.token);
      this.#byHash.set(h, {
        digest: Buffer.from(h, "hex"),
        identity: { principal: g.name ?? g.role, roles: new Set([g.role]), tenants: g.tenants ? new Set(g.tenants) : undefined, agents: g.agents },
      });
    }
    this.open = grants.length === 0;
  }

  /** Resolves a bearer token to an identity, or undefined when it is not known. */
  resolve(token: string): Identity | undefined {
    const h = hash(token);
    const hit = this.#byHash.get(h);
    // Compare the digests in constant time too, so a lookup hit is not a timing oracle for the token.
    if (!hit || !timingSafeEqual(hit.digest, Buffer.from(h, "hex"))) return undefined;
    return hit.identity;
  }

  /**
   * Who may make a call to `service`'s `method` with this authorization header: the identity
   * (undefined for a public service), or the refusal. The interceptor and the server's check on
   * the request headers (gate.ts) both decide here, so they cannot disagree.
   */
  check(access: ReadonlyMap<string, Access>, service: string, method: string, header: string | null | undefined): AuthDecision {
    const needed = access.get(service);
    if (needed === undefined) return { ok: false, reason: "unserved", error: new ConnectError(`${service} is not served`, Code.PermissionDenied) };
    if (needed === "public") return { ok: true, identity: undefined };
    let identity = OPEN_IDENTITY;
    if (!this.open) {
      const m = header ? /^Bearer\s+(\S+)$/i.exec(header) : null;
      if (!m) return { ok: false, reason: "missing", error: new ConnectError("missing bearer token: send 'authorization: Bearer <token>'", Code.Unauthenticated) };
      const known = this.resolve(m[1]!);
      if (!known) return { ok: false, reason: "unknown", error: new ConnectError("unknown bearer token", Code.Unauthenticated) };
      identity = known;
    }
    if (needed !== "any" && !identity.roles.has(needed))
      return { ok: false, reason: "role", error: new ConnectError(`${method} needs a token with role '${needed}'`, Code.PermissionDenied) };
    return { ok: true, identity };
  }

  interceptor(access: ReadonlyMap<string, Access>): Interceptor {
    return (next) => async (req) => {
      const decision = this.check(access, req.service.typeName, req.method.name, req.header.get("authorization"));
      if (!decision.ok) throw decision.error;
      if (decision.identity) req.contextValues.set(identityKey, decision.identity);
      return next(req);
    };
  }
}

/** Why a call was refused: no token, a token nobody issued, a token of another role, a service not mapped. */
export type AuthFailure = "missing" | "unknown" | "role" | "unserved";

export type AuthDecision = { ok: true; identity: Identity | undefined } | { ok: false; reason: AuthFailure; error: ConnectError };

const hash = (token: string) => createHash("sha256").update(token).digest("hex");

/** The caller of a handler. The interceptor guarantees it for every non-public service. */
export function callerOf(ctx: HandlerContext): Identity {
  const id = ctx.values.get(identityKey);
  if (!id) throw new ConnectError("no caller identity on a protected call", Code.Internal);
  return id;
}

/** Refuses an agent name the caller's token may not act as. */
export function assertAgent(identity: Identity, name: string): void {
  if (identity.agents && !identity.agents.some((p) => (p.endsWith("*") ? name.startsWith(p.slice(0, -1)) : name === p)))
    throw new ConnectError(`token may not act as agent '${name}' (it is limited to ${identity.agents.map((p) => `'${p}'`).join(", ")})`, Code.PermissionDenied);
}

/** Refuses a tenant the caller's token is not limited to. */
export function assertTenant(identity: Identity, tenant: string): void {
  if (identity.tenants && !identity.tenants.has(tenant))
    throw new ConnectError(`token may not act for tenant '${tenant}'`, Code.PermissionDenied);
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
    throw new ConnectError(`agent '${agent}' serves tenant(s) ${outside.map((t) => `'${t}'`).join(", ")}, which this token may not act for`, Code.PermissionDenied);
}
