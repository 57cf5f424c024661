/**
 * The SDK's client transport (wire/src/client/transport.ts) against a hostile HTTP/2 server whose
 * every answer is fuzzed: the reply message mutated, its envelope corrupted, its status garbled,
 * its headers or HTTP status wrong, the stream reset, the connection dropped or sent GOAWAY, or
 * nothing at all. Used by test/fuzz-codec.test.ts and bench/fuzz.ts --target client.
 *
 * Each case runs twice, on the SDK transport and on connect-node's gRPC transport, whose semantics
 * the SDK's keeps. The properties (`checkCall`):
 * - every call settles within its deadline and a slack (no hang), with its reply or a ConnectError
 *   with a code;
 * - a well-formed reply (status 200, a gRPC content type, one uncompressed message the decoder reads,
 *   grpc-status 0) is the reply, decoded as protobuf-es decodes it; anything else fails;
 * - a grpc-status of 1–16 in the trailers (or headers) is the call's code; silence past the
 *   deadline is DEADLINE_EXCEEDED;
 * - grpc-status decides, whatever grpc-status-details-bin holds, and a grpc-message that is not
 *   percent-encoding is taken as it is (as the gRPC spec says);
 * - both transports agree on success or failure (but for mutated messages, which protobuf-es reads
 *   more leniently than the codec, and for the statuses connect-node reads otherwise than the spec:
 *   it takes the status from grpc-status-details-bin, and throws on a bad grpc-message), and on the
 *   code where the case names one.
 * Where connect's semantics, which the SDK keeps, decide otherwise than the above (any
 * application/grpc+ subtype taken as binary), a case says neither success nor failure.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { performance } from "node:perf_hooks";
import { create, fromBinary, type DescMessage, type DescMethodUnary } from "@bufbuild/protobuf";
import { Code, ConnectError, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { compileCodec } from "@aiflow/wire/codec";
import { createSdkGrpcTransport } from "@aiflow/wire/client";
import { caseRng, envelope, fuzzMessage, hex, validMessage, type Limits, type Rng } from "./fuzz.js";
import { same } from "./fuzz-codec.js";
import { TARGETS } from "./fuzz-daemon.js";
import { malformation } from "./wire-format.js";

/** The largest reply the clients accept (so a case can send one larger). */
export const READ_MAX = 16 * 1024;
/** A call's deadline when the server answers, and when it is silent (the case waits for it). */
const DEADLINE_MS = 5000;
const SILENT_DEADLINE_MS = 100;
const SLACK_MS = 5000;

const GRPC = { ":status": 200, "content-type": "application/grpc" };
const HTTP_STATUSES = [204, 302, 400, 401, 403, 404, 415, 429, 500, 502, 503, 504];
const CONTENT_TYPES = ["application/grpc+proto", "application/grpc+json", "application/grpc-web", "application/json", "text/html", "application/grpc; x=1"];
const STATUSES = ["abc", "", "-1", "17", "99", "0 ", " 1", "1.5", "00", "4294967296"];
const MESSAGES = ["a%20b", "x".repeat(5000), "\u00e9\u00ff", "%C3%A9"];
/** grpc-message values that are not percent-encoding, which gRPC says a client must still take. */
export const BAD_PERCENT = ["%zz", "%", "%E2%82"];
const RST_CODES = [0, 1, 2, 3, 5, 7, 8, 10, 11, 12, 13];

const MUTATED = "a mutated reply";

/** What the server does with one stream; it draws nothing at random (both transports must see the same answer). */
type Serve = (stream: http2.ServerHttp2Stream) => void;

export interface ReplyCase {
  seed: number;
  index: number;
  method: DescMethodUnary;
  serve: Serve;
  /** What the server does, for the report. */
  plan: string[];
  /** The reply as the server's message bytes, when it sends one message. */
  reply?: Uint8Array;
  /** The call must succeed with `reply` decoded; false: it must fail; undefined: either. */
  ok?: boolean;
  /** The call's code, where the answer decides it. */
  code?: Code;
  deadlineMs: number;
  /** Why connect-node's transport is no reference for this case: it reads the status otherwise than the spec. */
  referenceDiffers?: string;
}

