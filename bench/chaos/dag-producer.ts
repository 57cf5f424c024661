/**
 * The chaos run's second producer: DAG runs started through the daemons' DagService (role `runs`),
 * in the run's own process, so that runs are advancing while the faults hit. Every run is the same
 * definition (CHAOS_DAG): a 5-node chain, a fan-out of four iterations beside it and a join after
 * both, every task node of the chaos engine kind, so the fleet's agents run the nodes as they run
 * the plain items.
 *
 * Runs are released in shares (release(upTo)): the run releases one share before each fault, so
 * each fault finds a run or two in the middle of their chains, and the rest once the schedule is
 * over (releaseAll). Each start carries the idempotency key `chaos-dag-<n>`: a start whose answer
 * was lost to a fault is sent again (to the next daemon) until one answers, and starts no second
 * run. Error answers are counted by code.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import { DagService, DefinitionSchema, NodeKind } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import { createSdkGrpcTransport } from "@aiflow/wire/client";

/** The chain's length and the fan-out's width of every chaos DAG run. */
export const DAG_CHAIN = 5;
export const DAG_FAN_OUT = 4;
/** The idempotency key of the chaos DAG run n (the verdict finds the runs by it). */
export const dagRunKey = (n: number) => `chaos-dag-${n}`;

/**
 * c0 → c1 → … → c4 and fan[0..3] (from the run context's list, after c0), then join after c4 and
 * the fan-out: 5 + 4 + 1 = 10 work items per run, each a node (or an iteration) that must complete
 * exactly once.
 */
export function chaosDag(kind: string) {
  const task = (name: string, dependsOn: string[], extra: { fanOut?: string; payloadJson?: string } = {}) => ({
    name,
    kind: NodeKind.TASK,
    engineKind: kind,
    dependsOn,
    payloadJson: extra.payloadJson ?? `{"node":"${name}","run":"{{ run_id }}"}`,
    fanOut: extra.fanOut ?? "",
  });
  return create(DefinitionSchema, {
    id: "chaos-dag",
    nodes: [
      ...Array.from({ length: DAG_CHAIN }, (_, i) => task(`c${i}`, i === 0 ? [] : [`c${i - 1}`])),
      task("fan", ["c0"], { fanOut: "context.fan", payloadJson: `{"node":"fan","i":"{{ index }}","x":"{{ item }}"}` }),
      task("join", [`c${DAG_CHAIN - 1}`, "fan"]),
    ],
  });
}

/** The work items (node names, iterations as name[i]) every completed chaos DAG run has. */
export const DAG_NODES_PER_RUN = DAG_CHAIN + DAG_FAN_OUT + 1;

export interface DagProducerOptions {
  addresses: readonly string[];
  token: string;
  tenant: string;
  kind: string;
  runs: number;
  /** Stops retrying when aborted (the run is failing or interrupted). */
  signal: AbortSignal;
}

export interface DagProducerFigures {
  /** Runs asked for. */
  runs: number;
  /** Starts answered (each run once). */
  started: number;
  /** Start answers that named an existing run: a retried start whose first answer was lost. */
  existing: number;
  errorsByCode: Record<string, number>;
  /** The first few answers other than UNAVAILABLE (a daemon or database away), with when. */
  unexpected: { at: string; code: string; message: string }[];
}

export class DagProducer {
  readonly figures: DagProducerFigures;
  readonly done: Promise<DagProducerFigures>;
  #released = 0;
  #wake: (() => void) | undefined;
  #finished = false;

  constructor(private readonly o: DagProducerOptions) {
    this.figures = { runs: o.runs, started: 0, existing: 0, errorsByCode: {}, unexpected: [] };
    this.done = this.#produce().finally(() => (this.#finished = true));
  }

  /** Runs still to start (released or not): work is still coming. */
  get producing(): boolean {
    return !this.#finished;
  }

  /** Runs 0..upTo-1 may start. */
  release(upTo: number): void {
    this.#released = Math.max(this.#released, Math.min(upTo, this.o.runs));
    this.#wake?.();
  }

  releaseAll(): void {
    this.release(this.o.runs);
  }

  async #produce(): Promise<DagProducerFigures> {
    const o = this.o;
    const auth: Interceptor = (next) => (req) => {
      req.header.set("authorization", `Bearer ${o.token}`);
      return next(req);
    };
    const targets = o.addresses.map((address) => {
      const session = new Http2SessionManager(`http://${address}`);
      return {
        session,
        client: createClient(DagService, createSdkGrpcTransport({ baseUrl: `http://${address}`, sessionManager: session, interceptors: [auth] })),
      };
    });
    const definition = chaosDag(o.kind);
    const contextJson = JSON.stringify({ fan: Array.from({ length: DAG_FAN_OUT }, (_, i) => i) });
    const f = this.figures;
    let current = 0;
    try {
      for (let n = 0; n < o.runs && !o.signal.aborted; n++) {
        while (n >= this.#released && !o.signal.aborted) await this.#waitForRelease();
        for (;;) {
          try {
            const res = await targets[current]!.client.startRun(
              { tenantKey: o.tenant, source: { case: "definition", value: definition }, contextJson, idempotencyKey: dagRunKey(n) },
              { timeoutMs: 5000, signal: o.signal },
            );
            f.started++;
            if (res.existing) f.existing++;
            break;
          } catch (err) {
            if (o.signal.aborted) throw err;
            const e = ConnectError.from(err);
            const code = Code[e.code];
            f.errorsByCode[code] = (f.errorsByCode[code] ?? 0) + 1;
            if (e.code !== Code.Unavailable && f.unexpected.length < 5) f.unexpected.push({ at: new Date().toISOString(), code, message: e.rawMessage });
            current = (current + 1) % targets.length;
            await new Promise((r) => setTimeout(r, 200));
          }
        }
        // The next run goes to the other daemon: both start runs.
        current = (current + 1) % targets.length;
      }
    } finally {
      for (const t of targets) t.session.abort();
    }
    return f;
  }

  #waitForRelease(): Promise<void> {
    return new Promise((resolve) => {
      const done = () => (this.o.signal.removeEventListener("abort", done), (this.#wake = undefined), resolve());
      this.#wake = done;
      this.o.signal.addEventListener("abort", done, { once: true });
    });
  }
}
