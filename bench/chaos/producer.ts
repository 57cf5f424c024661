/**
 * The chaos run's producer, in the run's own process (it is never a fault's target). It enqueues
 * items 0..N-1 in small batches at a steady rate, each with the idempotency key `chaos-<n>`, so a
 * batch whose answer was lost to a fault is simply sent again (to the next daemon) until one
 * answers: the key makes the retry enqueue nothing twice. Error answers are counted by code.
 * Once `unpaced` aborts (the fault schedule is over), the rest is enqueued without waiting for its turn.
 */
import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { createSdkGrpcTransport } from "@aiflow/wire/client";

export interface ProducerOptions {
  addresses: readonly string[];
  token: string;
  tenant: string;
  kind: string;
  items: number;
  ratePerSec: number;
  batch: number;
  /** Stops retrying when aborted (the run is failing or interrupted). */
  signal: AbortSignal;
  /** When aborted, the pace is dropped: every batch still to come is sent at once, one after another. */
  unpaced?: AbortSignal;
}

export interface ProducerFigures {
  enqueued: number;
  /** Enqueue answers that named an existing item: a retried batch whose first answer was lost. */
  existing: number;
  errorsByCode: Record<string, number>;
  /** The first few answers other than UNAVAILABLE (the expected answer of a daemon or database away), with when. */
  unexpected: { at: string; code: string; message: string }[];
}

export async function produce(o: ProducerOptions): Promise<ProducerFigures> {
  const auth: Interceptor = (next) => (req) => {
    req.header.set("authorization", `Bearer ${o.token}`);
    return next(req);
  };
  const targets = o.addresses.map((address) => {
    const session = new Http2SessionManager(`http://${address}`);
    return {
      session,
      client: createClient(QueueService, createSdkGrpcTransport({ baseUrl: `http://${address}`, sessionManager: session, interceptors: [auth] })),
    };
  });
  const figures: ProducerFigures = { enqueued: 0, existing: 0, errorsByCode: {}, unexpected: [] };
  const started = Date.now();
  let current = 0;
  try {
    for (let first = 0; first < o.items && !o.signal.aborted; first += o.batch) {
      const due = started + (first / o.ratePerSec) * 1000;
      if (due > Date.now() && !o.unpaced?.aborted) await waitUntil(due, o.unpaced);
      const n = Math.min(o.batch, o.items - first);
      const items = Array.from({ length: n }, (_, k) => ({
        engineKind: o.kind,
        idempotencyKey: `chaos-${first + k}`,
        payloadJson: JSON.stringify({ n: first + k }),
      }));
      for (;;) {
        try {
          const res = await targets[current]!.client.enqueue({ tenantKey: o.tenant, items }, { timeoutMs: 5000, signal: o.signal });
          figures.enqueued += n;
          figures.existing += res.results.filter((r) => r.existing).length;
          break;
        } catch (err) {
          if (o.signal.aborted) throw err;
          const e = ConnectError.from(err);
          const code = Code[e.code];
          figures.errorsByCode[code] = (figures.errorsByCode[code] ?? 0) + 1;
          if (e.code !== Code.Unavailable && figures.unexpected.length < 5)
            figures.unexpected.push({ at: new Date().toISOString(), code, message: e.rawMessage });
          current = (current + 1) % targets.length;
          await new Promise((r) => setTimeout(r, 200));
        }
      }
    }
  } finally {
    for (const t of targets) t.session.abort();
  }
  return figures;
}

/** Resolves at `due`, or earlier when `signal` aborts. */
function waitUntil(due: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    const done = () => (clearTimeout(timer), signal?.removeEventListener("abort", done), resolve());
    const timer = setTimeout(done, due - Date.now());
    signal?.addEventListener("abort", done, { once: true });
  });
}