/** Every unary method of ours: the SDK decodes most replies with the compiled codec, the rest through connect-node's transport. */
const METHODS = TARGETS.map((t) => t.method);

/** Whether the client's decoder reads these bytes: the codec where the output has one, else protobuf-es. */
function decoderReads(desc: DescMessage, bytes: Uint8Array): boolean {
  if (compileCodec(desc)) return malformation(desc, bytes) === undefined;
  try {
    fromBinary(desc, bytes);
    return true;
  } catch {
    return false;
  }
}

function respondWith(stream: http2.ServerHttp2Stream, headers: http2.OutgoingHttpHeaders, body: Buffer, trailers: http2.OutgoingHttpHeaders | undefined): void {
  if (trailers) stream.once("wantTrailers", () => stream.sendTrailers(trailers));
  stream.respond(headers, { waitForTrailers: trailers !== undefined });
  stream.end(body);
}

export function replyCase(seed: number, index: number, limits: Limits): ReplyCase {
  const rng = caseRng(seed, index);
  const method = rng.pick(METHODS);
  const out = method.output;
  const base = { seed, index, method, deadlineMs: DEADLINE_MS };
  const valid = validMessage(out, rng);
  const framed = (m: Uint8Array) => {
    const b = Buffer.alloc(5 + m.byteLength);
    b.writeUInt32BE(m.byteLength, 1);
    b.set(m, 5);
    return b;
  };
  const ok0 = { "grpc-status": "0" };
  const r = rng.float();
  if (r < 0.15) {
    return { ...base, plan: ["a valid reply"], reply: valid, ok: true, serve: (s) => respondWith(s, GRPC, framed(valid), ok0) };
  }
  if (r < 0.4) {
    const { bytes, applied } = fuzzMessage(out, rng, limits);
    const reads = decoderReads(out, bytes) && bytes.byteLength <= READ_MAX;
    return {
      ...base,
      plan: [MUTATED, ...applied],
      reply: bytes,
      ok: reads,
      code: reads ? undefined : bytes.byteLength > READ_MAX ? Code.ResourceExhausted : undefined,
      serve: (s) => respondWith(s, GRPC, framed(bytes), ok0),
    };
  }
  if (r < 0.55) {
    const env = envelope(rng, valid);
    // Flag bits gRPC does not define, past the compressed one: neither client looks at them.
    const flagsOnly = env.kind === "other flag bits" && (env.body[0]! & 1) === 0;
    return {
      ...base,
      plan: [`envelope: ${env.kind}`],
      reply: valid,
      ok: env.valid ? true : flagsOnly ? undefined : false,
      serve: (s) => respondWith(s, GRPC, env.body, ok0),
    };
  }
  if (r < 0.7) return statusCase(rng, base, framed(valid));
  if (r < 0.8) {
    const status = rng.pick(HTTP_STATUSES);
    const ct = rng.chance(0.5) ? { "content-type": rng.pick(CONTENT_TYPES) } : {};
    const body = rng.chance(0.5) ? framed(valid) : Buffer.from("<html>no</html>");
    const withStatus = rng.chance(0.3) ? { "grpc-status": String(rng.range(1, 16)) } : {};
    const trailers = rng.chance(0.5) ? ok0 : undefined;
    return {
      ...base,
      plan: [`HTTP ${status}`, JSON.stringify(ct), JSON.stringify(withStatus)],
      ok: false,
      serve: (s) => respondWith(s, { ":status": status, ...ct, ...withStatus }, status === 204 ? Buffer.alloc(0) : body, trailers),
    };
  }
  if (r < 0.88) {
    const ct = rng.pick(CONTENT_TYPES);
    // connect's response check takes any application/grpc+ subtype (or parameters) and the
    // binary decoder reads the message; the others are not gRPC.
    const ok = ct === "application/grpc+proto" ? true : ct.startsWith("application/grpc+") || ct.startsWith("application/grpc;") ? undefined : false;
    return {
      ...base,
      plan: [`content-type ${ct}`],
      reply: valid,
      ok,
      serve: (s) => respondWith(s, { ":status": 200, "content-type": ct }, framed(valid), ok0),
    };
  }
  return brokenCase(rng, base, framed(valid));
}

