/**
 * Authentication and authorisation, deny by default. Every service is mapped to the role that may
 * call it; a service that is not in the map is refused for everyone. Health is the one open service,
 * so load balancers and probes can check the daemon without a secret.
 *
 * A caller is named by a bearer token, by its verified client certificate (./cert-identity.ts), or
 * by both, in which case both must name the same role, and a limit either sets holds (a token's
 * tenants, the agent names of each). With no tokens and no mutual TLS the daemon runs open, on
 * loopback only (daemon.ts). What a handler reads of its caller, and the limits it checks, are
 * ../rpc/caller.ts.
 */
import { timingSafeEqual } from "node:crypto";
import { Code, ConnectError, createContextKey, type Interceptor } from "@connectrpc/connect";
import type { CertReading } from "./cert-identity.js";
import { identityKey, type Identity } from "../rpc/caller.js";
import { checkGrants, ROLES, tokenDigest, type Role, type TokenGrant } from "../domain/tokens.js";

const OPEN_IDENTITY: Identity = { principal: "anonymous", roles: new Set(ROLES), tenants: undefined };

/** What the caller's client certificate says, set by the server for each call (both paths) under mutual TLS. */
export const peerKey = createContextKey<CertReading>(undefined, { description: "client certificate identity" });

/** Which role each service requires; "public" needs no token, "any" needs a valid token of any role. */
export type Access = Role | "public" | "any";

export class Authenticator {
  /** By the token's digest: the grant's digest and its identity, both made once (every call needs them). */
  readonly #byHash = new Map<string, { digest: Buffer; identity: Identity }>();
  readonly open: boolean;
  readonly #missing: string;

  /**
   * @param mutualTls client certificates are verified (--tls-client-ca): the daemon is not open even
   * without tokens, since a certificate can name a caller.
   */
  constructor(grants: readonly TokenGrant[], mutualTls = false) {
    checkGrants(grants, "--token/--tokens-file");
    for (const g of grants) {
      this.#byHash.set(g.digest, {
        digest: Buffer.from(g.digest, "hex"),
        identity: { principal: g.name ?? g.role, roles: new Set([g.role]), tenants: g.tenants ? new Set(g.tenants) : undefined, agents: g.agents },
      });
    }
    this.open = grants.length === 0 && !mutualTls;
    // Under mutual TLS a certificate that names the caller would do instead of a token.
    this.#missing = `missing bearer token: send 'authorization: Bearer <token>'${mutualTls ? ", or a client certificate that names the caller" : ""}`;
  }

  /**
   * Resolves a bearer token to an identity, or undefined when it is not known. Only digests are
   * held and looked up, never the secret, and the hit is compared in constant time too, so a lookup
   * is not a timing oracle for the token.
   */
  resolve(token: string): Identity | undefined {
    const h = tokenDigest(token);
    const hit = this.#byHash.get(h);
    if (!hit || !timingSafeEqual(hit.digest, Buffer.from(h, "hex"))) return undefined;
    return hit.identity;
  }

  /**
   * Who may make a call to `service`'s `method` with this authorization header: the identity
   * (undefined for a public service), or the refusal. The interceptor and the server's check on
   * the request headers (gate.ts) both decide here, so they cannot disagree.
   */
  check(access: ReadonlyMap<string, Access>, service: string, method: string, header: string | null | undefined, peer?: CertReading): AuthDecision {
    const needed = access.get(service);
    if (needed === undefined) return { ok: false, reason: "unserved", error: new ConnectError(`${service} is not served`, Code.PermissionDenied) };
    if (needed === "public") return { ok: true, identity: undefined };
    if (peer && "refused" in peer) return { ok: false, reason: "certificate", error: new ConnectError(peer.refused, Code.PermissionDenied) };
    let identity = OPEN_IDENTITY;
    if (!this.open) {
      let byToken: Identity | undefined;
      if (header) {
        const m = /^Bearer\s+(\S+)$/i.exec(header);
        if (!m)
          return {
            ok: false,
            reason: "missing",
            error: new ConnectError("malformed authorization header: send 'authorization: Bearer <token>'", Code.Unauthenticated),
          };
        byToken = this.resolve(m[1]!);
        if (!byToken) return { ok: false, reason: "unknown", error: new ConnectError("unknown bearer token", Code.Unauthenticated) };
      }
      if (!byToken && !peer) return { ok: false, reason: "missing", error: new ConnectError(this.#missing, Code.Unauthenticated) };
      const combined = combine(byToken, peer);
      if (!combined)
        return {
          ok: false,
          reason: "disagree",
          error: new ConnectError(
            `the bearer token (role ${[...byToken!.roles][0]}) and the client certificate (${peer!.principal}) name different callers`,
            Code.PermissionDenied,
          ),
        };
      identity = combined;
    }
    if (needed !== "any" && !identity.roles.has(needed))
      return { ok: false, reason: "role", error: new ConnectError(`${method} needs a token with role '${needed}'`, Code.PermissionDenied) };
    return { ok: true, identity };
  }

  interceptor(access: ReadonlyMap<string, Access>): Interceptor {
    return (next) => async (req) => {
      const decision = this.check(access, req.service.typeName, req.method.name, req.header.get("authorization"), req.contextValues.get(peerKey));
      if (!decision.ok) throw decision.error;
      if (decision.identity) req.contextValues.set(identityKey, decision.identity);
      return next(req);
    };
  }
}

/**
 * Why a call was refused: no token, a token nobody issued, a token of another role, a service not
 * mapped, a client certificate that names no caller we accept, a token and a certificate of two roles.
 */
export type AuthFailure = "missing" | "unknown" | "role" | "unserved" | "certificate" | "disagree";

export type AuthDecision = { ok: true; identity: Identity | undefined } | { ok: false; reason: AuthFailure; error: ConnectError };

/** The identity of a token, a certificate, or both (undefined when both name different roles). */
function combine(byToken: Identity | undefined, peer: Exclude<CertReading, { refused: string } | undefined> | undefined): Identity | undefined {
  if (!peer) return byToken;
  const byCert: Identity = {
    principal: peer.principal,
    roles: new Set([peer.role]),
    tenants: undefined,
    certAgents: peer.role === "agent" ? peer.names : undefined,
  };
  if (!byToken) return byCert;
  if (!byToken.roles.has(peer.role)) return undefined;
  return { ...byToken, certAgents: byCert.certAgents };
}
