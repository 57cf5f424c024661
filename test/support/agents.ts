/**
 * Helpers for the agent tests: a stock @grpc/grpc-js AgentService client, a WatchDirectives stream
 * that is read by awaiting its events, a logger that keeps its lines in memory, and raw row readers.
 */
import { pino } from "pino";
import { LOG_OPTIONS, type Logger } from "../../src/log.js";
import { TOKENS } from "./daemon.js";
import type { TestDb } from "./db.js";
import { grpc, loadService, metadata, unary } from "./grpc-js.js";

export const ULID = /^[0-9A-HJKMNP-TV-Z]{26}$/;

const AgentServiceClient = () => loadService("aiflow/cluster/v1/agent.proto", "aiflow.cluster.v1.AgentService");

export function agentClient(address: string): grpc.Client {
  const Client = AgentServiceClient();
  return new Client(address, grpc.credentials.createInsecure());
}

/** A RegisterRequest as proto-loader takes it (camelCase, enums by name). */
export function registerRequest(name: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    name,
    httpAddress: `http://${name}.example:8080`,
    grpcAddress: `${name}.example:9090`,
    infraAddress: `${name}.infra:22`,
    agentVersion: "1.2.3",
    binaryPath: "/opt/agent/bin/agent",
    agentType: "AGENT_TYPE_REMOTE",
    metadata: { tags: { zone: "eu-1", gpu: "yes" }, slots: 4, tenants: ["t1"], engineKinds: ["dag"], models: ["llama-3"] },
    ...extra,
  };
}

export interface RegisterReply {
  id: string;
  status: string;
  created: boolean;
  heartbeatInterval: { seconds: string; nanos: number } | null;
  leaseTtl: { seconds: string; nanos: number } | null;
}

export interface DirectiveWire {
  kind?: "status" | "cancel";
  status?: { status: string; reason: string; drainDeadline: { seconds: string; nanos: number } | null };
  cancel?: { workItemId: string; leaseToken: string; reason: string };
}

export interface HeartbeatReply {
  status: string;
  directives: DirectiveWire[];
}

/** Calls a unary AgentService method with the agent token unless told otherwise. */
export function call<Res = Record<string, unknown>>(client: grpc.Client, method: string, req: object, token: string | null = TOKENS.agent) {
  return unary<Res>(client, method, req, token ?? undefined);
}

/** Calls and fails the test with the gRPC error when the call does not succeed. */
export async function ok<Res = Record<string, unknown>>(client: grpc.Client, method: string, req: object, token: string | null = TOKENS.agent): Promise<Res> {
  const [err, res] = await call<Res>(client, method, req, token);
  if (err) throw new Error(`${method} failed: ${grpc.status[err.code]} ${err.details}`);
  return res!;
}

/**
 * A WatchDirectives server stream. `next()` resolves with the next message as it arrives (or
 * rejects when the stream fails or ends, or after a generous timeout that only a broken daemon hits).
 */
export class DirectiveStream {
  readonly #queue: DirectiveWire[] = [];
  #waiter: { resolve: (d: DirectiveWire) => void; reject: (e: Error) => void } | undefined;
  #ended: Error | undefined;
  readonly received: DirectiveWire[] = [];

  constructor(private readonly call: grpc.ClientReadableStream<{ directive: DirectiveWire }>) {
    call.on("data", (m: { directive: DirectiveWire }) => {
      this.received.push(m.directive);
      if (this.#waiter) {
        const w = this.#waiter;
        this.#waiter = undefined;
        w.resolve(m.directive);
      } else this.#queue.push(m.directive);
    });
    const end = (e: Error) => {
      this.#ended ??= e;
      this.#waiter?.reject(e);
      this.#waiter = undefined;
    };
    call.on("error", (e: grpc.ServiceError) => end(Object.assign(new Error(`stream failed: ${grpc.status[e.code]} ${e.details}`), { code: e.code })));
    call.on("end", () => end(new Error("stream ended")));
  }

  next(timeoutMs = 10_000): Promise<DirectiveWire> {
    const queued = this.#queue.shift();
    if (queued) return Promise.resolve(queued);
    if (this.#ended) return Promise.reject(this.#ended);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiter = undefined;
        reject(new Error(`no directive within ${timeoutMs}ms (received so far: ${JSON.stringify(this.received)})`));
      }, timeoutMs);
      this.#waiter = {
        resolve: (d) => {
          clearTimeout(timer);
          resolve(d);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      };
    });
  }

  close(): void {
    this.call.cancel();
  }
}

export function watchDirectives(client: grpc.Client, name: string, token: string = TOKENS.agent): DirectiveStream {
  const fn = (client as unknown as { watchDirectives(req: object, md: grpc.Metadata): grpc.ClientReadableStream<{ directive: DirectiveWire }> })
    .watchDirectives;
  const stream = new DirectiveStream(fn.call(client, { name }, metadata(token)));
  return stream;
}

/** A logger whose JSON lines are kept in memory, to assert on (audit records, errors). */
export interface CapturedLog {
  log: Logger;
  /** Every line, raw. */
  raw(): string[];
  /** Every line, parsed. */
  lines(): Record<string, unknown>[];
  /** The audit records (stream "audit"), raw and parsed. */
  audit(): { raw: string; rec: Record<string, unknown> }[];
}

export function captureLog(level = "info"): CapturedLog {
  const chunks: string[] = [];
  const log = pino({ ...LOG_OPTIONS, level }, { write: (s: string) => void chunks.push(s) });
  const raw = () => chunks.flatMap((c) => c.split("\n")).filter((l) => l.trim().length > 0);
  return {
    log,
    raw,
    lines: () => raw().map((l) => JSON.parse(l) as Record<string, unknown>),
    audit: () =>
      raw()
        .map((l) => ({ raw: l, rec: JSON.parse(l) as Record<string, unknown> }))
        .filter((x) => x.rec.stream === "audit"),
  };
}

export interface AgentDbRow {
  id: string;
  name: string;
  http_address: string | null;
  grpc_address: string | null;
  infra_address: string | null;
  agentversion: string | null;
  binarypath: string | null;
  agenttype: string | null;
  status: string | null;
  metrics: Record<string, unknown> | null;
  metadata: Record<string, unknown> | null;
  createdby: string;
  createdon: Date;
  updatedby: string | null;
  updatedon: Date | null;
  deletedby: string | null;
  deletedon: Date | null;
}

/** The agent row as Postgres has it, read on a connection of its own. */
export async function agentRow(db: TestDb, name: string): Promise<AgentDbRow | undefined> {
  const rows = await db.raw<AgentDbRow & Record<string, unknown>>(`SELECT * FROM ${db.tables.qualified("agent")} WHERE name = $1`, [name]);
  return rows[0];
}

export async function agentRows(db: TestDb, namePrefix = ""): Promise<AgentDbRow[]> {
  return db.raw<AgentDbRow & Record<string, unknown>>(`SELECT * FROM ${db.tables.qualified("agent")} WHERE name LIKE $1 ORDER BY name`, [`${namePrefix}%`]);
}
