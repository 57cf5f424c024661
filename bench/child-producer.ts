/**
 * Child process: the open-loop producer of the latency test, in its own process so that producing
 * does not share an event loop with what is measured. Items sent during the warm-up carry
 * measure:false. Prints {"ready":true}, then {"sent":N} when done.
 */
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import pg from "pg";
import { openLoop } from "./baseline.js";
import { nowMs } from "./clock.js";

const [mode, target, rateRaw, durationRaw, warmupRaw, token, tenant, kind] = process.argv.slice(2);
const rate = Number(rateRaw);
const warmupMs = Number(warmupRaw);
const durationMs = Number(durationRaw);
const start = nowMs();
const payload = () => JSON.stringify({ sentAt: nowMs(), measure: nowMs() - start >= warmupMs });

let send: () => Promise<unknown>;
let close = async () => {};
if (mode === "baseline") {
  // A pool, so that inserts are not queued behind each other on one connection (which would count
  // client-side queueing as dispatch latency); the daemon side gets the same from HTTP/2 streams.
  const pool = new pg.Pool({ connectionString: target, max: 16 });
  send = () => pool.query(`WITH i AS (INSERT INTO public.aiflow_bench_baseline (payload) VALUES ($1) RETURNING id) SELECT pg_notify('aiflow_bench_baseline', '')`, [payload()]);
  close = () => pool.end();
} else {
  // A stock gRPC client (grpc-js, from the .proto files), as a producer written against the
  // published protos would be, and the lightest Node client we have: the producer shares the
  // machine with what it measures, and connect-node's client cost about twice its CPU per call.
  const def = protoLoader.loadSync("aiflow/cluster/v1/queue.proto", { includeDirs: [fileURLToPath(new URL("../proto/", import.meta.url))], longs: String, enums: String, defaults: true });
  const Queue = (grpc.loadPackageDefinition(def) as unknown as { aiflow: { cluster: { v1: { QueueService: grpc.ServiceClientConstructor } } } }).aiflow.cluster.v1.QueueService;
  const client = new Queue(target!, grpc.credentials.createInsecure()) as unknown as Record<string, (req: object, md: grpc.Metadata, cb: (err: grpc.ServiceError | null) => void) => void>;
  const md = new grpc.Metadata();
  md.set("authorization", `Bearer ${token}`);
  send = () =>
    new Promise<void>((resolve, reject) =>
      client.enqueue!.call(client, { tenantKey: tenant!, items: [{ engineKind: kind!, payloadJson: payload() }] }, md, (err) => (err ? reject(err) : resolve())),
    );
  close = async () => (client as unknown as grpc.Client).close();
}
console.log(JSON.stringify({ ready: true }));
const sent = await openLoop(rate, warmupMs + durationMs, send);
await close();
console.log(JSON.stringify({ sent }));
process.exit(0);
