/**
 * Fuzz cases against a running daemon over real HTTP/2, and the properties every answer must have.
 * Used by test/fuzz-server.test.ts (a bounded count, in CI) and bench/fuzz.ts (as many as asked).
 *
 * A case is one request: a path (mostly a unary method of ours), a header block varied in what
 * callers get wrong (content type, grpc-timeout, te, -bin metadata, grpc-encoding, the bearer
 * token) and a body (a message of the method's type, valid or mutated, behind an envelope valid or
 * corrupted, in one DATA frame or many). The properties (`judge`):
 * - an answer comes within the case's deadline and a slack for a loaded machine (no hang);
 * - a gRPC request is answered with a gRPC status (grpc-status, in headers or trailers; a gRPC-Web
 *   one may carry it in the body's trailer frame), or, when it is not a POST of application/grpc
 *   or application/grpc+proto to one of our methods, with the HTTP error status connect-node gives
 *   what it cannot route (404, 405, 415), which gRPC clients map to a code. A stream is reset
 *   without a status only for what breaks HTTP/2's own rules (a content-length that is not the
 *   body's, a path of '*'), which nghttp2 refuses before the daemon sees the stream. A non-gRPC
 *   request gets an HTTP answer in its own protocol;
 * - what must be refused is: a missing or unknown token UNAUTHENTICATED, a token of another role
 *   PERMISSION_DENIED (the gate answers them all on the headers), a grpc-timeout that does not
 *   parse INVALID_ARGUMENT, and on the direct path (the compiled codec reads it) a body that is not
 *   exactly one uncompressed message, or whose message is malformed (./wire-format.ts), anything
 *   but OK;
 * - DEADLINE_EXCEEDED comes no earlier than the deadline given;
 * - no answer is INTERNAL "internal error (ref …)": that is a handler's unexpected exception;
 * - a refused request changes no row (the caller compares `RowDigest`s around each case).
 */
import http2 from "node:http2";
import { performance } from "node:perf_hooks";
import type { DescMethodUnary, DescService } from "@bufbuild/protobuf";
import { AgentService } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { RunDirectoryService, TriggerFiringService } from "@aiflow/wire/gen/aiflow/cluster/v1/runs_pb.js";
import { Health } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import pg from "pg";
import { caseRng, chunked, envelope, fuzzMessage, hex, type Limits, type Rng, type Shape } from "./fuzz.js";
import { answerClass, send, succeeded, type Answer, type H2Client, type Request } from "./fuzz-h2.js";
import { malformation } from "./wire-format.js";

export type Role = "agent" | "engine" | "ops";
export type FuzzTokens = Record<Role, string>;

export interface Target {
  path: string;
  method: DescMethodUnary;
  /** Who may call it; undefined: anyone (health). */
  role: Role | undefined;
  /** A long-poll: it may wait as long as its deadline lets it. */
  waits: boolean;
}

const SERVICES: [DescService, Role | undefined][] = [
  [Health, undefined],
  [AgentService, "agent"],
  [QueueService, "engine"],
  [OpsService, "ops"],
  [RunDirectoryService, "engine"],
  [TriggerFiringService, "engine"],
];

/**
 * Every unary method the daemon serves. Streaming methods are left out: a watch that stays open is
 * what they are for, not a hang.
 */
export const TARGETS: Target[] = SERVICES.flatMap(([service, role]) =>
  service.methods
    .filter((m): m is DescMethodUnary => m.methodKind === "unary")
    .map((method) => ({ path: `/${service.typeName}/${method.name}`, method, role, waits: method.name === "Claim" || method.name === "Wait" })),
);

const GARBAGE_PATHS = [
  "/",
  "/x",
  "//",
  "/aiflow.cluster.v1.QueueService/",
  "/aiflow.cluster.v1.QueueService/Nope",
  "/aiflow.cluster.v1.Nope/Enqueue",
  "/grpc.health.v1.Health/Check?x=1",
  `/${"a".repeat(2000)}/b`,
  "/aiflow.cluster.v1.AgentService/WatchDirectives/x",
  "*",
];

