/**
 * The SDK's side of the wire against fuzzed input: the compiled codec decoding mutated bytes of
 * every message type it compiles (test/support/fuzz-codec.ts), and the SDK's client transport
 * against a hostile HTTP/2 server whose answers are fuzzed (test/support/fuzz-client.ts).
 *
 * AIFLOW_FUZZ_CASES scales both (default 300: 3,000 decodes and 300 calls, a few seconds);
 * AIFLOW_FUZZ_SEED sets the seed (default fixed). A failure names its seed and case; replay it with
 * `npx tsx bench/fuzz.ts --target codec|client --seed S --case I`.
 */
import http2 from "node:http2";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { compileCodec } from "@aiflow/wire/codec";
import { createSdkGrpcTransport } from "@aiflow/wire/client";
import { AgentService, ClaimResponseSchema, WatchDirectivesRequestSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { WorkerParamsSchema, WorkItemSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { CI_LIMITS, Rng, validMessage } from "./support/fuzz.js";
import { CODEC_MESSAGES, runDecodeCases, same } from "./support/fuzz-codec.js";
import { HostileServer, runClientCases } from "./support/fuzz-client.js";
import { grpcMessage } from "./support/wire.js";

const CASES = Number(process.env.AIFLOW_FUZZ_CASES ?? 300);
const SEED = Number(process.env.AIFLOW_FUZZ_SEED ?? 29);

describe(`the compiled codec against ${CASES * 10} fuzzed messages (seed ${SEED})`, () => {
  it("decodes valid messages of every type it compiles as protobuf-es does", () => {
    expect(CODEC_MESSAGES.length).toBeGreaterThan(60);
    const rng = new Rng(SEED);
    for (const desc of CODEC_MESSAGES)
      for (let i = 0; i < 5; i++) {
        const bytes = validMessage(desc, rng);
        expect(same(compileCodec(desc)!.decode(bytes), fromBinary(desc, bytes)), `${desc.typeName} #${i}`).toBe(true);
      }
  });

  it("reads every well-formed message as protobuf-es does and refuses every malformed one with an Error, in time", () => {
    const report = runDecodeCases({ seed: SEED, count: CASES * 10, limits: CI_LIMITS });
    console.log(
      JSON.stringify({
        fuzz: "codec",
        seed: SEED,
        cases: report.cases,
        ms: Math.round(report.ms),
        outcomes: report.outcomes,
        failures: report.failures.length,
      }),
    );
    for (const f of report.failures.slice(0, 5)) console.log(JSON.stringify(f));
    expect(report.failures.map((f) => `seed ${f.seed} case ${f.case}: ${f.why}`)).toEqual([]);
  }, 60_000);

  // Found by this fuzzer. Field 1 (id, a string) with its tag written in 5
  // bytes whose last sets bit 32: the codec reads it as field 1, protobuf-es refuses the tag.
  it("refuses a tag past 32 bits, as protobuf-es does", () => {
    const bytes = Uint8Array.from([0x8a, 0x80, 0x80, 0x80, 0x10, 0x02, 0x68, 0x69]);
    expect(() => fromBinary(WorkItemSchema, bytes)).toThrow(/overflows uint32/);
    expect(() => compileCodec(WorkItemSchema)!.decode(bytes)).toThrow();
  });

  // Found by this fuzzer. WorkerParams.selector (field 1, a map) with one
  // entry: a field 0 of length 0, then key "k" and value "v".
  it("refuses field number 0 inside a map entry, as everywhere else", () => {
    const bytes = Uint8Array.from([0x0a, 0x08, 0x02, 0x00, 0x0a, 0x01, 0x6b, 0x12, 0x01, 0x76]);
    expect(() => fromBinary(WorkerParamsSchema, bytes)).toThrow(/field no 0/);
    expect(() => compileCodec(WorkerParamsSchema)!.decode(bytes)).toThrow();
  });

  // Found by this fuzzer. Field 6 of WatchDirectivesRequest, length-delimited, its length a 10-byte
  // varint past 32 bits: read as its low 32 bits (0, as protobuf-es reads it) it would be another
  // length than the one sent.
  it("refuses a length past 32 bits", () => {
    const bytes = Uint8Array.from([0x32, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02]);
    expect(() => compileCodec(WatchDirectivesRequestSchema)!.decode(bytes)).toThrow(/invalid length: varint overflows uint32/);
    // The same length written in 5 bytes and within 32 bits is a length.
    expect(() => compileCodec(WatchDirectivesRequestSchema)!.decode(Uint8Array.from([0x32, 0x80, 0x80, 0x80, 0x80, 0x00]))).not.toThrow();
  });
});

describe(`the SDK client transport against ${CASES} fuzzed replies (seed ${SEED})`, () => {
  let server: HostileServer;
  beforeAll(async () => {
    server = await new HostileServer().start();
  });
  afterAll(() => server?.close());

  it("ends every call in time, with its reply or a ConnectError with a code, as connect-node's transport does", async () => {
    const report = await runClientCases({ seed: SEED, count: CASES, limits: CI_LIMITS, server });
    console.log(
      JSON.stringify({ fuzz: "client", seed: SEED, cases: report.cases, ms: Math.round(report.ms), ends: report.ends, failures: report.failures.length }),
    );
    for (const f of report.failures.slice(0, 5)) console.log(JSON.stringify(f));
    expect(report.failures.map((f) => `seed ${f.seed} case ${f.case}: ${f.why}`)).toEqual([]);
  }, 60_000);

  /** One Claim against a server that answers as `serve` does; its error, or undefined when it succeeded. */
  async function claimAgainst(serve: (s: http2.ServerHttp2Stream) => void): Promise<ConnectError | undefined> {
    const h2 = http2.createServer();
    h2.on("stream", (s) => {
      s.on("error", () => {});
      s.resume();
      serve(s);
    });
    await new Promise<void>((resolve) => h2.listen(0, "127.0.0.1", resolve));
    const baseUrl = `http://127.0.0.1:${(h2.address() as { port: number }).port}`;
    const sessionManager = new Http2SessionManager(baseUrl);
    try {
      await createClient(AgentService, createSdkGrpcTransport({ baseUrl, sessionManager, interceptors: [] })).claim({ name: "x" }, { timeoutMs: 5000 });
      return undefined;
    } catch (err) {
      return ConnectError.from(err);
    } finally {
      sessionManager.abort();
      await new Promise((resolve) => h2.close(resolve));
    }
  }

  const reply = grpcMessage(toBinary(ClaimResponseSchema, create(ClaimResponseSchema, { items: [{ id: "01J" }] })));
  const answer = (trailers: http2.OutgoingHttpHeaders) => (s: http2.ServerHttp2Stream) => {
    s.once("wantTrailers", () => s.sendTrailers(trailers));
    s.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
    s.end(reply);
  };

  // Found by this fuzzer: gRPC's spec says a grpc-message that does not decode
  // is taken as it is, never a reason to throw the status away.
  it("keeps the status of a reply whose grpc-message is not percent-encoding", async () => {
    const err = await claimAgainst(answer({ "grpc-status": String(Code.NotFound), "grpc-message": "no agent, 100%" }));
    expect(err?.code).toBe(Code.NotFound);
  });

  // Found by this fuzzer: connect's findTrailerError takes the status from grpc-status-details-bin
  // when there is one, and an empty one decodes to code 0, so an error the server sent becomes a
  // success. The SDK keeps connect's semantics (its validateTrailer); connect-node does the same.
  it("fails a call whose grpc-status is an error, whatever grpc-status-details-bin holds", async () => {
    const err = await claimAgainst(answer({ "grpc-status": String(Code.Internal), "grpc-status-details-bin": "" }));
    expect(err?.code).toBe(Code.Internal);
  });
});
