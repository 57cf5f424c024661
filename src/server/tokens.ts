import { createHash } from "node:crypto";
import { ConfigError } from "../domain/errors.js";
import { isIdentifierText } from "../domain/names.js";

export const ROLES = ["agent", "engine", "ops"] as const;
export type Role = (typeof ROLES)[number];

/** One bearer token and what it may do. */
export interface TokenGrant {
  role: Role;
  token: string;
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

const isRole = (r: string): r is Role => (ROLES as readonly string[]).includes(r);

/** Parses ROLE:TOKEN[:TENANT,TENANT]. */
export function parseTokenSpec(raw: string, flag: string): TokenGrant {
  const [role, token, tenants, ...extra] = raw.split(":");
  if (!role || !isRole(role)) throw new ConfigError(flag, `token grant must start with one of ${ROLES.join("|")}: (ROLE:TOKEN[:TENANT,...])`);
  if (!token || extra.length > 0) throw new ConfigError(flag, "token grant must be ROLE:TOKEN[:TENANT,...] (a token may not contain ':')");
  return grant(role, token, tenants ? tenants.split(",").filter(Boolean) : undefined, undefined, flag);
}

/** Parses a tokens file: a JSON array of {role, token, tenants?, name?, agents?}. */
export function parseTokensFile(body: string, flag: string): TokenGrant[] {
  let data: unknown;
  try {
    data = JSON.parse(body);
  } catch (err) {
    throw new ConfigError(flag, `not JSON: ${(err as Error).message}`);
  }
  if (!Array.isArray(data)) throw new ConfigError(flag, "must hold a JSON array of {role, token, tenants?, name?, agents?}");
  return data.map((e: Record<string, unknown>, i) => {
    const role = String(e?.role ?? "");
    if (!isRole(role)) throw new ConfigError(flag, `entry ${i}: role must be one of ${ROLES.join("|")}`);
    if (typeof e.token !== "string" || e.token.length === 0) throw new ConfigError(flag, `entry ${i}: token must be a non-empty string`);
    if (e.tenants !== undefined && !(Array.isArray(e.tenants) && e.tenants.every((t) => typeof t === "string")))
      throw new ConfigError(flag, `entry ${i}: tenants must be an array of strings`);
    const g = grant(role, e.token, e.tenants as string[] | undefined, typeof e.name === "string" ? e.name : undefined, flag);
    if (e.agents !== undefined) g.agents = agentPatterns(e.agents, role, `${flag}: entry ${i}`);
    return g;
  });
}

/** Agent-name patterns: a non-empty list of names, each exact or a prefix ending in a single '*'. */
function agentPatterns(raw: unknown, role: Role, where: string): string[] {
  if (role !== "agent") throw new ConfigError(where, "agents applies to agent tokens only");
  // Agent-name characters, then at most one '*', at the end ("*" alone: any name).
  const ok = (p: unknown) => typeof p === "string" && (p === "*" || isIdentifierText(p.endsWith("*") ? p.slice(0, -1) : p));
  if (!Array.isArray(raw) || raw.length === 0 || !raw.every(ok))
    throw new ConfigError(where, "agents must be a non-empty array of agent names, each exact or a prefix ending in '*' (\"gpu-*\")");
  return raw as string[];
}

function grant(role: Role, token: string, tenants: string[] | undefined, name: string | undefined, flag: string): TokenGrant {
  if (token.length < 8) throw new ConfigError(flag, "a token must be at least 8 characters");
  return { role, token, tenants, name: name ?? `${role}-${fingerprint(token)}` };
}

/** A short, non-reversible tag for a token, safe to log. */
export const fingerprint = (token: string) => createHash("sha256").update(token).digest("hex").slice(0, 8);