const GRPC_TYPES = ["application/grpc", "application/grpc+proto"];
const OTHER_TYPES = [
  "application/grpc+json",
  "application/grpc-web",
  "application/grpc-web+proto",
  "application/grpc-web-text",
  "application/grpc+xml",
  "application/grpc; charset=utf-8",
  "Application/GRPC",
  "application/proto",
  "application/json",
  "application/connect+proto",
  "application/connect+json",
  "text/plain",
  "",
];
/** grpc-timeout values that parse, in milliseconds. */
const TIMEOUTS: [string, number][] = [
  ["1S", 1000],
  ["2S", 2000],
  ["500m", 500],
  ["300000u", 300],
  ["90000000n", 90],
  ["1m", 1],
  ["0m", 0],
];
/** Ones that parse to far longer than any case runs: only for methods that do not wait. */
const LONG_TIMEOUTS: [string, number][] = [
  ["1H", 3_600_000],
  ["99999999H", 99_999_999 * 3_600_000],
  ["30000000M", 30_000_000 * 60_000],
];
const BAD_TIMEOUTS = ["soon", "-1S", "1", "S", "123456789S", "1X", "1.5S", "1s", "+1S", "0x10S", "١S", "1S 1S"];
const ENCODINGS = ["identity", "gzip", "deflate", "br", "snappy", "x-nope", "gzip, identity", "IDENTITY"];
const BIN_VALUES = () => [Buffer.from("fuzz\u0000\u00ff").toString("base64"), "AAEC", "AAE", "!!!!", "====", "a=b=", "", "%%%", "A".repeat(5000)];

/** Values our handlers accept, by field name: a served tenant, a known engine kind, JSON that parses. */
const PLAUSIBLE: Record<string, readonly string[]> = {
  tenant_key: ["default"],
  tenants: ["default"],
  engine_kind: ["dag"],
  engine_kinds: ["dag"],
  name: ["fuzz-agent-1", "fuzz-agent-2"],
  agent_name: ["fuzz-agent-1"],
  agent_version: ["1.0.0"],
  payload_json: ['{"a":1}', ""],
  result_json: ['{"ok":true}', ""],
  payload: ['{"a":1}'],
  run_id: ["run-1"],
  task_id: ["task-1"],
  task_name: ["step"],
  idempotency_key: ["key-1", "key-2"],
  affinity_key: ["aff-1"],
  engine_id: ["fuzz-engine"],
  reason: ["fuzz"],
  trigger_name: ["hook"],
};

/**
 * Messages our handlers would accept more often than not: every string a value of its name in
 * PLAUSIBLE (or a bare identifier), numbers small and positive, enums named and not zero, few
 * fields unset. A third of the cases get them; the rest get random values of every field's type.
 */
const PLAUSIBLE_SHAPE: Shape = {
  unset: 0.1,
  hint(f, rng) {
    if (f.fieldKind === "enum" || (f.fieldKind === "list" && f.listKind === "enum")) {
      const named = f.enum!.values.filter((v) => v.number !== 0);
      return named.length > 0 ? rng.pick(named).number : undefined;
    }
    switch (f.scalar) {
      case 9:
        return rng.pick(PLAUSIBLE[f.name] ?? ["a1", "01J00000000000000000000000"]);
      case 5:
      case 13:
      case 17:
      case 7:
      case 15:
        return rng.range(1, 10);
      case 3:
      case 4:
      case 18:
      case 6:
      case 16:
        return BigInt(rng.range(1, 10));
      default:
        return undefined;
    }
  },
};

/** What the daemon must do with a case, as far as its headers and bytes decide it. */
export interface Expect {
  /** Anything but OK. */
  refuse?: string;
  /** Exactly this code (the gate's and the timeout parser's refusals are certain). */
  code?: number;
  /** The request breaks HTTP/2's own rules: nghttp2 may reset it before the daemon sees it. */
  h2Violation?: string;
  /** grpc-timeout as given, in ms (DEADLINE_EXCEEDED must not come sooner). */
  timeoutMs?: number;
  /** A POST of a gRPC content type to one of our methods: it must be answered with grpc-status. */
  wellFormed?: boolean;
}

export interface RequestCase extends Request {
  seed: number;
  index: number;
  target: Target | undefined;
  /** What was done to the message and its envelope (for the report). */
  mutations: string[];
  expect: Expect;
}

/** How long past its deadline an answer may come on a loaded machine before it is a hang. */
export const HANG_SLACK_MS = 5000;

const code = { ok: 0, invalidArgument: 3, deadlineExceeded: 4, permissionDenied: 7, unauthenticated: 16 } as const;

