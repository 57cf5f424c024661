/**
 * What one connection may hold, and for how long (src/server/http2-limits.ts), against a real daemon
 * over loopback with small limits. A peer here is a raw socket writing HTTP/2 frames itself, since a
 * stock client will not misbehave on purpose. Every wait is on a signal: a socket's 'close', a
 * GOAWAY frame, a session's 'remoteSettings'.
 */
import { once } from "node:events";
import http2 from "node:http2";
import net from "node:net";
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { TOKENS } from "./support/daemon.js";
import { useTestDaemon } from "./support/kit.js";
import { h2Frame as frame, PREFACE } from "./support/wire.js";

const fx = useTestDaemon({
  label: "h2limits",
  config: {
    maxConnections: 20,
    http2MaxConcurrentStreams: 10,
    http2PrefaceTimeout: 200,
    http2HeadersTimeout: 300,
    http2IdleTimeout: 300,
    http2KeepaliveInterval: 200,
    http2KeepaliveTimeout: 200,
    http2MaxResets: 10,
    http2ResetWindow: 60_000,
    http2GoawayGrace: 200,
  },
});
let daemon: Daemon;
beforeAll(() => void ({ daemon } = fx));

const TYPE = { data: 0, headers: 1, rst: 3, settings: 4, ping: 6, goaway: 7, continuation: 9 } as const;
const END_STREAM = 1;
const END_HEADERS = 4;
/** HPACK literal fields without indexing (names and values under 127 bytes). */
const hpack = (fields: [string, string][]) =>
  Buffer.concat(fields.flatMap(([n, v]) => [Buffer.from([0, n.length]), Buffer.from(n), Buffer.from([v.length]), Buffer.from(v)]));
const request = (path: string, extra: [string, string][] = []) =>
  hpack([
    [":method", "POST"],
    [":scheme", "http"],
    [":path", path],
    [":authority", "localhost"],
    ["content-type", "application/grpc"],
    ["te", "trailers"],
    ...extra,
  ]);
const WATCH = "/grpc.health.v1.Health/Watch";
const emptyMessage = Buffer.alloc(5);

/** A raw HTTP/2 peer: what it received, and a promise of its socket's close. */
class RawPeer {
  readonly socket: net.Socket;
  readonly closed: Promise<void>;
  readonly goaways: number[] = [];
  readonly pings: Buffer[] = [];
  /** Resolves once the server's SETTINGS are acknowledged. */
  readonly ready: Promise<void>;
  #settled!: () => void;
  #buf = Buffer.alloc(0);
  #goaway: (() => void)[] = [];

