/**
 * The daemon against fuzzed gRPC requests over real HTTP/2 (test/support/fuzz-daemon.ts says what
 * a case is and which properties every answer must have): random and mutated messages of every
 * unary method, corrupted envelopes, header blocks varied in what callers get wrong. A refused
 * request changes no row: the rows are compared around every case that is not answered OK. And
 * the daemon logs nothing at error level, which is where a handler's unexpected exception goes.
 *
 * AIFLOW_FUZZ_CASES sets the count (default 300, a few seconds), AIFLOW_FUZZ_SEED the run's seed
 * (default fixed, so CI runs the same cases every time). A failure names its seed and case; replay
 * it alone with `npx tsx bench/fuzz.ts --seed S --case I`, or run longer by hand (docs/development.md, Fuzzing).
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import { pino } from "pino";
import { beforeAll, describe, expect, it } from "vitest";
import { FakeClock } from "../src/clock.js";
import { LOG_OPTIONS } from "../src/log.js";
import { ClaimRequestSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { Health, HealthCheckResponse_ServingStatus } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import { EnqueueRequestSchema, QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { TOKENS } from "./support/daemon.js";
import { codeOf, useTestDaemon } from "./support/kit.js";
import { CI_LIMITS } from "./support/fuzz.js";
import { H2Client, RowDigest, runCases, send, TARGETS, type FuzzTokens } from "./support/fuzz-daemon.js";
import { countItems, TestAgent } from "./support/queue.js";
import { grpcMessage } from "./support/wire.js";

const CASES = Number(process.env.AIFLOW_FUZZ_CASES ?? 300);
const SEED = Number(process.env.AIFLOW_FUZZ_SEED ?? 29);
const tokens: FuzzTokens = { agent: TOKENS.agent, engine: TOKENS.engine, ops: TOKENS.ops };

/** What the daemon logs at error level: a handler's unexpected exception, a reply it could not encode. */
const errors: string[] = [];
const log = pino({ ...LOG_OPTIONS, level: "error" }, { write: (line: string) => void errors.push(line) });

const fx = useTestDaemon({
  label: "fuzz",
  log,
  // Time stands still, so no sweep or lease expiry changes a row behind a case's back; buffered
  // heartbeats are never flushed during the run, for the same reason.
  clock: new FakeClock(Date.UTC(2026, 3, 1)),
  config: {
    // Cases with no token or a wrong one are a sixth of the run: no address may be throttled for them.
    authFailureLimit: 1_000_000_000,
    // A fuzzed Claim may long-poll: bounded, so a case's wait stays short whatever its deadline.
    claimMaxWait: 200,
    heartbeatFlush: 3_600_000,
    sweepInterval: 3_600_000,
  },
});

let client: H2Client;
let rows: RowDigest;
beforeAll(async () => {
  client = fx.closers.add(new H2Client(fx.address));
  rows = await RowDigest.open(fx.db.url, fx.db.schema);
  fx.closers.defer(() => rows.close());
});

describe(`the daemon against ${CASES} fuzzed requests (seed ${SEED})`, () => {
  it("answers every one with a gRPC status in time, refuses what it must, and changes no row for a refusal", async () => {
    const report = await runCases({ seed: SEED, count: CASES, client, tokens, limits: CI_LIMITS, rows });
    console.log(
      JSON.stringify({ fuzz: "server", seed: SEED, cases: report.cases, ms: Math.round(report.ms), answers: report.answers, failures: report.failures.length }),
    );
    for (const f of report.failures.slice(0, 5)) console.log(JSON.stringify(f));
    expect(report.failures.map((f) => `seed ${f.seed} case ${f.case}: ${f.why}`)).toEqual([]);
    expect(errors).toEqual([]);
  }, 120_000);

  it("still answers a health check and a valid call afterwards", async () => {
    const health = fx.client(Health);
    expect((await health.check({})).status).toBe(HealthCheckResponse_ServingStatus.SERVING);
    const queue = fx.client(QueueService, TOKENS.engine);
    const before = await countItems(fx.db);
    const res = await queue.enqueue({ tenantKey: "default", items: [{ engineKind: "dag", payloadJson: '{"after":"fuzz"}' }] });
    expect(res.results).toHaveLength(1);
    expect(await countItems(fx.db)).toBe(before + 1);
    expect(await codeOf(queue.getItem({ tenantKey: "default", id: res.results[0]!.id }))).toBe("ok");
    expect(await codeOf(queue.enqueue({ tenantKey: "default" }))).toBe(Code.InvalidArgument);
  });
});