/** The gate's decision on an authorization header (src/server/auth.ts): the code it refuses with, or undefined. */
function authRefusal(header: string | undefined, role: Role, tokens: FuzzTokens): number | undefined {
  const m = header === undefined ? null : /^Bearer\s+(\S+)$/i.exec(header);
  if (!m) return code.unauthenticated;
  const holder = (Object.keys(tokens) as Role[]).find((r) => tokens[r] === m[1]);
  if (!holder) return code.unauthenticated;
  return holder === role ? undefined : code.permissionDenied;
}

function authorization(rng: Rng, role: Role | undefined, tokens: FuzzTokens): string | undefined {
  const own = tokens[role ?? rng.pick(["agent", "engine", "ops"] as const)];
  const r = rng.float();
  if (r < 0.8) return `Bearer ${own}`;
  if (r < 0.85) return `Bearer ${tokens[rng.pick(["agent", "engine", "ops"] as const)]}`;
  if (r < 0.9) return undefined;
  return rng.pick([
    `bearer ${own}`,
    `Bearer\t${own}`,
    own,
    "Bearer",
    "Basic YTpi",
    `Bearer nope-${rng.u32()}`,
    `Bearer ${own} x`,
    `Bearer ${"t".repeat(3000)}`,
  ]);
}

/**
 * The one message of a gRPC body as the protocol defines it: "none" (no message), "bad" (cut short,
 * compressed without an encoding, or more than one), "flags" (flag bits gRPC does not define), or the message.
 */
function oneMessage(body: Buffer): Uint8Array | "none" | "bad" | "flags" {
  if (body.length === 0) return "none";
  if (body.length < 5 || (body[0]! & 1) === 1 || body.length !== 5 + body.readUInt32BE(1)) return "bad";
  return body[0] === 0 ? body.subarray(5) : "flags";
}

/** Case `index` of run `seed`. */
export function requestCase(seed: number, index: number, tokens: FuzzTokens, limits: Limits): RequestCase {
  const rng = caseRng(seed, index);
  const target = rng.chance(0.95) ? rng.pick(TARGETS) : undefined;
  const headers: http2.OutgoingHttpHeaders = {
    ":method": rng.chance(0.97) ? "POST" : rng.pick(["GET", "PUT", "DELETE", "OPTIONS"]),
    ":path": target?.path ?? rng.pick(GARBAGE_PATHS),
  };
  const contentType = rng.chance(0.85) ? rng.pick(GRPC_TYPES) : rng.chance(0.9) ? rng.pick(OTHER_TYPES) : undefined;
  if (contentType !== undefined) headers["content-type"] = contentType;
  // te is trailers or absent: Node's client refuses to send any other value (a connection-specific
  // header), and nghttp2 would reset such a stream before the daemon saw it.
  if (rng.chance(0.95)) headers.te = "trailers";
  const expect: Expect = {};
  let timeoutMs: number | undefined;
  let badTimeout = false;
  const t = rng.float();
  if (t < 0.7 || target?.waits) {
    if (target?.waits && t >= 0.85) {
      headers["grpc-timeout"] = rng.pick(BAD_TIMEOUTS);
      badTimeout = true;
    } else [headers["grpc-timeout"], timeoutMs] = rng.pick(TIMEOUTS);
  } else if (t < 0.8) [headers["grpc-timeout"], timeoutMs] = rng.pick(LONG_TIMEOUTS);
  else if (t < 0.9) {
    headers["grpc-timeout"] = rng.pick(BAD_TIMEOUTS);
    badTimeout = true;
  }
  expect.timeoutMs = timeoutMs;
  const auth = rng.chance(target?.role ? 1 : 0.2) ? authorization(rng, target?.role, tokens) : undefined;
  if (auth !== undefined) headers.authorization = auth;
  const encoding = rng.chance(0.1) ? rng.pick(ENCODINGS) : undefined;
  if (encoding !== undefined) headers["grpc-encoding"] = encoding;
  if (rng.chance(0.05)) headers["grpc-accept-encoding"] = rng.pick(ENCODINGS);
  if (rng.chance(0.15)) headers[rng.pick(["x-fuzz-bin", "grpc-trace-bin", "grpc-tags-bin", "x-b-bin"])] = rng.pick(BIN_VALUES());
  if (rng.chance(0.05))
    headers[rng.pick(["grpc-status", "grpc-message", "user-agent", "x-a", "grpc-previous-rpc-attempts"])] = rng.pick([
      "0",
      "%zz",
      "x".repeat(4000),
      "\u00e9",
      "13",
    ]);

  const message = target
    ? fuzzMessage(target.method.input, rng, limits, rng.chance(0.35) ? PLAUSIBLE_SHAPE : undefined)
    : { bytes: rng.bytes(rng.int(64)), applied: ["randomBytes"] };
  const env = envelope(rng, message.bytes);
  const chunks = chunked(rng, env.body);
  if (rng.chance(0.03)) {
    const declared = env.body.length + rng.pick([-1, 1, 100]);
    headers["content-length"] = String(Math.max(0, declared));
    if (Math.max(0, declared) !== env.body.length) expect.h2Violation = "content-length is not the body's length";
  }

  const grpc = contentType !== undefined && GRPC_TYPES.includes(contentType);
  expect.wellFormed = grpc && target !== undefined && headers[":method"] === "POST";
  // RFC 9113 §8.3.1: only OPTIONS may ask for "*".
  if (headers[":path"] === "*" && headers[":method"] !== "OPTIONS") expect.h2Violation = "':path' is '*' on a POST";
  const direct = grpc && headers[":method"] === "POST" && (encoding === undefined || encoding === "identity");
  const refusedAuth = target?.role ? authRefusal(auth, target.role, tokens) : undefined;
  if (refusedAuth !== undefined) {
    expect.refuse = "the gate refuses its token";
    // The gate's refusal of a gRPC caller is a gRPC status with the code; of others, their protocol's.
    if (grpc) expect.code = refusedAuth;
  } else if (target && direct) {
    const one = oneMessage(env.body);
    if (badTimeout) {
      expect.refuse = "its grpc-timeout does not parse";
      expect.code = code.invalidArgument;
    } else if (one === "none" || one === "bad") expect.refuse = `its body is ${one === "none" ? "empty" : "not exactly one uncompressed message"}`;
    else if (one !== "flags") {
      const bad = malformation(target.method.input, one);
      if (bad) expect.refuse = `its message is malformed (${bad})`;
    }
  }
  const waitMs = Math.min(timeoutMs ?? 0, 5000) + HANG_SLACK_MS;
  return {
    seed,
    index,
    headers,
    chunks,
    target,
    mutations: [...message.applied, `envelope: ${env.kind}`, ...(chunks.length > 1 ? [`${chunks.length} DATA writes`] : [])],
    expect,
    waitMs,
  };
}