type Base = Pick<ReplyCase, "seed" | "index" | "method" | "deadlineMs" | "referenceDiffers">;

/** A reply whose status is what is wrong (or an error status sent the right way). */
function statusCase(rng: Rng, base: Base, body: Buffer): ReplyCase {
  const code = rng.range(1, 16);
  const text = rng.chance(0.3) ? rng.pick(rng.chance(0.5) ? MESSAGES : BAD_PERCENT) : undefined;
  const message = text === undefined ? {} : { "grpc-message": text };
  const details = rng.chance(0.2) ? { "grpc-status-details-bin": rng.pick(["!!!", "AAEC", "", "CAES"]) } : {};
  // connect-node reads the status from grpc-status-details-bin when there is one, before grpc-status:
  // details that do not decode fail the call DATA_LOSS, status 0 or not, and details of code 0 (an
  // empty value) make an error a success. The SDK's code and success are grpc-status's.
  const garbled = "grpc-status-details-bin" in details;
  const plan = [
    ...(text === undefined ? [] : [`grpc-message ${JSON.stringify(text.slice(0, 20))}`]),
    ...(garbled ? [`details ${JSON.stringify(details["grpc-status-details-bin"])}`] : []),
  ];
  const where = rng.int(4);
  const badPercent = text !== undefined && BAD_PERCENT.includes(text);
  if (garbled || badPercent)
    base = { ...base, referenceDiffers: garbled ? "grpc-status-details-bin decides its status" : "it throws on a grpc-message that is not percent-encoding" };
  if (where === 0) {
    // Trailers-only: the status in the one HEADERS frame.
    return {
      ...base,
      plan: ["trailers-only", String(code), ...plan],
      ok: false,
      code,
      serve: (s) => s.respond({ ...GRPC, "grpc-status": String(code), ...message, ...details }, { endStream: true }),
    };
  }
  if (where === 1) {
    const sent = rng.chance(0.5) ? body : Buffer.alloc(0);
    return {
      ...base,
      plan: ["an error status after the reply", String(code), ...plan],
      ok: false,
      code,
      serve: (s) => respondWith(s, GRPC, sent, { "grpc-status": String(code), ...message, ...details }),
    };
  }
  if (where === 2) {
    const garbage = rng.pick(STATUSES);
    return {
      ...base,
      plan: ["a status that is no code", JSON.stringify(garbage), ...plan],
      ok: garbage === "00" ? undefined : false,
      serve: (s) => respondWith(s, GRPC, body, { "grpc-status": garbage, ...message }),
    };
  }
  return { ...base, plan: ["status 0", ...plan], ok: true, serve: (s) => respondWith(s, GRPC, body, { "grpc-status": "0", ...message, ...details }) };
}

