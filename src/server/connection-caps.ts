/**
 * Open sockets of one listener, in all and per address, against its two caps, and the warnings when
 * a cap is reached: one when a burst over a cap begins (for the address cap, per address), one when
 * it ends; the rest of a burst is only counted. The gRPC port (./http2-limits.ts) and the HTTP port
 * (./http-endpoints.ts) each keep one; what to do with a socket over a cap is theirs to decide.
 */
import type { Socket } from "node:net";
import type { Logger } from "../log.js";

export interface CapLimits {
  maxConnections: number;
  maxConnectionsPerAddress: number;
}

/** How a listener's logs name its caps and its connections. */
export interface CapNames {
  total: string;
  perAddress: string;
  connections: string;
}

export type OverCap = "address" | "total";

export class ConnectionCaps {
  #open = 0;
  readonly #byAddress = new Map<string, number>();
  #burst = 0;
  readonly #addressBursts = new Map<string, number>();

  constructor(
    private readonly limits: CapLimits,
    private readonly log: Logger,
    private readonly names: CapNames,
  ) {}

  /** Counts the socket until it closes; says which cap it is over, if any (its address's first). */
  open(socket: Socket, address: string): OverCap | undefined {
    this.#open++;
    const mine = (this.#byAddress.get(address) ?? 0) + 1;
    this.#byAddress.set(address, mine);
    socket.once("close", () => this.#closed(address));
    if (mine > this.limits.maxConnectionsPerAddress) return "address";
    if (this.#open > this.limits.maxConnections) return "total";
    return undefined;
  }

  /** A socket over `which` cap was refused, or made room by evicting: `what` says which. */
  overCap(which: OverCap, address: string, what: string): void {
    const { names, limits } = this;
    if (which === "total") {
      if (this.#burst++ === 0)
        this.log.warn(
          { maxConnections: limits.maxConnections, remote: address },
          `${names.total} ${names.connections} are open: ${what} (more of this burst are counted, not logged)`,
        );
      return;
    }
    const n = this.#addressBursts.get(address) ?? 0;
    this.#addressBursts.set(address, n + 1);
    if (n === 0)
      this.log.warn(
        { maxConnectionsPerAddress: limits.maxConnectionsPerAddress, remote: address },
        `${names.perAddress} ${names.connections} are open from this address: ${what} (more of this burst are counted, not logged)`,
      );
  }

  #closed(address: string): void {
    this.#open--;
    const left = this.#byAddress.get(address)! - 1;
    if (left === 0) this.#byAddress.delete(address);
    else this.#byAddress.set(address, left);
    if (this.#burst > 0 && this.#open < this.limits.maxConnections) {
      this.log.warn({ overCap: this.#burst }, `${this.names.connections} below ${this.names.total} again`);
      this.#burst = 0;
    }
    const burst = this.#addressBursts.get(address);
    if (burst !== undefined && left < this.limits.maxConnectionsPerAddress) {
      this.log.warn({ overCap: burst, remote: address }, `${this.names.connections} from this address below ${this.names.perAddress} again`);
      this.#addressBursts.delete(address);
    }
  }
}
