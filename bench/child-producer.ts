/**
 * Child process: the open-loop producer of the latency test, in its own process so that producing
 * does not share an event loop with what is measured. Items sent during the warm-up carry
 * measure:false. Prints {"ready":true}, then {"sent":N} when done. Modes: ours (argv: daemon URL, then
 * token, tenant, kind), baseline (the database URL), graphile (the database URL, then its schema).
 */
import { readFileSync } from "node:fs";
import { createClient, type Interceptor } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { createSdkGrpcTransport } from "@aiflow/wire/client";
import pg from "pg";
import { openLoop } from "./baseline.js";
import { nowMs } from "./clock.js";
import { exitWith } from "./child-exit.js";

const [mode, target, rateRaw, durationRaw, warmupRaw, ...rest] = process.argv.slice(2);
const rate = Number(rateRaw);
const warmupMs = Number(warmupRaw);
const durationMs = Number(durationRaw);
/** When the open loop starts: the warm-up is timed from there, whatever each mode took to set up. */
let start = Number.POSITIVE_INFINITY;
const stamp = () => ({ sentAt: nowMs(), measure: nowMs() - start >= warmupMs });
const payload = () => JSON.stringify(stamp());

let send: () => Promise<unknown>;
let close = async () => {};
if (mode === "baseline") {
  // A pool, so that inserts are not queued behind each other on one connection (which would count
  // client-side queueing as dispatch latency); the daemon side gets the same from HTTP/2 streams.
  const pool = new pg.Pool({ connectionString: target, max: 16 });
  send = () =>
    pool.query(`WITH i AS (INSERT INTO public.aiflow_bench_baseline (payload) VALUES ($1) RETURNING id) SELECT pg_notify('aiflow_bench_baseline', '')`, [
      payload(),
    ]);
  close = () => pool.end();
} else if (mode === "graphile") {
  // Its own client API, one job per call (addJob, its add_job function), over a pool of its own of
  // the same size as the raw baseline's producer, for the same reason. rest[0] is its schema.
  const { makeWorkerUtils } = await import("graphile-worker");
  const { GRAPHILE_TASK, quietLogger } = await import("./graphile.js");
  const utils = await makeWorkerUtils({ connectionString: target, maxPoolSize: 16, schema: rest[0]!, logger: quietLogger });
  send = () => utils.addJob(GRAPHILE_TASK, stamp());
  close = async () => {
    await utils.release();
  };
} else {
  const [token, tenant, kind] = rest;
  // The SDK's gRPC transport (connect's client, unary calls straight over the HTTP/2 session with
  // the compiled codec): the lightest Node client we have, and the producer shares the machine with
  // what it measures. A stock grpc-js client took about a quarter more CPU per call (34 % of a core
  // at 1,000 calls/s against 28 %); stock clients' interop is what the end-to-end tests check.
  // target is the daemon's URL; over TLS (https://) BENCH_TLS_CA is the CA to trust.
  const url = target!;
  const session = new Http2SessionManager(url, undefined, process.env.BENCH_TLS_CA ? { ca: readFileSync(process.env.BENCH_TLS_CA) } : undefined);
  const auth: Interceptor = (next) => (req) => {
    req.header.set("authorization", `Bearer ${token}`);
    return next(req);
  };
  const client = createClient(QueueService, createSdkGrpcTransport({ baseUrl: url, sessionManager: session, interceptors: [auth] }));
  send = () => client.enqueue({ tenantKey: tenant!, items: [{ engineKind: kind!, payloadJson: payload() }] });
  close = async () => session.abort();
}
console.log(JSON.stringify({ ready: true }));
start = nowMs();
const sent = await openLoop(rate, warmupMs + durationMs, send);
await close();
exitWith({ sent });