/** A stream or connection that breaks, or a server that says nothing. */
function brokenCase(rng: Rng, base: Base, body: Buffer): ReplyCase {
  const code = rng.pick(RST_CODES);
  const kinds: [string, Serve, Partial<ReplyCase>?][] = [
    ["reset before the headers", (s) => s.close(code)],
    ["reset after the headers", (s) => (s.respond(GRPC), s.close(code))],
    ["reset after the message", (s) => (s.respond(GRPC), s.write(body), setImmediate(() => s.close(code)))],
    ["no trailers", (s) => (s.respond(GRPC), s.end(body))],
    ["half a message, then the end", (s) => (s.respond(GRPC), s.end(body.subarray(0, Math.max(1, body.length >> 1))))],
    ["GOAWAY", (s) => s.session?.goaway(code)],
    ["GOAWAY after the headers", (s) => (s.respond(GRPC), s.session?.goaway(code))],
    ["the connection dropped", (s) => s.session?.destroy()],
    ["the connection dropped after the headers", (s) => (s.respond(GRPC), setImmediate(() => s.session?.destroy()))],
    ["silence", () => {}, { deadlineMs: SILENT_DEADLINE_MS, code: Code.DeadlineExceeded }],
    ["headers, then silence", (s) => s.respond(GRPC), { deadlineMs: SILENT_DEADLINE_MS, code: Code.DeadlineExceeded }],
  ];
  const [what, serve, extra] = rng.pick(kinds);
  return { ...base, plan: [what, `code ${code}`], ok: false, serve, ...extra };
}

/** The end of one call: its reply, or its error's code. */
export interface CallEnd {
  ok: boolean;
  code?: Code;
  message?: string;
  value?: unknown;
  ms: number;
  /** What was thrown, when it was not a ConnectError. */
  odd?: string;
}

export async function call(transport: Transport, c: ReplyCase, index: number): Promise<CallEnd> {
  const t0 = performance.now();
  try {
    const res = await transport.unary(c.method, undefined, c.deadlineMs, { "x-fuzz-case": String(index) }, create(c.method.input), undefined);
    return { ok: true, value: res.message, ms: performance.now() - t0 };
  } catch (err) {
    const ms = performance.now() - t0;
    if (!(err instanceof ConnectError)) return { ok: false, ms, odd: String(err) };
    return { ok: false, code: err.code, message: err.rawMessage, ms };
  }
}

/** protobuf-es's reading of a reply the SDK read; a refusal (at its recursion limit, which is not the codec's) matches anything. */
function referenceOf(desc: DescMessage, bytes: Uint8Array): unknown {
  try {
    return fromBinary(desc, bytes, { readUnknownFields: false });
  } catch {
    return ANY;
  }
}

const ANY = Symbol("protobuf-es refused it");

/** The first property the two ends of the case break, or undefined. */
export function checkCall(c: ReplyCase, sdk: CallEnd, reference: CallEnd): string | undefined {
  for (const [who, end] of [
    ["sdk", sdk],
    ["connect-node", reference],
  ] as const) {
    if (end.ms > c.deadlineMs + SLACK_MS) return `${who}: the call took ${Math.round(end.ms)}ms of a ${c.deadlineMs}ms deadline`;
    if (end.odd !== undefined) return `${who}: threw something other than a ConnectError: ${end.odd}`;
    if (!end.ok && !(end.code! >= 1 && end.code! <= 16)) return `${who}: an error without a code (${end.code})`;
  }
  if (c.ok === true && !sdk.ok) return `the SDK refused a well-formed reply: ${sdk.code} ${sdk.message}`;
  if (c.ok === false && sdk.ok) return "the SDK took a reply that must fail";
  const expected = sdk.ok && c.reply ? referenceOf(c.method.output, c.reply) : ANY;
  if (expected !== ANY && !same(sdk.value, expected)) return "the SDK decoded another reply than protobuf-es";
  if (c.code !== undefined && sdk.code !== c.code) return `the SDK answered ${sdk.code} (${sdk.message}), expected ${c.code}`;
  // On a mutated reply the decoders may differ (protobuf-es reads some malformed messages: ./wire-format.ts).
  if (c.referenceDiffers) return undefined;
  if (sdk.ok !== reference.ok && c.plan[0] !== MUTATED)
    return `the SDK ${sdk.ok ? "succeeded" : `failed (${sdk.code} ${sdk.message})`} where connect-node ${reference.ok ? "succeeded" : `failed (${reference.code} ${reference.message})`}`;
  if (c.code !== undefined && reference.code !== c.code) return `connect-node answered ${reference.code} (${reference.message}), expected ${c.code}`;
  return undefined;
}

