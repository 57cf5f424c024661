/**
 * The compiled codec against protobuf-es, the reference: for every message of our protos and for a
 * test message with every scalar type, list, map and oneof shape, random messages must encode to
 * the same bytes as toBinary and decode to what fromBinary gives; malformed input must be refused.
 */
import { create, createFileRegistry, fromBinary, toBinary, type DescField, type DescMessage } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, TimestampSchema, DurationSchema } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { compileCodec } from "../src/codec/index.js";
import { RESHAPED_TYPES } from "../src/codec/compile.js";
import { file_aiflow_cluster_v1_agent } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { file_aiflow_cluster_v1_common } from "@aiflow/wire/gen/aiflow/cluster/v1/common_pb.js";
import { file_aiflow_cluster_v1_ops } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { file_aiflow_cluster_v1_queue } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import { file_aiflow_cluster_v1_runs } from "@aiflow/wire/gen/aiflow/cluster/v1/runs_pb.js";
import { ClaimRequestSchema, ClaimResponseSchema, CompleteRequestSchema, HeartbeatRequestSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/agent_pb.js";
import { file_aiflow_cluster_v1_work_item, WorkItemSchema } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { mulberry32 as rng } from "../../test/support/prng.js";

const SAMPLES = ["", "a", "work-01", "é", "名前", "🙂 emoji", "\u{10ffff}", "x".repeat(70), "ü".repeat(80), "lone \ud800 surrogate"];

function randomValue(rand: () => number, type: number, depth: number): unknown {
  const pick = <T>(xs: T[]) => xs[Math.floor(rand() * xs.length)]!;
  switch (type) {
    case 9: // string
      return pick(SAMPLES);
    case 12: // bytes
      return Uint8Array.from({ length: pick([0, 1, 5, 200]) }, () => Math.floor(rand() * 256));
    case 8:
      return rand() < 0.5;
    case 5: // int32
    case 15: // sfixed32
    case 17: // sint32
      return pick([0, 1, -1, 127, 128, -129, 2147483647, -2147483648, Math.floor(rand() * 1e6)]);
    case 13: // uint32
    case 7: // fixed32
      return pick([0, 1, 127, 128, 16384, 4294967295, Math.floor(rand() * 1e9)]);
    case 3: // int64
    case 16: // sfixed64
    case 18: // sint64
      return pick([0n, 1n, -1n, 1_764_000_000_000_000_000n, -(2n ** 63n), 2n ** 63n - 1n, 2n ** 35n, BigInt(Math.floor(rand() * 1e15))]);
    case 4: // uint64
    case 6: // fixed64
      return pick([0n, 1n, 2n ** 64n - 1n, 2n ** 32n, 2n ** 53n + 1n, BigInt(Math.floor(rand() * 1e15))]);
    case 1: // double
      return pick([0, -1.5, 1e300, Math.PI, rand()]);
    case 2: // float
      return Math.fround(pick([0, -1.5, 3.25, rand() * 1000]));
    default:
      throw new Error(`no sample for scalar type ${type} at depth ${depth}`);
  }
}

function randomMessage(desc: DescMessage, rand: () => number, depth = 0): Record<string, unknown> {
  const init: Record<string, unknown> = {};
  const scalarOf = (f: DescField): number =>
    f.fieldKind === "enum" || (f.fieldKind === "list" && f.listKind === "enum") || (f.fieldKind === "map" && f.mapKind === "enum") ? -1 : (f.scalar as number);
  const value = (f: DescField, type: number, message: DescMessage | undefined): unknown => {
    if (message) return randomMessage(message, rand, depth + 1);
    if (type === -1) {
      const values = f.enum!.values;
      return values[Math.floor(rand() * values.length)]!.number;
    }
    return randomValue(rand, type, depth);
  };
  for (const member of desc.members) {
    if (member.kind === "oneof") {
      const chosen = member.fields[Math.floor(rand() * (member.fields.length + 1))];
      if (chosen)
        init[member.localName] = {
          case: chosen.localName,
          value: value(chosen, scalarOf(chosen), chosen.fieldKind === "message" ? chosen.message : undefined),
        };
      continue;
    }
    const f = member;
    if (rand() < 0.25) continue; // left unset
    switch (f.fieldKind) {
      case "scalar":
      case "enum":
        init[f.localName] = value(f, scalarOf(f), undefined);
        break;
      case "message":
        if (depth < 3) init[f.localName] = value(f, 0, f.message);
        break;
      case "list": {
        const n = depth < 3 ? Math.floor(rand() * 4) : 0;
        init[f.localName] = Array.from({ length: n }, () => value(f, scalarOf(f), f.listKind === "message" ? f.message : undefined));
        break;
      }
      case "map": {
        const n = depth < 3 ? Math.floor(rand() * 3) : 0;
        const map: Record<string, unknown> = {};
        for (let i = 0; i < n; i++) map[String(randomValue(rand, f.mapKey, depth))] = value(f, scalarOf(f), f.mapKind === "message" ? f.message : undefined);
        init[f.localName] = map;
        break;
      }
    }
  }
  return init;
}

function allMessages(messages: readonly DescMessage[]): DescMessage[] {
  return messages.flatMap((m) => [m, ...allMessages(m.nestedMessages)]);
}

/** A proto3 file with every scalar type singular, optional and repeated, maps of several kinds, a oneof and recursion. */
function allTypesFile(): DescMessage {
  const scalars: [string, number][] = [
    ["f_double", 1],
    ["f_float", 2],
    ["f_int64", 3],
    ["f_uint64", 4],
    ["f_int32", 5],
    ["f_fixed64", 6],
    ["f_fixed32", 7],
    ["f_bool", 8],
    ["f_string", 9],
    ["f_bytes", 12],
    ["f_uint32", 13],
    ["f_sfixed32", 15],
    ["f_sfixed64", 16],
    ["f_sint32", 17],
    ["f_sint64", 18],
  ];
  const fields: Record<string, unknown>[] = [];
  let no = 1;
  for (const [name, type] of scalars) {
    fields.push({ name, number: no++, label: 1, type });
    fields.push({ name: `r_${name}`, number: no++, label: 3, type });
    fields.push({ name: `o_${name}`, number: no++, label: 1, type, proto3Optional: true, oneofIndex: fields.filter((f) => f.proto3Optional).length + 1 });
  }
  const syntheticOneofs = scalars.map(([name]) => ({ name: `_o_${name}` }));
  const entry = (name: string, keyType: number, value: Record<string, unknown>) => ({
    name,
    field: [
      { name: "key", number: 1, label: 1, type: keyType },
      { name: "value", number: 2, label: 1, ...value },
    ],
    options: { mapEntry: true },
  });
  fields.push(
    { name: "color", number: no++, label: 1, type: 14, typeName: ".codec.test.Color" },
    { name: "colors", number: no++, label: 3, type: 14, typeName: ".codec.test.Color" },
    { name: "child", number: no++, label: 1, type: 11, typeName: ".codec.test.AllTypes" },
    { name: "children", number: no++, label: 3, type: 11, typeName: ".codec.test.AllTypes" },
    { name: "when", number: no++, label: 1, type: 11, typeName: ".google.protobuf.Timestamp" },
    { name: "by_name", number: no++, label: 3, type: 11, typeName: ".codec.test.AllTypes.ByNameEntry" },
    { name: "by_int", number: no++, label: 3, type: 11, typeName: ".codec.test.AllTypes.ByIntEntry" },
    { name: "by_flag", number: no++, label: 3, type: 11, typeName: ".codec.test.AllTypes.ByFlagEntry" },
    { name: "by_long", number: no++, label: 3, type: 11, typeName: ".codec.test.AllTypes.ByLongEntry" },
    { name: "pick_text", number: no++, label: 1, type: 9, oneofIndex: 0 },
    { name: "pick_child", number: no++, label: 1, type: 11, typeName: ".codec.test.AllTypes", oneofIndex: 0 },
    { name: "pick_number", number: no++, label: 1, type: 3, oneofIndex: 0 },
    { name: "unpacked", number: no++, label: 3, type: 5, options: { packed: false } },
  );
  const file = create(FileDescriptorProtoSchema, {
    name: "codec_test.proto",
    package: "codec.test",
    syntax: "proto3",
    dependency: ["google/protobuf/timestamp.proto"],
    enumType: [
      {
        name: "Color",
        value: [
          { name: "COLOR_UNSPECIFIED", number: 0 },
          { name: "COLOR_RED", number: 1 },
          { name: "COLOR_BLUE", number: 7 },
        ],
      },
    ],
    messageType: [
      {
        name: "AllTypes",
        field: fields,
        oneofDecl: [{ name: "pick" }, ...syntheticOneofs],
        nestedType: [
          entry("ByNameEntry", 9, { type: 11, typeName: ".codec.test.AllTypes" }),
          entry("ByIntEntry", 5, { type: 9 }),
          entry("ByFlagEntry", 8, { type: 1 }),
          entry("ByLongEntry", 3, { type: 14, typeName: ".codec.test.Color" }),
        ],
      },
    ],
  } as never);
  const registry = createFileRegistry(file, (name) => (name === "google/protobuf/timestamp.proto" ? TimestampSchema.file : undefined));
  return registry.getMessage("codec.test.AllTypes")!;
}

const OURS = allMessages(
  [
    file_aiflow_cluster_v1_agent,
    file_aiflow_cluster_v1_common,
    file_aiflow_cluster_v1_ops,
    file_aiflow_cluster_v1_queue,
    file_aiflow_cluster_v1_runs,
    file_aiflow_cluster_v1_work_item,
  ].flatMap((f) => f.messages),
);

function reshapedInside(desc: DescMessage, seen = new Set<DescMessage>()): boolean {
  if (seen.has(desc)) return false;
  seen.add(desc);
  return desc.fields.some((f) => f.message !== undefined && (RESHAPED_TYPES.has(f.message.typeName) || reshapedInside(f.message, seen)));
}

function checkAgainstReference(desc: DescMessage, cases: number): void {
  const codec = compileCodec(desc);
  expect(codec, `${desc.typeName} compiles`).toBeDefined();
  for (let seed = 1; seed <= cases; seed++) {
    const message = create(desc, randomMessage(desc, rng(seed)) as never);
    const reference = toBinary(desc, message);
    const ours = codec!.encode(message);
    expect(Buffer.from(ours).equals(Buffer.from(reference)), `${desc.typeName} seed ${seed}: same bytes as toBinary`).toBe(true);
    expect(codec!.decode(reference), `${desc.typeName} seed ${seed}: decodes as fromBinary`).toEqual(fromBinary(desc, reference));
    const framed = codec!.frame(message);
    expect([framed[0], framed.readUInt32BE(1)], `${desc.typeName} seed ${seed}: gRPC envelope`).toEqual([0, reference.length]);
    expect(framed.subarray(5).equals(Buffer.from(reference)), `${desc.typeName} seed ${seed}: framed bytes`).toBe(true);
  }
}

describe("compiled codec", () => {
  it("matches protobuf-es byte for byte on every message of our protos, both ways", () => {
    expect(OURS.length).toBeGreaterThan(50);
    for (const desc of OURS) {
      // Only messages with a reshaped well-known type inside (Struct as JSON, say) are left to protobuf-es.
      if (compileCodec(desc) === undefined) expect(reshapedInside(desc), `${desc.typeName} has no codec`).toBe(true);
      else checkAgainstReference(desc, 40);
    }
    for (const hot of [ClaimRequestSchema, ClaimResponseSchema, CompleteRequestSchema, HeartbeatRequestSchema, WorkItemSchema])
      expect(compileCodec(hot), hot.typeName).toBeDefined();
  });

  it("matches protobuf-es on every scalar type, optional, packed and unpacked lists, maps, oneofs and recursion", () => {
    checkAgainstReference(allTypesFile(), 400);
    checkAgainstReference(TimestampSchema, 20);
    checkAgainstReference(DurationSchema, 20);
  });

  it("encodes init objects as protobuf-es encodes the messages made from them", () => {
    const init = {
      id: "01J",
      priority: -3,
      dispatchedAtNs: 1_764_000_000_123_456_789n,
      workerParams: { selector: { gpu: "a100" } },
      createdOn: { seconds: 5n, nanos: 7 },
    };
    expect(Buffer.from(compileCodec(WorkItemSchema)!.encode(init)).equals(Buffer.from(toBinary(WorkItemSchema, create(WorkItemSchema, init))))).toBe(true);
  });

  it("treats null like an absent field when encoding (an implementation's reply built from nullable columns)", () => {
    const withNulls = { id: "01J", runId: null, workerParams: null, createdOn: null, priority: null } as unknown as Record<string, unknown>;
    expect(
      Buffer.from(compileCodec(WorkItemSchema)!.encode(withNulls as never)).equals(
        Buffer.from(toBinary(WorkItemSchema, create(WorkItemSchema, { id: "01J" }))),
      ),
    ).toBe(true);
  });

  it("reads what protobuf-es writes differently: unpacked repeated numbers, repeated singular messages merged, unknown fields skipped", () => {
    const desc = allTypesFile();
    const codec = compileCodec(desc)!;
    // r_f_int32 is packed by default; the same values unpacked (tag per value) must read the same.
    const rInt32 = desc.fields.find((f) => f.name === "r_f_int32")!;
    const unpacked = Buffer.from([(rInt32.number << 3) | 0, 5, (rInt32.number << 3) | 0, 0x7f]);
    expect((codec.decode(unpacked) as Record<string, unknown>).rFInt32).toEqual([5, 127]);
    expect((fromBinary(desc, unpacked) as Record<string, unknown>).rFInt32).toEqual([5, 127]);
    // Two occurrences of a singular message merge; an unknown field (number 999) is skipped.
    const a = toBinary(desc, create(desc, { child: { fInt32: 1 } } as never));
    const b = toBinary(desc, create(desc, { child: { fString: "x" } } as never));
    const unknown = Buffer.from([0xb8, 0x3e, 0x01]); // field 999, varint 1
    const merged = codec.decode(Buffer.concat([a, unknown, b])) as Record<string, any>;
    expect(merged.child.fInt32).toBe(1);
    expect(merged.child.fString).toBe("x");
  });

  it("refuses malformed input: truncation, overlong lengths, invalid UTF-8, wrong wire types, field number zero", () => {
    const codec = compileCodec(ClaimResponseSchema)!;
    const good = toBinary(
      ClaimResponseSchema,
      create(ClaimResponseSchema, { items: [{ id: "01J", payloadJson: '{"a":1}', priority: 2 }], affinityKeys: ["k"] }),
    );
    // Every prefix: refused exactly where protobuf-es refuses it (a cut at a field boundary is a valid, shorter message).
    let refused = 0;
    for (let cut = 1; cut < good.length; cut++) {
      const prefix = good.subarray(0, cut);
      let reference: unknown;
      try {
        reference = fromBinary(ClaimResponseSchema, prefix);
      } catch {
        expect(() => codec.decode(prefix), `cut at ${cut}`).toThrow();
        refused++;
        continue;
      }
      expect(codec.decode(prefix), `cut at ${cut}`).toEqual(reference);
    }
    expect(refused).toBeGreaterThan(good.length / 2);
    expect(() => codec.decode(Buffer.from([0x1a, 0x05, 0x61]))).toThrow(/premature end/); // affinity_keys says 5 bytes, has 1
    expect(() => codec.decode(Buffer.from([0x1a, 0x02, 0xc3, 0x28]))).toThrow(); // invalid UTF-8
    expect(() => fromBinary(ClaimResponseSchema, Buffer.from([0x1a, 0x02, 0xc3, 0x28]))).toThrow(); // as the reference does
    expect(() => codec.decode(Buffer.from([0x10, 0x01, 0x18, 0x01]))).toThrow(/wire type/); // affinity_keys as a varint
    expect(() => codec.decode(Buffer.from([0x00, 0x01]))).toThrow(/field no 0/);
  });
});
