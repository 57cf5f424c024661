/**
 * Child process: N simulated agents that register, then each open an agent stream (Connect) with
 * one credit and wait on it, as an idle agent's stream waits for work. Streams share HTTP/2
 * connections (200 to one), where a fleet's agents would each have their own: what is measured is
 * the daemon's cost per stream, not per connection. Prints {"ready":true} once every stream has its first
 * answer (the agent's status), then, on a "wake" line from the parent over IPC, reports how many
 * items reached the streams ({"pushed":N}); on SIGTERM says goodbye on every stream and exits.
 */
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { AgentService, type ConnectRequestSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { exitWith } from "./child-exit.js";

type Request = MessageInitShape<typeof ConnectRequestSchema>;

const [address, token, countRaw, tenant, kind] = process.argv.slice(2);
const count = Number(countRaw);
const headers = { authorization: `Bearer ${token}` };
// 200 streams a connection, under the daemon's --http2-max-concurrent-streams (256 by default).
const clients = Array.from({ length: Math.max(8, Math.ceil(count / 200)) }, () =>
  createClient(AgentService, createGrpcTransport({ baseUrl: `http://${address}` })),
);
const names = Array.from({ length: count }, (_, i) => `bench-stream-${i}`);
const client = (i: number) => clients[i % clients.length]!;
for (let i = 0; i < count; i += 100)
  await Promise.all(
    names.slice(i, i + 100).map((name, j) => client(i + j).register({ name, metadata: { slots: 1, tenants: [tenant!], engineKinds: [kind!] } }, { headers })),
  );

/** One stream's requests: its first message, then a goodbye when the process is told to stop. */
class Requests {
  #queue: Request[] = [];
  #wake: (() => void) | undefined;
  #ended = false;
  constructor(first: Request) {
    this.#queue.push(first);
  }
  end(last: Request): void {
    this.#queue.push(last);
    this.#ended = true;
    this.#wake?.();
  }
  async *[Symbol.asyncIterator](): AsyncGenerator<Request> {
    for (;;) {
      while (this.#queue.length > 0) yield this.#queue.shift()!;
      if (this.#ended) return;
      await new Promise<void>((r) => (this.#wake = r));
    }
  }
}

let answered = 0;
let pushed = 0;
const requests = names.map((name) => new Requests({ name, credits: 1 }));
const ready = new Promise<void>((resolve) => {
  const streams = names.map(async (_, i) => {
    let first = true;
    for await (const res of client(i).connect(requests[i]!, { headers })) {
      if (first && ++answered === count) resolve();
      first = false;
      pushed += res.items.length;
    }
  });
  void Promise.allSettled(streams).then(() => exitWith({ pushed }));
});
await ready;
console.log(JSON.stringify({ ready: true }));
process.on("message", (m) => {
  if (m === "count") console.log(JSON.stringify({ pushed }));
});
process.on("SIGTERM", () => {
  for (const r of requests) r.end({ goodbye: true });
});