/** The hostile server: each stream served as the case its x-fuzz-case header names. */
export class HostileServer {
  readonly #server = http2.createServer();
  readonly #cases = new Map<number, ReplyCase>();
  baseUrl = "";

  async start(): Promise<this> {
    this.#server.on("session", (s) => s.on("error", () => {}));
    this.#server.on("stream", (stream, headers) => {
      stream.on("error", () => {});
      const c = this.#cases.get(Number(headers["x-fuzz-case"]));
      stream.resume();
      if (!c) return stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
      // Some answers come before the request's end, as a server that does not wait would send them.
      try {
        c.serve(stream);
      } catch {
        if (!stream.destroyed) stream.destroy();
      }
    });
    await new Promise<void>((resolve) => this.#server.listen(0, "127.0.0.1", resolve));
    this.baseUrl = `http://127.0.0.1:${(this.#server.address() as AddressInfo).port}`;
    return this;
  }

  register(c: ReplyCase): void {
    this.#cases.set(c.index, c);
  }

  forget(c: ReplyCase): void {
    this.#cases.delete(c.index);
  }

  close(): Promise<void> {
    return new Promise((resolve) => this.#server.close(() => resolve()));
  }
}

export interface ClientFailure {
  seed: number;
  case: number;
  why: string;
  detail: Record<string, unknown>;
}

export interface ClientReport {
  cases: number;
  ms: number;
  /** How the SDK's calls ended, by code. */
  ends: Record<string, number>;
  failures: ClientFailure[];
}

/** One case on both transports, each on a connection of its own (a case may drop its connection). */
export async function playCase(server: HostileServer, c: ReplyCase): Promise<{ sdk: CallEnd; reference: CallEnd }> {
  server.register(c);
  const sdkSessions = new Http2SessionManager(server.baseUrl);
  const refSessions = new Http2SessionManager(server.baseUrl);
  try {
    const sdk = await call(
      createSdkGrpcTransport({ baseUrl: server.baseUrl, sessionManager: sdkSessions, interceptors: [], readMaxBytes: READ_MAX }),
      c,
      c.index,
    );
    const reference = await call(createGrpcTransport({ baseUrl: server.baseUrl, sessionManager: refSessions, readMaxBytes: READ_MAX }), c, c.index);
    return { sdk, reference };
  } finally {
    sdkSessions.abort();
    refSessions.abort();
    server.forget(c);
  }
}

/** The case and how its calls ended, for a report. */
export function describeReply(c: ReplyCase, sdk: CallEnd, reference: CallEnd): Record<string, unknown> {
  return {
    method: `${c.method.parent.typeName}/${c.method.name}`,
    plan: c.plan,
    reply: c.reply ? hex(c.reply) : undefined,
    sdk: { ...sdk, value: undefined },
    connect: { ...reference, value: undefined },
  };
}

/** Runs the cases `concurrency` at a time, each on fresh connections (a case may drop its own). */
export interface ClientRunOptions {
  seed: number;
  first?: number;
  count: number;
  limits: Limits;
  server: HostileServer;
  concurrency?: number;
}

export async function runClientCases(opts: ClientRunOptions): Promise<ClientReport> {
  const t0 = performance.now();
  const ends: Record<string, number> = {};
  const failures: ClientFailure[] = [];
  const first = opts.first ?? 0;
  let next = first;
  const worker = async () => {
    for (let i = next++; i < first + opts.count; i = next++) {
      const c = replyCase(opts.seed, i, opts.limits);
      const { sdk, reference } = await playCase(opts.server, c);
      const k = sdk.ok ? "ok" : String(sdk.code);
      ends[k] = (ends[k] ?? 0) + 1;
      const why = checkCall(c, sdk, reference);
      if (!why) continue;
      failures.push({ seed: c.seed, case: i, why, detail: describeReply(c, sdk, reference) });
    }
  };
  await Promise.all(Array.from({ length: opts.concurrency ?? 8 }, worker));
  return { cases: opts.count, ms: performance.now() - t0, ends, failures };
}