/**
 * Found by this fuzzer: a deadline of 597 hours is a valid grpc-timeout,
 * but Node's timers cut anything past 2^31-1 ms to 1 ms, so the call's deadline passes at once: a
 * handler that reads the database answers DEADLINE_EXCEEDED. A Claim that waits 150 ms for work
 * shows it without a race: it should come back OK, empty, after its wait.
 */
describe("a deadline past 2^31-1 ms", () => {
  const claim = TARGETS.find((t) => t.method.name === "Claim")!;
  let agent: TestAgent;
  beforeAll(async () => {
    // An engine kind of its own: no item a fuzz case enqueued can answer its claim early.
    agent = fx.closers.add(await TestAgent.register(fx.address, "fuzz-deadline", { tenants: ["default"], engineKinds: ["deadline-probe"] }));
  });
  const longClaim = (extra: Record<string, string>) =>
    send(client, {
      headers: {
        ":method": "POST",
        ":path": claim.path,
        "content-type": "application/grpc",
        te: "trailers",
        authorization: `Bearer ${TOKENS.agent}`,
        "grpc-timeout": "597H",
        ...extra,
      },
      chunks: [grpcMessage(toBinary(ClaimRequestSchema, create(ClaimRequestSchema, { name: agent.name, maxItems: 1, wait: durationFromMs(150) })))],
      waitMs: 10_000,
    });

  // The claim sees its signal abort at once, so it answers at once: OK, empty, without its wait.
  const waited = async (extra: Record<string, string>) => {
    const answer = await longClaim(extra);
    expect(answer.grpcStatus).toBe("0");
    expect(answer.ms).toBeGreaterThanOrEqual(140);
  };

  it("lets the call run on the direct path, as one with no deadline", () => waited({}));

  // An uncompressed message under grpc-encoding gzip: the direct path leaves it to connect-node.
  it("lets the call run on connect-node", () => waited({ "grpc-encoding": "gzip" }));

  it("is not what a deadline within the timers' range does", () => waited({ "grpc-timeout": "596H" }));
});

/**
 * Found by this fuzzer: a refusal that quotes a caller's value cut at 40
 * UTF-16 code units, with a character outside the BMP astride the cut, holds half a surrogate pair,
 * which connect's setTrailerStatus cannot percent-encode. And a gRPC+JSON body that starts with such
 * a character, since JSON.parse's error quotes half of it.
 */
describe("an error message holding half a surrogate pair", () => {
  const enqueue = TARGETS.find((t) => t.method.name === "Enqueue")!;
  const astride = grpcMessage(
    toBinary(EnqueueRequestSchema, create(EnqueueRequestSchema, { tenantKey: `${"x".repeat(39)}🙂`, items: [{ engineKind: "dag" }] })),
  );
  const refused = (extra: Record<string, string>) =>
    send(client, {
      headers: {
        ":method": "POST",
        ":path": enqueue.path,
        "content-type": "application/grpc",
        te: "trailers",
        authorization: `Bearer ${TOKENS.engine}`,
        "grpc-timeout": "300m",
        ...extra,
      },
      chunks: [astride],
      waitMs: 1000,
    });

  it("is sent as the refusal's status on the direct path, the half pair as U+FFFD", async () => {
    expect((await refused({})).grpcStatus).toBe(String(Code.InvalidArgument));
  });

  it("is sent as the refusal's status on connect-node, the half pair as U+FFFD", async () => {
    expect((await refused({ "grpc-encoding": "gzip" })).grpcStatus).toBe(String(Code.InvalidArgument));
  });

  it("is sent for a gRPC+JSON health check, with no token", async () => {
    const answer = await send(client, {
      headers: { ":method": "POST", ":path": "/grpc.health.v1.Health/Check", "content-type": "application/grpc+json", te: "trailers", "grpc-timeout": "300m" },
      chunks: [grpcMessage(Buffer.from("🙂"))],
      waitMs: 1000,
    });
    expect(answer.grpcStatus).toBe(String(Code.InvalidArgument));
  });

  it("is not what a value cut between two pairs does", async () => {
    const whole = grpcMessage(
      toBinary(EnqueueRequestSchema, create(EnqueueRequestSchema, { tenantKey: `${"x".repeat(38)}🙂`, items: [{ engineKind: "dag" }] })),
    );
    const answer = await send(client, {
      headers: { ":method": "POST", ":path": enqueue.path, "content-type": "application/grpc", te: "trailers", authorization: `Bearer ${TOKENS.engine}` },
      chunks: [whole],
      waitMs: 1000,
    });
    expect(answer.grpcStatus).toBe(String(Code.InvalidArgument));
  });
});
