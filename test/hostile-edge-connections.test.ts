/**
 * Issue 51, item 3: one address must not take every connection slot of the gRPC port, and a flood
 * of connections that never authenticate must not take the room of those that did
 * (src/server/http2-limits.ts). Each test starts a daemon of its own with small caps, and its peers
 * are raw sockets from loopback: 127.0.0.1, and 127.0.0.2 as another address (Linux routes all of
 * 127.0.0.0/8 to loopback). A "stranger" makes one Health.Check without a token and then sits idle;
 * a "member" makes one call with a token. Every wait is on a frame or a socket's close.
 */
import { describe, expect, it } from "vitest";
import type { Daemon } from "../src/daemon.js";
import { TOKENS } from "./support/daemon.js";
import { useTestDb } from "./support/kit.js";
import { END_HEADERS, END_STREAM, FRAME, grpcRequest, RawH2Peer, within } from "./support/raw-h2.js";
import { grpcMessage, h2Frame as frame } from "./support/wire.js";

const fx = useTestDb("edgeconns");

const empty = grpcMessage(new Uint8Array());

/** A connection that made one call (`auth`: with that header) and has had its answer. */
async function connectAndCall(daemon: Daemon, path: string, auth: [string, string][], localAddress?: string): Promise<RawH2Peer> {
  const peer = new RawH2Peer(daemon.port, { localAddress });
  peer.write(frame(FRAME.headers, END_HEADERS, 1, grpcRequest(path, auth)), frame(FRAME.data, END_STREAM, 1, empty));
  expect(await within(peer.answered(1), `the answer to ${path}`)).toBe(true);
  return peer;
}
const stranger = (daemon: Daemon, from?: string) => connectAndCall(daemon, "/grpc.health.v1.Health/Check", [], from);
const member = (daemon: Daemon, from?: string) =>
  connectAndCall(daemon, "/aiflow.cluster.v1.OpsService/ListAgents", [["authorization", `Bearer ${TOKENS.ops}`]], from);

/** Still served: a PING is answered on it. */
const alive = async (peer: RawH2Peer) => !peer.isClosed && (await within(peer.flushed(), "a PING's answer"));

describe("connection caps on the gRPC port", () => {
  it("past --max-connections-per-address a new connection evicts its address's idle unauthenticated ones, never an authenticated one, and other addresses are not counted", async () => {
    const daemon = await fx.startDaemon({ config: { maxConnections: 100, maxConnectionsPerAddress: 4, http2IdleTimeout: 600_000 } });
    const stats = daemon.serverStats;
    const first = await member(daemon);
    const strangers = [await stranger(daemon), await stranger(daemon), await stranger(daemon)];
    expect(stats.connectionsEvicted).toBe(0);
    // A flood from the same address: each newcomer gets in, and the longest idle stranger goes.
    for (let i = 0; i < 8; i++) {
      const oldest = strangers.shift()!;
      strangers.push(await stranger(daemon));
      await within(oldest.closed, "the evicted stranger's close");
      expect(stats.connectionsEvicted).toBe(i + 1);
    }
    expect(await alive(first)).toBe(true);

    // Members take the strangers' room one by one, until the address holds only members.
    const members = [first];
    for (const s of strangers) {
      members.push(await member(daemon));
      await within(s.closed, "the evicted stranger's close");
    }
    const refusedBefore = stats.connectionsRefused;
    const extra = new RawH2Peer(daemon.port);
    await within(extra.closed, "the refused connection's close");
    expect(stats.connectionsRefused).toBe(refusedBefore + 1);
    for (const m of members) expect(await alive(m)).toBe(true);

    // The cap is the address's: another address still gets in.
    const elsewhere = await stranger(daemon, "127.0.0.2");
    expect(await alive(elsewhere)).toBe(true);
    for (const p of [...members, elsewhere]) p.socket.destroy();
  });

  it("past --max-connections a new connection evicts an idle unauthenticated one from any address, so authenticated callers keep their room", async () => {
    const daemon = await fx.startDaemon({ config: { maxConnections: 6, maxConnectionsPerAddress: 100, http2IdleTimeout: 600_000 } });
    const stats = daemon.serverStats;
    const members = [await member(daemon), await member(daemon)];
    // Another address fills the rest with connections that asked one thing without a token.
    const strangers = [];
    for (let i = 0; i < 4; i++) strangers.push(await stranger(daemon, "127.0.0.2"));
    for (let i = 0; i < 6; i++) {
      const oldest = strangers.shift()!;
      strangers.push(await stranger(daemon, "127.0.0.2"));
      await within(oldest.closed, "the evicted stranger's close");
    }
    expect(stats.connectionsEvicted).toBe(6);
    // An authenticated caller arriving at the cap gets in too, and those already in stay.
    members.push(await member(daemon));
    await within(strangers.shift()!.closed, "the evicted stranger's close");
    for (const m of members) expect(await alive(m)).toBe(true);
    expect(stats.connectionsRefused).toBe(0);
    for (const p of [...members, ...strangers]) p.socket.destroy();
  });
});
