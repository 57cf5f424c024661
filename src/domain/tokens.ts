import { createHash, randomBytes } from "node:crypto";
import { ConfigError } from "./errors.js";
import { isIdentifierText } from "./names.js";

export const ROLES = ["agent", "engine", "ops", "runs"] as const;
export type Role = (typeof ROLES)[number];

/** One bearer token and what it may do. The secret itself is never kept: only its SHA-256 digest. */
export interface TokenGrant {
  role: Role;
  /** SHA-256 of the token, lower-case hex: what calls are matched against. */
  digest: string;
  /** Tenant keys the token is limited to; undefined means every tenant. */
  tenants?: string[];
  /** Who the caller is in createdby/updatedby and audit records; defaults to ROLE-<token fingerprint>. */
  name?: string;
  /**
   * Agent tokens only: the agent names the token may act as (register, heartbeat, claim, report,
   * deregister), each exact or a prefix ending in '*'; undefined means any name.
   */
  agents?: string[];
}

/** The shortest secret accepted. A token from `aiflowd token new` has 43 characters (256 bits). */
export const MIN_TOKEN_LENGTH = 8;

const isRole = (r: string): r is Role => (ROLES as readonly string[]).includes(r);

/** Parses ROLE:TOKEN[:TENANT,TENANT]. */
export function parseTokenSpec(raw: string, flag: string): TokenGrant {
  const [role, token, tenants, ...extra] = raw.split(":");
  if (!role || !isRole(role)) throw new ConfigError(flag, `token grant must start with one of ${ROLES.join("|")}: (ROLE:TOKEN[:TENANT,...])`);
  if (!token || extra.length > 0) throw new ConfigError(flag, "token grant must be ROLE:TOKEN[:TENANT,...] (a token may not contain ':')");
  return grant(role, secretDigest(token, flag), tenants ? tenants.split(",").filter(Boolean) : undefined, undefined);
}

const ENTRY_SHAPE = "{role, token | sha256, tenants?, name?, agents?}";

/**
 * Parses a tokens file: a JSON array of {role, token | sha256, tenants?, name?, agents?}. An entry may
 * hold the SHA-256 of its secret (64 hex digits) instead of the secret, so that the file is not
 * itself a credential.
 */
export function parseTokensFile(body: string, flag: string): TokenGrant[] {
  let data: unknown;
  try {
    data = JSON.parse(body);
  } catch (err) {
    throw new ConfigError(flag, `not JSON: ${(err as Error).message}`);
  }
  if (!Array.isArray(data)) throw new ConfigError(flag, `must hold a JSON array of ${ENTRY_SHAPE}`);
  return data.map((e: Record<string, unknown>, i) => {
    const where = `${flag}: entry ${i}`;
    const role = String(e?.role ?? "");
    if (!isRole(role)) throw new ConfigError(where, `role must be one of ${ROLES.join("|")}`);
    if ((e.token === undefined) === (e.sha256 === undefined))
      throw new ConfigError(where, "give either token (the secret) or sha256 (its SHA-256, 64 hex digits)");
    let digest: string;
    if (e.token !== undefined) {
      if (typeof e.token !== "string") throw new ConfigError(where, "token must be a string");
      digest = secretDigest(e.token, where);
    } else {
      if (typeof e.sha256 !== "string" || !/^[0-9a-fA-F]{64}$/.test(e.sha256))
        throw new ConfigError(where, "sha256 must be 64 hex digits (the SHA-256 of the token: `printf %s TOKEN | sha256sum`)");
      digest = e.sha256.toLowerCase();
    }
    if (e.tenants !== undefined && !(Array.isArray(e.tenants) && e.tenants.every((t) => typeof t === "string")))
      throw new ConfigError(where, "tenants must be an array of strings");
    const g = grant(role, digest, e.tenants as string[] | undefined, typeof e.name === "string" ? e.name : undefined);
    if (e.agents !== undefined) g.agents = agentPatterns(e.agents, role, where);
    return g;
  });
}

/**
 * Refuses a set of grants in which one secret is granted twice: a token is one caller with one
 * role, and a secret shared by two roles would make either role's holder the other.
 */
export function checkGrants(grants: readonly TokenGrant[], flag: string): void {
  const seen = new Map<string, TokenGrant>();
  for (const g of grants) {
    const other = seen.get(g.digest);
    if (other)
      throw new ConfigError(
        flag,
        other.role === g.role
          ? `the same ${g.role} token is granted twice (${other.name} and ${g.name}); grant it once`
          : `the same token is granted to roles ${other.role} and ${g.role}; each role needs a secret of its own`,
      );
    seen.set(g.digest, g);
  }
}

/** Agent-name patterns: a non-empty list of names, each exact or a prefix ending in a single '*'. */
function agentPatterns(raw: unknown, role: Role, where: string): string[] {
  if (role !== "agent") throw new ConfigError(where, "agents applies to agent tokens only");
  if (!Array.isArray(raw) || raw.length === 0 || !raw.every(isAgentPattern))
    throw new ConfigError(where, "agents must be a non-empty array of agent names, each exact or a prefix ending in '*' (\"gpu-*\")");
  return raw as string[];
}

/** An agent name, or a prefix of one ending in '*' ("*" alone: any name). */
export const isAgentPattern = (p: unknown): p is string => typeof p === "string" && (p === "*" || isIdentifierText(p.endsWith("*") ? p.slice(0, -1) : p));

function secretDigest(token: string, where: string): string {
  if (token.length < MIN_TOKEN_LENGTH)
    throw new ConfigError(where, `a token must be at least ${MIN_TOKEN_LENGTH} characters (\`aiflowd token new ROLE\` makes one)`);
  return tokenDigest(token);
}

function grant(role: Role, digest: string, tenants: string[] | undefined, name: string | undefined): TokenGrant {
  return { role, digest, tenants, name: name ?? `${role}-${digest.slice(0, 8)}` };
}

/** SHA-256 of a token, lower-case hex: what a grant holds and a call is matched by. */
export const tokenDigest = (token: string) => createHash("sha256").update(token).digest("hex");

/** A short, non-reversible tag for a token, safe to log: the first 8 hex digits of its digest. */
export const fingerprint = (token: string) => tokenDigest(token).slice(0, 8);

/** A fresh random token: 32 bytes from the CSPRNG, base64url (43 characters). */
export const newToken = () => randomBytes(32).toString("base64url");
