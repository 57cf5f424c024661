import net from "node:net";

/**
 * A port that is free on loopback right now: the kernel picks it for a throwaway listener. Another
 * process could take it before the caller binds it, which is unlikely enough for tests.
 */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen({ port: 0, host: "127.0.0.1" }, () => {
      const address = server.address();
      if (address === null || typeof address === "string") {
        server.close(() => reject(new Error(`unexpected listener address ${String(address)}`)));
        return;
      }
      server.close(() => resolve(address.port));
    });
  });
}
