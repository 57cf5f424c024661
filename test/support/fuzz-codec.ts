/**
 * The compiled codec (wire/src/codec) against fuzzed bytes, with protobuf-es's fromBinary as the
 * reference. Used by test/fuzz-codec.test.ts and bench/fuzz.ts --target codec.
 *
 * A case is one message type of our protos (every one the codec compiles) and bytes made from a
 * valid message of it, mutated or not. The properties (`checkDecode`):
 * - decode returns or throws an Error: never another value thrown, never past `SLOW_MS`;
 * - it reads exactly the well-formed messages (./wire-format.ts decides, not protobuf-es, which
 *   reads some malformed ones);
 * - where protobuf-es reads them too, the messages are the same (unknown fields left out of the
 *   reference, since the codec skips them).
 */
import { performance } from "node:perf_hooks";
import { fromBinary, type DescFile, type DescMessage } from "@bufbuild/protobuf";
import { compileCodec } from "@aiflow/wire/codec";
import { file_aiflow_cluster_v1_agent } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { file_aiflow_cluster_v1_common } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import { file_aiflow_cluster_v1_ops } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { file_aiflow_cluster_v1_queue } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { file_aiflow_cluster_v1_runs } from "@aiflow/wire/gen/aiflow/cluster/v1/runs_pb.js";
import { file_aiflow_cluster_v1_work_item } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { file_grpc_health_v1_health } from "@aiflow/wire/gen/grpc/health/v1/health_pb.js";
import { file_grpc_reflection_v1_reflection } from "@aiflow/wire/gen/grpc/reflection/v1/reflection_pb.js";
import { caseRng, fuzzMessage, hex, type Limits } from "./fuzz.js";
import { malformation } from "./wire-format.js";

const FILES: DescFile[] = [
  file_aiflow_cluster_v1_agent,
  file_aiflow_cluster_v1_common,
  file_aiflow_cluster_v1_ops,
  file_aiflow_cluster_v1_queue,
  file_aiflow_cluster_v1_runs,
  file_aiflow_cluster_v1_work_item,
  file_grpc_health_v1_health,
  file_grpc_reflection_v1_reflection,
];

const nested = (messages: readonly DescMessage[]): DescMessage[] => messages.flatMap((m) => [m, ...nested(m.nestedMessages)]);

/** Every message of our protos the codec compiles (map entries are not messages of their own). */
export const CODEC_MESSAGES: DescMessage[] = nested(FILES.flatMap((f) => f.messages)).filter((m) => compileCodec(m) !== undefined);

/** A decode slower than this (of at most Limits.maxBytes) counts as a hang. */
export const SLOW_MS = 1000;

export interface DecodeCase {
  seed: number;
  index: number;
  desc: DescMessage;
  bytes: Uint8Array;
  mutations: string[];
}

export function decodeCase(seed: number, index: number, limits: Limits): DecodeCase {
  const rng = caseRng(seed, index);
  const desc = rng.pick(CODEC_MESSAGES);
  const { bytes, applied } = fuzzMessage(desc, rng, limits);
  return { seed, index, desc, bytes, mutations: applied };
}

type Outcome = { ok: true; value: unknown } | { ok: false; error: unknown };

function attempt(fn: () => unknown): Outcome {
  try {
    return { ok: true, value: fn() };
  } catch (error) {
    return { ok: false, error };
  }
}

/** The outcome's class for the counts, and the first property the case breaks. */
export function checkDecode(c: DecodeCase): { outcome: string; why?: string } {
  const codec = compileCodec(c.desc)!;
  const t0 = performance.now();
  const ours = attempt(() => codec.decode(c.bytes));
  const ms = performance.now() - t0;
  const ref = attempt(() => fromBinary(c.desc, c.bytes, { readUnknownFields: false }));
  const bad = malformation(c.desc, c.bytes);
  const outcome = `${bad ? "malformed" : "well-formed"}: codec ${ours.ok ? "read" : "refused"}, protobuf-es ${ref.ok ? "read" : "refused"}`;
  if (ms > SLOW_MS) return { outcome, why: `decode took ${Math.round(ms)}ms` };
  if (!ours.ok && !(ours.error instanceof Error)) return { outcome, why: `the codec threw a non-Error: ${String(ours.error)}` };
  if (ours.ok && bad) return { outcome, why: `the codec read a malformed message (${bad})` };
  if (!ours.ok && !bad) return { outcome, why: `the codec refused a well-formed message: ${(ours.error as Error).message}` };
  if (ours.ok && ref.ok && !same(ours.value, ref.value)) return { outcome, why: "the codec read another message than protobuf-es" };
  return { outcome };
}

/**
 * Deep equality as toEqual has it for messages: undefined properties ignored, bytes by content, NaN
 * equal to itself; and unknown fields ($unknown, which only protobuf-es keeps) left out.
 */
export function same(a: unknown, b: unknown): boolean {
  if (Object.is(a, b)) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (a instanceof Uint8Array || b instanceof Uint8Array) return a instanceof Uint8Array && b instanceof Uint8Array && Buffer.compare(a, b) === 0;
  if (Array.isArray(a) || Array.isArray(b)) return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => same(x, b[i]));
  const keys = (o: object) => Object.keys(o).filter((k) => k !== "$unknown" && (o as Record<string, unknown>)[k] !== undefined);
  const ka = keys(a);
  return ka.length === keys(b).length && ka.every((k) => same((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}

export interface DecodeReport {
  cases: number;
  ms: number;
  outcomes: Record<string, number>;
  failures: { seed: number; case: number; why: string; detail: Record<string, unknown> }[];
}

export interface DecodeRunOptions {
  seed: number;
  first?: number;
  count: number;
  limits: Limits;
}

export function runDecodeCases(opts: DecodeRunOptions): DecodeReport {
  const t0 = performance.now();
  const outcomes: Record<string, number> = {};
  const failures: DecodeReport["failures"] = [];
  const first = opts.first ?? 0;
  for (let i = first; i < first + opts.count; i++) {
    const c = decodeCase(opts.seed, i, opts.limits);
    const { outcome, why } = checkDecode(c);
    outcomes[outcome] = (outcomes[outcome] ?? 0) + 1;
    if (!why) continue;
    failures.push({ seed: c.seed, case: i, why, detail: { type: c.desc.typeName, mutations: c.mutations, bytes: hex(c.bytes) } });
  }
  return { cases: opts.count, ms: performance.now() - t0, outcomes, failures };
}
