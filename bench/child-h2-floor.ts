/**
 * Child process of the HTTP/2 floor (bench/floor.ts): a bare Node HTTP/2 server that answers every
 * stream as a gRPC unary call would be answered (headers, one small message, grpc-status trailers),
 * or a bare client that sends such calls at a steady rate, open loop. No gRPC library, no protobuf,
 * no database: what one call costs any Node process on this machine before it does anything.
 *   server            prints {"ready":true,"port":N}
 *   client PORT RATE MS   prints {"ready":true}, then {"sent":N} when done
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { openLoop } from "./baseline.js";
import { exitWith } from "./child-exit.js";

/** About the size of a single-item Enqueue request and its answer. */
const REQUEST = Buffer.alloc(5 + 90, 7);
const ANSWER = Buffer.alloc(5 + 40, 1);

const [mode, portRaw, rateRaw, msRaw] = process.argv.slice(2);
if (mode === "server") {
  const server = http2.createServer();
  server.on("connection", (s) => s.setNoDelay(true));
  server.on("stream", (stream) => {
    stream.on("error", () => {});
    stream.on("data", () => {});
    stream.once("end", () => {
      stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
      stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
      stream.end(ANSWER);
    });
  });
  server.listen(0, "127.0.0.1", () => console.log(JSON.stringify({ ready: true, port: (server.address() as AddressInfo).port })));
  process.once("SIGTERM", () => process.exit(0));
} else {
  const session = http2.connect(`http://127.0.0.1:${portRaw}`);
  await new Promise((resolve) => session.once("connect", resolve));
  const call = () =>
    new Promise<void>((resolve) => {
      const req = session.request({ ":method": "POST", ":path": "/bench.Floor/Call", "content-type": "application/grpc", te: "trailers" });
      req.on("error", () => resolve());
      req.on("data", () => {});
      req.once("close", resolve);
      req.end(REQUEST);
    });
  console.log(JSON.stringify({ ready: true }));
  const sent = await openLoop(Number(rateRaw), Number(msRaw), call);
  session.close();
  exitWith({ sent });
}
