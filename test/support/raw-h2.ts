/**
 * A raw HTTP/2 peer for the hostile-edge tests: a socket that writes frames itself (a stock client
 * will not misbehave on purpose) and keeps what the server sent back. It acknowledges the server's
 * SETTINGS and answers its PINGs, as any live client does; every wait is on a frame or the socket's close.
 */
import { once } from "node:events";
import net from "node:net";
import { h2Frame, PREFACE } from "./wire.js";

export const FRAME = { data: 0, headers: 1, rst: 3, settings: 4, ping: 6, goaway: 7 } as const;
export const END_STREAM = 1;
export const END_HEADERS = 4;

/** HPACK literal fields without indexing (names and values under 127 bytes). */
export const hpack = (fields: [string, string][]): Buffer =>
  Buffer.concat(fields.flatMap(([n, v]) => [Buffer.from([0, n.length]), Buffer.from(n), Buffer.from([v.length]), Buffer.from(v)]));

/** The header block of a gRPC POST to `path`. */
export const grpcRequest = (path: string, extra: [string, string][] = []): Buffer =>
  hpack([
    [":method", "POST"],
    [":scheme", "http"],
    [":path", path],
    [":authority", "localhost"],
    ["content-type", "application/grpc"],
    ["te", "trailers"],
    ...extra,
  ]);

/** RST_STREAM's payload: the error code. */
export const rstCode = (code: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(code);
  return b;
};

export interface ReceivedFrame {
  type: number;
  flags: number;
  stream: number;
  payload: Buffer;
}

export class RawH2Peer {
  readonly socket: net.Socket;
  readonly closed: Promise<void>;
  /** The error codes of the GOAWAY frames received. */
  readonly goaways: number[] = [];
  /** Every frame received, in order. */
  readonly frames: ReceivedFrame[] = [];
  readonly #waiters: { check: () => boolean; resolve: (held: boolean) => void }[] = [];
  #buf: Buffer = Buffer.alloc(0);

  /** `localAddress`: the address to connect from (any of 127.0.0.0/8 on Linux), so one host can be several peers. */
  constructor(port: number, opts: { host?: string; localAddress?: string } = {}) {
    this.socket = net.connect({ port, host: opts.host ?? "127.0.0.1", localAddress: opts.localAddress });
    this.socket.on("error", () => {});
    this.closed = once(this.socket, "close").then(() => {});
    this.socket.write(Buffer.concat([PREFACE, h2Frame(FRAME.settings, 0, 0)]));
    this.socket.on("data", (d: Buffer) => this.#read(d));
  }

  write(...frames: Buffer[]): void {
    this.socket.write(Buffer.concat(frames));
  }

  /** Resolves true once `check` holds (checked now and after every frame received), false if the socket closes first. */
  until(check: () => boolean): Promise<boolean> {
    if (check()) return Promise.resolve(true);
    return Promise.race([new Promise<boolean>((resolve) => this.#waiters.push({ check, resolve })), this.closed.then(() => check())]);
  }

  /**
   * Resolves once the server has processed every frame written before it: a PING's ACK comes back
   * only after what preceded it on the connection was read.
   */
  flushed(): Promise<boolean> {
    const token = Buffer.from(`${Math.random()}`.slice(2, 10).padEnd(8, "0"));
    const from = this.frames.length;
    this.write(h2Frame(FRAME.ping, 0, 0, token));
    return this.until(() => this.frames.slice(from).some((f) => f.type === FRAME.ping && (f.flags & 1) === 1 && f.payload.equals(token)));
  }

  /** Resolves true once the call on `stream` has ended (its END_STREAM or a reset), false if the socket closes first. */
  answered(stream: number): Promise<boolean> {
    return this.until(() =>
      this.frames.some(
        (f) => f.stream === stream && (f.type === FRAME.rst || ((f.type === FRAME.headers || f.type === FRAME.data) && (f.flags & END_STREAM) !== 0)),
      ),
    );
  }

  get isClosed(): boolean {
    return this.socket.destroyed || this.socket.readyState === "closed";
  }

  #read(d: Buffer): void {
    this.#buf = this.#buf.length ? Buffer.concat([this.#buf, d]) : d;
    while (this.#buf.length >= 9) {
      const len = this.#buf.readUIntBE(0, 3);
      if (this.#buf.length < 9 + len) break;
      const f: ReceivedFrame = {
        type: this.#buf[3]!,
        flags: this.#buf[4]!,
        stream: this.#buf.readUInt32BE(5) & 0x7fffffff,
        payload: Buffer.from(this.#buf.subarray(9, 9 + len)),
      };
      this.#buf = this.#buf.subarray(9 + len);
      if (f.type === FRAME.settings && !(f.flags & 1)) this.socket.write(h2Frame(FRAME.settings, 1, 0));
      if (f.type === FRAME.ping && !(f.flags & 1)) this.socket.write(h2Frame(FRAME.ping, 1, 0, f.payload));
      if (f.type === FRAME.goaway) this.goaways.push(f.payload.readUInt32BE(4));
      this.frames.push(f);
      for (let i = 0; i < this.#waiters.length; i++) {
        const w = this.#waiters[i]!;
        if (!w.check()) continue;
        this.#waiters.splice(i--, 1);
        w.resolve(true);
      }
    }
  }
}

/** `p`, or a failure naming `what` after `ms`: a bound a working daemon never comes near, so a hang fails there, saying what, instead of at the test's timeout. */
export function within<T>(p: Promise<T>, what: string, ms = 10_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${ms}ms`)), ms)));
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}