/** The first property the answer breaks, or undefined. */
export function judge(c: RequestCase, a: Answer): string | undefined {
  const { expect } = c;
  if (a.kind === "unsendable") return undefined;
  if (a.kind === "hang") return `no answer within ${c.waitMs}ms`;
  const grpc = String(c.headers["content-type"] ?? "").startsWith("application/grpc");
  if (a.kind !== "response")
    return expect.h2Violation ? undefined : `the stream ended without an answer (${a.kind}, RST code ${a.rstCode ?? "none"}, ${a.error ?? "no error"})`;
  if (a.rstCode !== undefined && a.rstCode !== http2.constants.NGHTTP2_NO_ERROR && a.rstCode !== http2.constants.NGHTTP2_CANCEL && !expect.h2Violation)
    return `answered, then reset with code ${a.rstCode}`;
  if (!grpc) {
    // Connect's refusals: an HTTP error status (unary), or an end-stream message with an error.
    if (expect.refuse && a.httpStatus! < 300 && !a.body.includes('"error"')) return `answered HTTP ${a.httpStatus} without an error, but ${expect.refuse}`;
    return undefined;
  }
  if (a.grpcStatus === undefined) {
    if (expect.h2Violation) return undefined;
    // connect-node answers what it cannot route (another path, method or content subtype) with an
    // HTTP status, which gRPC clients map to a code (404 UNIMPLEMENTED, …): a status, if not the
    // trailers-only one. A well-formed call to one of our methods must get grpc-status itself.
    if (!expect.wellFormed && a.httpStatus! >= 400) return undefined;
    return `a gRPC request answered without a grpc-status (HTTP ${a.httpStatus}, ${a.contentType ?? "no content type"})`;
  }
  if (!/^\d+$/.test(a.grpcStatus) || Number(a.grpcStatus) > 16) return `grpc-status '${a.grpcStatus}' is not a status code`;
  const status = Number(a.grpcStatus);
  if (expect.refuse && status === code.ok) return `answered OK, but ${expect.refuse}`;
  if (expect.code !== undefined && status !== expect.code) return `answered ${status} (${a.grpcMessage}), expected ${expect.code} as ${expect.refuse}`;
  if (status === code.deadlineExceeded && expect.timeoutMs !== undefined && a.ms < Math.min(expect.timeoutMs, 60_000) - 50)
    return `DEADLINE_EXCEEDED after ${Math.round(a.ms)}ms of a ${expect.timeoutMs}ms deadline (${a.grpcMessage})`;
  if (/^internal error \(ref /.test(a.grpcMessage ?? "")) return `a handler failed unexpectedly: ${a.grpcMessage}`;
  return undefined;
}

/** The case as a report shows it: enough to see what was sent without replaying it. */
export function describeCase(c: RequestCase, a?: Answer): Record<string, unknown> {
  return {
    seed: c.seed,
    case: c.index,
    headers: c.headers,
    mutations: c.mutations,
    body: hex(Buffer.concat(c.chunks)),
    ...(a ? { answer: { ...a, body: hex(a.body, 128), ms: Math.round(a.ms) } } : {}),
  };
}

/**
 * The rows a caller can change, as one digest per table: the daemon's own bookkeeping
 * (aiflow_engine's keepalive, the migrations) is left out.
 */
export class RowDigest {
  static readonly TABLES = ["agent", "work_item", "affinity_binding", "engine_run", "trigger_firing"];
  readonly #client: pg.Client;
  readonly #query: string;

  private constructor(client: pg.Client, schema: string, prefix: string) {
    this.#client = client;
    const q = (t: string) => `"${schema.replace(/"/g, '""')}"."${(prefix + t).replace(/"/g, '""')}"`;
    this.#query = `SELECT ${RowDigest.TABLES.map((t) => `(SELECT count(*) || ':' || md5(coalesce(string_agg(r::text, ',' ORDER BY r::text), '')) FROM ${q(t)} r) AS "${t}"`).join(", ")}`;
  }

  static async open(url: string, schema: string, prefix = "aiflow_"): Promise<RowDigest> {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    return new RowDigest(client, schema, prefix);
  }

  async take(): Promise<Record<string, string>> {
    return (await this.#client.query<Record<string, string>>(this.#query)).rows[0]!;
  }

  close(): Promise<void> {
    return this.#client.end();
  }
}

export interface Failure {
  seed: number;
  case: number;
  why: string;
  detail: Record<string, unknown>;
}

export interface RunReport {
  cases: number;
  ms: number;
  /** Answers by class ("grpc 3", "http 415", "reset 1", "unsendable"…). */
  answers: Record<string, number>;
  failures: Failure[];
}

export interface RunOptions {
  seed: number;
  /** The first case's index (a replay of one case: first = its index, count = 1). */
  first?: number;
  count: number;
  client: H2Client;
  tokens: FuzzTokens;
  limits: Limits;
  /** Checked around every case that is not answered OK: a refused request changes no row. */
  rows?: RowDigest;
  /** Told of each failure as it happens. */
  onFailure?: (f: Failure) => void;
  /** Checked before each case: true ends the run there (the daemon under test is gone). */
  stop?: () => boolean;
}

/** Runs the cases one after another (so a row change is the case's own), checking every property. */
export async function runCases(opts: RunOptions): Promise<RunReport> {
  const t0 = performance.now();
  const answers: Record<string, number> = {};
  const failures: Failure[] = [];
  let before = opts.rows ? await opts.rows.take() : undefined;
  const first = opts.first ?? 0;
  let i = first;
  for (; i < first + opts.count && !opts.stop?.(); i++) {
    const c = requestCase(opts.seed, i, opts.tokens, opts.limits);
    const a = await send(opts.client, c);
    const cls = answerClass(a);
    answers[cls] = (answers[cls] ?? 0) + 1;
    let why = judge(c, a);
    if (opts.rows && before) {
      const after = await opts.rows.take();
      const changed = RowDigest.TABLES.filter((t) => after[t] !== before![t]);
      if (changed.length > 0 && !succeeded(a) && !why) why = `rows of ${changed.join(", ")} changed, but the answer was ${cls} (${a.grpcMessage ?? ""})`;
      before = after;
    }
    if (!why) continue;
    const f: Failure = { seed: opts.seed, case: i, why, detail: describeCase(c, a) };
    failures.push(f);
    opts.onFailure?.(f);
  }
  return { cases: i - first, ms: performance.now() - t0, answers, failures };
}

export { answerClass, H2Client, send, type Answer } from "./fuzz-h2.js";
