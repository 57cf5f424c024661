/**
 * Issue 51, item 8: the HTTP port (/metrics, /healthz, /readyz, /api, /hooks, /console) faces the
 * internet, so what one peer can hold there is bounded (src/server/http-endpoints.ts): connections
 * in all and per address, and how long a request may take to arrive. Peers are raw HTTP/1.1
 * sockets from loopback (127.0.0.2 and 127.0.0.3 as other addresses: Linux routes all of
 * 127.0.0.0/8 there), against daemons of this file's own with small limits. Every wait is on a
 * socket's event; `within` only bounds a wait that a working daemon ends long before.
 */
import { once } from "node:events";
import net from "node:net";
import { beforeAll, describe, expect, it } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { until, useTestDb } from "./support/kit.js";
import { within } from "./support/raw-h2.js";

const fx = useTestDb("edgehttp");

/** A raw HTTP/1.1 peer that keeps what it was sent. `halfOpen`: it never closes its side (a hostile peer's way to hold a socket). */
class Peer {
  readonly socket: net.Socket;
  readonly closed: Promise<void>;
  readonly ended: Promise<void>;
  received = "";

  constructor(url: string, opts: { halfOpen?: boolean; from?: string } = {}) {
    const { hostname, port } = new URL(url);
    this.socket = net.connect({ host: hostname, port: Number(port), allowHalfOpen: opts.halfOpen ?? false, localAddress: opts.from });
    this.socket.on("error", () => {});
    this.socket.on("data", (d: Buffer) => (this.received += d.toString("latin1")));
    this.closed = once(this.socket, "close").then(() => {});
    this.ended = Promise.race([once(this.socket, "end").then(() => {}), this.closed]);
  }

  /** Resolves once the connection is up (or gone). */
  connected(): Promise<void> {
    return Promise.race([once(this.socket, "connect").then(() => {}), this.closed]);
  }

  /** Sends `request` (or its rest) and resolves with its answer's status line: proof the connection is served. */
  async ask(request = "HEAD /healthz HTTP/1.1\r\nhost: x\r\n\r\n"): Promise<string> {
    const from = this.received.length;
    this.socket.write(request);
    // A HEAD's answer ends with its headers.
    const done = () => this.received.slice(from).includes("\r\n\r\n") || this.socket.destroyed;
    await within(new Promise<void>((resolve) => (done() ? resolve() : this.socket.on("data", () => done() && resolve()))), "the answer to HEAD /healthz");
    return this.received.slice(from).split("\r\n")[0]!;
  }
}

describe("the HTTP port's request timeout", () => {
  let daemon: Daemon;
  beforeAll(async () => {
    daemon = await fx.startDaemon({ config: { httpListen: { host: "127.0.0.1", port: 0 }, httpRequestTimeout: 300 } });
  });

  it("answers a half-written request 408 and closes its connection, even one whose peer never closes its side", async () => {
    const peer = new Peer(daemon.httpUrl!, { halfOpen: true });
    await peer.connected();
    peer.socket.write("GET /metr");
    await within(peer.ended, "the daemon's end of a half-written request");
    expect(peer.received).toMatch(/^HTTP\/1\.1 408 /);
    // Our side is still open: what we send now must find the daemon's socket gone (the first write
    // draws a reset, a later one fails on it), not half-open and read for as long as we like.
    await until("a write finds the daemon's socket gone", () => (peer.socket.write("x"), peer.socket.destroyed), 10_000, 20);
  });

  it("closes a connection that sends nothing, and one whose body stops part way", async () => {
    const silent = new Peer(daemon.httpUrl!);
    const body = new Peer(daemon.httpUrl!);
    await body.connected();
    body.socket.write('POST /hooks/default/h HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"a":');
    await within(silent.closed, "the close of a connection that sent nothing");
    await within(body.closed, "the close of a request whose body stopped");
  });

  it("serves a request that arrives whole as before", async () => {
    const peer = new Peer(daemon.httpUrl!);
    await peer.connected();
    expect(await peer.ask()).toBe("HTTP/1.1 200 OK");
    peer.socket.destroy();
  });
});

describe("the HTTP port's connection caps", () => {
  let daemon: Daemon;
  beforeAll(async () => {
    daemon = await fx.startDaemon({
      config: { httpListen: { host: "127.0.0.1", port: 0 }, httpMaxConnections: 6, httpMaxConnectionsPerAddress: 4, httpRequestTimeout: 60_000 },
    });
  });

  it("closes on accept a connection past --http-max-connections-per-address or --http-max-connections, and serves those within", async () => {
    const url = daemon.httpUrl!;
    const held: Peer[] = [];
    for (let i = 0; i < 4; i++) held.push(new Peer(url));
    await Promise.all(held.map((p) => p.connected()));
    // Its first request's first byte sent: a half-written request, held until the timeout.
    for (const p of held) p.socket.write("G");
    const fifth = new Peer(url);
    await within(fifth.closed, "the close of the fifth connection from one address");
    expect(fifth.received).toBe("");

    // Another address has room of its own, up to the total.
    const others = [new Peer(url, { from: "127.0.0.2" }), new Peer(url, { from: "127.0.0.2" })];
    await Promise.all(others.map((p) => p.connected()));
    const seventh = new Peer(url, { from: "127.0.0.3" });
    await within(seventh.closed, "the close of a connection past the total");

    for (const p of others) expect(await p.ask()).toBe("HTTP/1.1 200 OK");
    // Those held are served once their request is whole: "G" + "ET /healthz…".
    for (const p of held) expect(await p.ask("ET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")).toBe("HTTP/1.1 200 OK");
    for (const p of [...held, ...others]) p.socket.destroy();
  });
});
