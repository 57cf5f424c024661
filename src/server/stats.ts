/**
 * What the server refused or cut, by cause: counters only ever grow, so a metrics exporter can
 * report them as they are. One object per server, so daemons in one process do not mix.
 */
import type { AuthFailure } from "./auth.js";

export interface ServerStats {
  /** Calls refused on their headers, by why (the token is never recorded). */
  authFailures: Record<AuthFailure, number>;
  /** Calls (and, over TLS, connections) refused because their address had too many failed authentications. */
  authThrottled: number;
  /** TLS handshakes refused on the client's certificate (none, expired, not signed by --tls-client-ca). */
  tlsRefused: number;
  /** Calls refused because the daemon held --max-inflight-bytes of request bodies. */
  inflightRefused: number;
  /** Health.Watch streams refused over a cap. */
  healthWatchRefused: number;
  /** Connections closed at once because --max-connections were open. */
  connectionsRefused: number;
  /** Connections without a stream cut to make room for a new one at --max-connections. */
  connectionsEvicted: number;
  prefaceTimeouts: number;
  headersTimeouts: number;
  bodyTimeouts: number;
  idleClosed: number;
  keepaliveTimeouts: number;
  /** Connections closed for resetting streams faster than --http2-max-resets per window. */
  resetFloods: number;
  /** Connections cut --http2-goaway-grace after a GOAWAY. */
  goawayDestroyed: number;
}

export function newServerStats(): ServerStats {
  return {
    authFailures: { missing: 0, unknown: 0, role: 0, unserved: 0, certificate: 0, disagree: 0 },
    authThrottled: 0,
    tlsRefused: 0,
    inflightRefused: 0,
    healthWatchRefused: 0,
    connectionsRefused: 0,
    connectionsEvicted: 0,
    prefaceTimeouts: 0,
    headersTimeouts: 0,
    bodyTimeouts: 0,
    idleClosed: 0,
    keepaliveTimeouts: 0,
    resetFloods: 0,
    goawayDestroyed: 0,
  };
}
