/** Types of tls.js (plain JavaScript so the heartbeat thread loads it without a TypeScript loader). */
import type { TLSSocket } from "node:tls";

/** TLS material as the agent's options give it: a string is a file path, bytes are PEM contents. */
export interface TlsSource {
  ca?: string | Uint8Array;
  cert?: string | Uint8Array;
  key?: string | Uint8Array;
  serverName?: string;
}

/** PEM contents, as a connection presents them. */
export interface TlsPem {
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
}

export declare class TlsMaterial {
  constructor(
    source: TlsSource,
    hooks?: { warn?: (message: string) => void; reloaded?: (parts: string[]) => void; initial?: { ca?: Uint8Array; cert?: Uint8Array; key?: Uint8Array } },
  );
  load(): TlsPem;
  current(): TlsPem;
  connect(authority: URL): TLSSocket;
}
