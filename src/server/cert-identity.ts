/**
 * Who a verified client certificate says its holder is. The mapping, the one place it is decided:
 *
 *   a URI SAN  spiffe://<trust domain>/<role>/<name>    role: agent | engine | ops | runs
 *
 * - For an agent, <name> is the agent name the holder may act as, or a prefix of names ending in '*'
 *   (spiffe://aiflow/agent/gpu-* may register gpu-1, gpu-2, … but not cpu-1), as a token's `agents`
 *   are written. Several such URIs in one certificate grant each of their names.
 * - For engine, ops and runs, <name> names the caller (its principal in audit records and createdby).
 * - URIs of another trust domain, other schemes and DNS or IP SANs are not identities (DNS and IP
 *   SANs name servers); a certificate with none of ours has no identity, and its calls need a token.
 * - A certificate that names two roles, or a name that is not one, is refused, not guessed at.
 * The trust domain is --tls-trust-domain (default "aiflow"). A certificate only reaches this once the
 * TLS handshake has verified it against --tls-client-ca.
 */
import type { Http2Session } from "node:http2";
import type { TLSSocket } from "node:tls";
import { isIdentifierText } from "../domain/names.js";
import { isAgentPattern, ROLES, type Role } from "../domain/tokens.js";

export interface CertIdentity {
  role: Role;
  /** The agent names (or prefixes ending in '*') it may act as, or the caller's names for engine and ops. */
  names: string[];
  /** The first SPIFFE ID: who the caller is in audit records. */
  principal: string;
}

/** A certificate's identity, none (undefined: a token is needed), or why it names no one we accept. */
export type CertReading = CertIdentity | { refused: string } | undefined;

export function readCertIdentity(subjectAltName: string | undefined, trustDomain: string): CertReading {
  const prefix = `spiffe://${trustDomain}/`;
  const ours = uriSans(subjectAltName).filter((u) => u.startsWith(prefix));
  if (ours.length === 0) return undefined;
  let role: Role | undefined;
  const names: string[] = [];
  for (const uri of ours) {
    const parts = uri.slice(prefix.length).split("/");
    const [r, name] = parts;
    if (parts.length !== 2 || !(ROLES as readonly string[]).includes(r!))
      return { refused: `client certificate names '${uri}', which is not ${prefix}<${ROLES.join("|")}>/<name>` };
    if (role !== undefined && r !== role) return { refused: `client certificate names two roles (${role} and ${r}); a certificate is one caller` };
    role = r as Role;
    const ok = role === "agent" ? isAgentPattern(name) : isIdentifierText(name!);
    if (!ok)
      return {
        refused: `client certificate names '${uri}', whose '${name}' is not ${role === "agent" ? "an agent name or a prefix ending in '*'" : "a name"}`,
      };
    names.push(name!);
  }
  return { role: role!, names, principal: ours[0]! };
}

/**
 * The URI SANs in Node's subjectaltname text ("URI:spiffe://a/b, DNS:x"). A value with a comma or a
 * quote in it comes JSON-quoted (URI:"…"), so the text is read entry by entry, not split on commas.
 */
function uriSans(text: string | undefined): string[] {
  if (!text) return [];
  const out: string[] = [];
  for (const m of text.matchAll(/(?:^|, )([A-Za-z ]+):("(?:[^"\\]|\\.)*"|[^,]*)/g)) {
    if (m[1] !== "URI") continue;
    const raw = m[2]!;
    try {
      out.push(raw.startsWith('"') ? (JSON.parse(raw) as string) : raw);
    } catch {
      // A value Node quoted in a way JSON cannot read is not a name we could have issued.
    }
  }
  return out;
}

/** What a TLS socket's verified client certificate says (undefined: none, or not verified). */
export function socketIdentity(socket: TLSSocket, trustDomain: string): CertReading {
  const verified = typeof socket.getPeerCertificate === "function" && socket.authorized;
  return verified ? readCertIdentity(socket.getPeerCertificate().subjectaltname, trustDomain) : undefined;
}

/** The identity of a session's verified client certificate, read once per session (every call asks). */
export class PeerIdentities {
  readonly #bySession = new WeakMap<Http2Session, CertReading | null>();
  constructor(private readonly trustDomain: string) {}

  of(session: Http2Session | undefined): CertReading {
    if (!session) return undefined;
    let r = this.#bySession.get(session);
    if (r === undefined) {
      const socket = session.socket as TLSSocket | undefined;
      r = (socket ? socketIdentity(socket, this.trustDomain) : undefined) ?? null;
      this.#bySession.set(session, r);
    }
    return r ?? undefined;
  }
}
