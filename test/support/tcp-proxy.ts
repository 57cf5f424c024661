import net from "node:net";

/**
 * A TCP proxy on loopback in front of a real server, for tests of what a client does when the path
 * to its server goes silent: freeze() stops carrying bytes on the connections open now without
 * closing them (as a dropped flow or a hung server looks to the client), while new connections
 * still pass. cut() closes the open connections, and refuse() makes new ones fail as a server
 * that is down ("close": accepted, then closed at once) or starting up ("starting-up": a Postgres
 * FATAL 57P03 in answer to the startup packet) fails them.
 */
export interface TcpProxy {
  /** The server's URL (as given to startTcpProxy), through the proxy. */
  url: string;
  /** Connections opened through the proxy so far. */
  readonly opened: number;
  freeze(): void;
  /** Closes every connection open now (as a server that went away closes them). */
  cut(): void;
  /** How new connections fail from now on; null: they pass again. */
  refuse(how: "close" | "starting-up" | null): void;
  close(): Promise<void>;
}

/** A Postgres ErrorResponse ('E'): severity FATAL, the SQLSTATE and its message. */
function pgFatal(code: string, message: string): Buffer {
  const fields = Buffer.from(`SFATAL\0VFATAL\0C${code}\0M${message}\0\0`);
  const head = Buffer.alloc(5);
  head.write("E", 0);
  head.writeUInt32BE(4 + fields.length, 1);
  return Buffer.concat([head, fields]);
}

/** A proxy in front of the server at `url` (a postgres:// URL or any with a host and port). */
export async function startTcpProxy(url: string): Promise<TcpProxy> {
  const target = new URL(url);
  const host = target.hostname;
  const port = Number(target.port || 5432);
  const open = new Set<[net.Socket, net.Socket]>();
  const frozen = new Set<[net.Socket, net.Socket]>();
  let opened = 0;
  let refusing: "close" | "starting-up" | null = null;
  const server = net.createServer((down) => {
    opened++;
    if (refusing === "close") return void down.destroy();
    if (refusing === "starting-up") {
      // Answers the startup packet (or an SSL request) as a Postgres that is starting up does.
      down.once("data", () => down.end(pgFatal("57P03", "the database system is starting up")));
      down.on("error", () => {});
      return;
    }
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
    cut() {
      for (const [down, up] of [...open, ...frozen]) {
        down.destroy();
        up.destroy();
      }
      open.clear();
      frozen.clear();
    },
    refuse(how) {
      refusing = how;
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