  constructor(opts: { preface?: boolean; answerPings?: boolean } = {}) {
    this.socket = net.connect(daemon.port, "127.0.0.1");
    this.socket.on("error", () => {});
    this.closed = once(this.socket, "close").then(() => {});
    this.ready = new Promise((r) => (this.#settled = r));
    if (opts.preface !== false) this.socket.write(Buffer.concat([PREFACE, frame(TYPE.settings, 0, 0)]));
    this.socket.on("data", (d: Buffer) => {
      this.#buf = Buffer.concat([this.#buf, d]);
      while (this.#buf.length >= 9) {
        const len = this.#buf.readUIntBE(0, 3);
        if (this.#buf.length < 9 + len) break;
        const [type, flags] = [this.#buf[3]!, this.#buf[4]!];
        const payload = this.#buf.subarray(9, 9 + len);
        if (opts.preface === false) return;
        if (type === TYPE.settings && !(flags & 1)) {
          this.socket.write(frame(TYPE.settings, 1, 0));
          this.#settled();
        }
        if (type === TYPE.ping && !(flags & 1)) {
          this.pings.push(payload);
          if (opts.answerPings !== false) this.socket.write(frame(TYPE.ping, 1, 0, Buffer.from(payload)));
        }
        if (type === TYPE.goaway) {
          this.goaways.push(payload.readUInt32BE(4));
          for (const f of this.#goaway.splice(0)) f();
        }
        this.#buf = this.#buf.subarray(9 + len);
      }
    });
  }

  /** Opens a Health.Watch on stream 1 and resolves once its response headers arrive. */
  openWatch(): Promise<void> {
    const headersSeen = new Promise<void>((r) => {
      const scan = (d: Buffer) => {
        if (d.includes(Buffer.from([TYPE.headers, 4, 0, 0, 0, 1]))) {
          this.socket.off("data", scan);
          r();
        }
      };
      this.socket.on("data", scan);
    });
    this.write(frame(TYPE.headers, END_HEADERS, 1, request(WATCH)), frame(TYPE.data, END_STREAM, 1, emptyMessage));
    return Promise.race([headersSeen, this.closed]);
  }

  write(...frames: Buffer[]): void {
    this.socket.write(Buffer.concat(frames));
  }

  get isClosed(): boolean {
    return this.socket.destroyed || this.socket.readyState === "closed";
  }

  goaway(): Promise<number> {
    return this.goaways.length ? Promise.resolve(this.goaways[0]!) : new Promise((r) => this.#goaway.push(() => r(this.goaways[0]!)));
  }
}

describe("HTTP/2 limits", () => {
  it("serves an ordinary call with a token through all of it", async () => {
    const client = http2.connect(`http://${daemon.address}`);
    const req = client.request({
      ":method": "POST",
      ":path": "/grpc.health.v1.Health/Check",
      "content-type": "application/grpc",
      te: "trailers",
      authorization: `Bearer ${TOKENS.ops}`,
    });
    req.end(emptyMessage);
    req.resume();
    const [trailers] = (await once(req, "trailers")) as [http2.IncomingHttpHeaders];
    expect(trailers["grpc-status"]).toBe("0");
    client.close();
  });

  it("advertises SETTINGS_MAX_CONCURRENT_STREAMS, and refuses streams past it", async () => {
    const client = http2.connect(`http://${daemon.address}`);
    const [settings] = (await once(client, "remoteSettings")) as [http2.Settings];
    expect(settings.maxConcurrentStreams).toBe(10);
    client.close();

    // A raw peer opens 12 header-only streams at once: the two past the limit are reset (REFUSED_STREAM).
    const peer = new RawPeer();
    const resets: number[] = [];
    peer.socket.on("data", function scan(d: Buffer) {
      for (let i = 0; i + 9 <= d.length; ) {
        const len = d.readUIntBE(i, 3);
        if (d[i + 3] === TYPE.rst) resets.push(d.readUInt32BE(i + 5) & 0x7fffffff);
        i += 9 + len;
      }
    });
    const block = request(WATCH);
    peer.write(...Array.from({ length: 12 }, (_, i) => frame(TYPE.headers, END_HEADERS, 1 + 2 * i, block)));
    // A PING after them: its ACK arrives once the server has processed every frame before it.
    peer.write(frame(TYPE.ping, 0, 0, Buffer.alloc(8, 7)));
    await new Promise<void>((r) => peer.socket.on("data", (d: Buffer) => d.includes(Buffer.from([0, 0, 8, TYPE.ping, 1])) && r()));
    expect(resets.sort((a, b) => a - b)).toEqual([21, 23]);
    peer.socket.destroy();
  });

  it("cuts a connection that sends no preface", async () => {
    const peer = new RawPeer({ preface: false });
    await peer.closed;
    expect(daemon.serverStats.prefaceTimeouts).toBeGreaterThanOrEqual(1);
  });

  it("cuts a connection whose first request's headers never complete (HEADERS without END_HEADERS)", async () => {
    const before = daemon.serverStats.headersTimeouts;
    // Nothing may come between a HEADERS frame and its CONTINUATION, not even a SETTINGS or PING ACK.
    const peer = new RawPeer({ answerPings: false });
    await peer.ready;
    const block = request(WATCH);
    peer.write(frame(TYPE.headers, 0, 1, block.subarray(0, 10)));
    expect(await peer.goaway()).toBe(0);
    await peer.closed;
    expect(daemon.serverStats.headersTimeouts).toBe(before + 1);
  });

  it("cuts a connection that resets streams faster than --http2-max-resets (rapid reset)", async () => {
    const peer = new RawPeer();
    const block = request("/grpc.health.v1.Health/Check");
    const cancel = Buffer.alloc(4);
    cancel.writeUInt32BE(http2.constants.NGHTTP2_CANCEL);
    peer.write(...Array.from({ length: 20 }, (_, i) => [frame(TYPE.headers, END_HEADERS, 1 + 2 * i, block), frame(TYPE.rst, 0, 1 + 2 * i, cancel)]).flat());
    expect(await peer.goaway()).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
    await peer.closed;
    expect(daemon.serverStats.resetFloods).toBeGreaterThanOrEqual(1);
  });

  it("cuts a connection --http2-goaway-grace after the client's GOAWAY, even with a stream still open", async () => {
    const peer = new RawPeer();
    peer.write(frame(TYPE.headers, END_HEADERS, 1, request(WATCH)), frame(TYPE.data, 0, 1, emptyMessage));
    // Last-stream-id 0, NO_ERROR: the client goes away but its watch would stay open for ever.
    peer.write(frame(TYPE.goaway, 0, 0, Buffer.alloc(8)));
    const before = daemon.serverStats.goawayDestroyed;
    await peer.closed;
    expect(daemon.serverStats.goawayDestroyed).toBe(before + 1);
  });

  it("sends GOAWAY to a connection idle past --http2-idle-timeout, but never to one with a long-lived call open", async () => {
    const busy = new RawPeer();
    busy.write(frame(TYPE.headers, END_HEADERS, 1, request(WATCH)), frame(TYPE.data, END_STREAM, 1, emptyMessage));
    const idle = new RawPeer();
    idle.write(frame(TYPE.headers, END_HEADERS | END_STREAM, 1, request("/grpc.health.v1.Health/Check")));
    expect(await idle.goaway()).toBe(0);
    await idle.closed;
    // The busy connection was opened first and is swept with the idle one: it would be closed by now.
    expect(busy.goaways).toEqual([]);
    expect(busy.isClosed).toBe(false);
    busy.socket.destroy();
  });

  it("cuts a connection that does not answer keepalive pings, and keeps one that does", async () => {
    const answering = new RawPeer();
    answering.write(frame(TYPE.headers, END_HEADERS, 1, request(WATCH)), frame(TYPE.data, END_STREAM, 1, emptyMessage));
    const dead = new RawPeer({ answerPings: false });
    dead.write(frame(TYPE.headers, END_HEADERS, 1, request(WATCH)), frame(TYPE.data, END_STREAM, 1, emptyMessage));
    const before = daemon.serverStats.keepaliveTimeouts;
    await dead.closed;
    expect(dead.pings.length).toBeGreaterThanOrEqual(1);
    expect(daemon.serverStats.keepaliveTimeouts).toBe(before + 1);
    expect(answering.pings.length).toBeGreaterThanOrEqual(1);
    expect(answering.isClosed).toBe(false);
    answering.socket.destroy();
  });
  it("at --max-connections a new connection evicts the oldest that opened no stream, else it is closed at once", async () => {
    const stats = daemon.serverStats;
    const evicted = stats.connectionsEvicted;
    const peers: RawPeer[] = [];
    // Other tests' connections may still be closing: open empty ones until the daemon evicts one.
    for (let i = 0; i < 40 && stats.connectionsEvicted === evicted; i++) {
      const p = new RawPeer();
      peers.push(p);
      await Promise.race([p.ready, p.closed]);
    }
    expect(stats.connectionsEvicted).toBe(evicted + 1);
    await peers[0]!.closed;
    expect(peers.at(-1)!.isClosed).toBe(false);

    // Every open connection of ours now holds a call: nothing may be evicted, so the next is refused.
    const live = peers.filter((p) => !p.isClosed);
    await Promise.all(live.map((p) => p.openWatch()));
    const refused = stats.connectionsRefused;
    while (stats.connectionsRefused === refused) {
      const p = new RawPeer();
      peers.push(p);
      await Promise.race([p.ready.then(() => p.openWatch()), p.closed]);
    }
    expect(peers.at(-1)!.isClosed).toBe(true);
    expect(stats.connectionsEvicted).toBe(evicted + 1);
    for (const p of peers) p.socket.destroy();
  });
});
