/**
 * What an aiflowctl command is: its usage lines (as the command list shows them), its flags with
 * their defaults, its exit codes, the proto fields its flags fill (so the daemon's refusals name
 * the flag a person typed), and what it runs. Shared helpers for reading flags live here too.
 */
import { toJson, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import type { createClient } from "@connectrpc/connect";
import { parseDuration } from "../../config.js";
import type { OpsService } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import type { QueueService } from "@aiflow/wire/gen/aiflow/cluster/v1/queue_pb.js";
import type { DagService } from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import type { TriggerService } from "@aiflow/wire/gen/aiflow/trigger/v1/trigger_pb.js";
import type { GraphService } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import type { MachineService } from "@aiflow/wire/gen/aiflow/machine/v1/machine_pb.js";
import { WorkItemStatus } from "@aiflow/wire/gen/aiflow/cluster/v1/work_item_pb.js";
import { UsageError, type Parsed } from "./args.js";
import { withIsoTimes } from "./json-times.js";

export interface Flag {
  name: string;
  kind: "bool" | "value" | "repeat";
  /** The value's placeholder in help (`D`, `K=V`). */
  arg?: string;
  /** Shown as "default: …"; omitted when the flag has none. */
  default?: string;
  help: string;
}

export interface Ctx {
  args: Parsed;
  json: boolean;
  address: string;
  ops: ReturnType<typeof createClient<typeof OpsService>>;
  queue: ReturnType<typeof createClient<typeof QueueService>>;
  dag: ReturnType<typeof createClient<typeof DagService>>;
  triggers: ReturnType<typeof createClient<typeof TriggerService>>;
  graph: ReturnType<typeof createClient<typeof GraphService>>;
  machine: ReturnType<typeof createClient<typeof MachineService>>;
  out(text: string): void;
}

export interface Command {
  name: string;
  /** Lines of the command list, each "  USAGE   SUMMARY" (continuation lines indented further). */
  usage: string[];
  flags: Flag[];
  /** Exit codes beyond 0, 1 and 2, which every command has. */
  exits?: string[];
  /** Proto field → what the person typed (`tenant_key` → `--tenant`), for the daemon's refusals. */
  fields?: Record<string, string>;
  /** The role the command's token needs. */
  role?: "ops" | "engine" | "runs";
  run(ctx: Ctx): Promise<number>;
}

export function printJson<D extends DescMessage>(ctx: Ctx, schema: D, msg: MessageShape<D>): void {
  ctx.out(JSON.stringify(withIsoTimes(toJson(schema, msg, { alwaysEmitImplicit: true })), null, 2));
}

/** A duration flag; a malformed one is a usage error (exit 2), found before anything is sent. */
export function durationFlag(args: Parsed, flag: string, fallback: string): number;
export function durationFlag(args: Parsed, flag: string): number | undefined;
export function durationFlag(args: Parsed, flag: string, fallback?: string): number | undefined {
  const raw = args.get(flag) ?? fallback;
  if (raw === undefined) return undefined;
  try {
    return parseDuration(raw, `--${flag}`);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

/** A whole-number flag; anything else is a usage error, not a NaN sent as zero. */
export function wholeFlag(args: Parsed, flag: string, fallback: number): number {
  const raw = args.get(flag);
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (raw.trim() === "" || !Number.isSafeInteger(n) || n < 0) throw new UsageError(`--${flag} must be a whole number, got '${raw}'`);
  return n;
}

/** A list call's page from --limit (default 100) and --page-token. */
export const pageOf = (args: Parsed) => ({ pageSize: wholeFlag(args, "limit", 100), pageToken: args.get("page-token") ?? "" });

/** The first positional, which the command needs. */
export const one = (args: Parsed, what: string) => {
  const v = args.positionals[0];
  if (!v) throw new UsageError(`give the ${what}`);
  return v;
};

export const statusesOf = (names: readonly string[]) =>
  names.map((n) => {
    const v = (WorkItemStatus as unknown as Record<string, number>)[n.toUpperCase()];
    if (v === undefined || v === 0) throw new UsageError(`unknown status '${n}' (pending, dispatched, completed, failed, cancelled)`);
    return v as WorkItemStatus;
  });

/** The flag specs as parseFlags takes them. */
export const flagKinds = (flags: readonly Flag[]) => ({
  bool: flags.filter((f) => f.kind === "bool").map((f) => f.name),
  value: flags.filter((f) => f.kind === "value").map((f) => f.name),
  repeat: flags.filter((f) => f.kind === "repeat").map((f) => f.name),
});
