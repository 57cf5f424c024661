import net from "node:net";

/**
 * A TCP proxy on loopback in front of a real server, for tests of what a client does when the path
 * to its server goes silent: freeze() stops carrying bytes on the connections open now without
 * closing them (as a dropped flow or a hung server looks to the client), while new connections
 * still pass.
 */
export interface TcpProxy {
  /** The server's URL (as given to startTcpProxy), through the proxy. */
  url: string;
  /** Connections opened through the proxy so far. */
  readonly opened: number;
  freeze(): void;
  close(): Promise<void>;
}

/** A proxy in front of the server at `url` (a postgres:// URL or any with a host and port). */
export async function startTcpProxy(url: string): Promise<TcpProxy> {
  const target = new URL(url);
  const host = target.hostname;
  const port = Number(target.port || 5432);
  const open = new Set<[net.Socket, net.Socket]>();
  const frozen = new Set<[net.Socket, net.Socket]>();
  let opened = 0;
  const server = net.createServer((down) => {
    opened++;
    const up = net.connect(port, host);
    const pair: [net.Socket, net.Socket] = [down, up];
    open.add(pair);
    down.pipe(up);
    up.pipe(down);
    const end = () => {
      down.destroy();
      up.destroy();
      open.delete(pair);
    };
    for (const s of pair) s.on("error", end).on("close", end);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const via = new URL(url);
  via.hostname = "127.0.0.1";
  via.port = String((server.address() as net.AddressInfo).port);
  return {
    url: via.toString(),
    get opened() {
      return opened;
    },
    freeze() {
      for (const pair of open) {
        const [down, up] = pair;
        down.unpipe(up);
        up.unpipe(down);
        down.pause();
        up.pause();
        open.delete(pair);
        frozen.add(pair);
      }
    },
    async close() {
      for (const [down, up] of [...open, ...frozen]) {
        down.destroy();
        up.destroy();
      }
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
