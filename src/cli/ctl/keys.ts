/** aiflowctl's concurrency-key commands: keys list, keys set. */
import {
  ListConcurrencyKeysResponseSchema,
  SetConcurrencyLimitResponseSchema,
  type ConcurrencyKey,
  type ConcurrencyRule,
} from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { UsageError } from "./args.js";
import { pageOf, printJson, type Command } from "./command.js";
import { table } from "./format.js";

function keyRows(keys: readonly ConcurrencyKey[]): string {
  return table(
    ["TENANT", "KEY", "LIMIT", "SOURCE", "IN FLIGHT", "PENDING"],
    keys.map((k) => [k.tenantKey, k.key, k.limit ? String(k.limit) : "-", k.limitSource || "-", String(k.inFlight), String(k.pending)]),
  );
}

function ruleRows(rules: readonly ConcurrencyRule[]): string {
  return table(
    ["TENANT", "PREFIX", "MAX IN FLIGHT"],
    rules.map((r) => [r.tenantKey, r.keyPrefix, String(r.maxInFlight)]),
  );
}

/** MAX as typed: a whole number (0 clears); the daemon checks its range. */
function maxOf(raw: string): number {
  const n = Number(raw);
  if (raw.trim() === "" || !Number.isSafeInteger(n) || n < 0) throw new UsageError(`MAX must be a whole number (0 clears the limit), got '${raw}'`);
  return n;
}

export const keyCommands: Command[] = [
  {
    name: "keys",
    usage: [
      "  keys list [--tenant T] [--key-prefix P] [--limit N]               concurrency keys: limit, its source, in flight, pending",
      "  keys set KEY MAX --tenant T [--prefix]                            an operator's limit on a key (or key prefix); MAX 0 clears it",
    ],
    flags: [
      { name: "tenant", kind: "value", arg: "T", help: "the keys' tenant (set needs it)", default: "every tenant the token may see" },
      { name: "key-prefix", kind: "value", arg: "P", help: "list: only keys starting with P" },
      { name: "prefix", kind: "bool", help: "set: KEY is a prefix; the limit holds every key starting with it that has none of its own" },
      { name: "limit", kind: "value", arg: "N", help: "list: keys per page (at most 1000)", default: "100" },
      { name: "page-token", kind: "value", arg: "TOKEN", help: "list: the page after the one that printed it" },
    ],
    fields: { tenant_key: "--tenant", key_prefix: "--key-prefix", key: "KEY", max_in_flight: "MAX", page_token: "--page-token" },
    async run(ctx) {
      const [sub, key, max] = ctx.args.positionals;
      switch (sub) {
        case "list": {
          const res = await ctx.ops.listConcurrencyKeys({
            tenantKey: ctx.args.get("tenant") ?? "",
            keyPrefix: ctx.args.get("key-prefix") ?? "",
            ...pageOf(ctx.args),
          });
          if (ctx.json) printJson(ctx, ListConcurrencyKeysResponseSchema, res);
          else
            ctx.out(
              (res.keys.length ? keyRows(res.keys) : "no concurrency keys") +
                (res.nextPageToken ? `\nmore: --page-token ${res.nextPageToken}` : "") +
                (res.rules.length ? `\n\nprefix rules:\n${ruleRows(res.rules)}` : ""),
            );
          return 0;
        }
        case "set": {
          if (key === undefined || max === undefined) throw new UsageError("give the KEY and the MAX: aiflowctl keys set KEY MAX --tenant T [--prefix]");
          const tenant = ctx.args.get("tenant");
          if (!tenant) throw new UsageError("give the key's tenant: --tenant T");
          const prefix = ctx.args.has("prefix");
          const n = maxOf(max);
          const res = await ctx.ops.setConcurrencyLimit({ tenantKey: tenant, key, prefix, maxInFlight: n });
          if (ctx.json) printJson(ctx, SetConcurrencyLimitResponseSchema, res);
          else if (prefix)
            ctx.out(n ? `keys starting with ${key} in ${tenant}: at most ${n} in flight each` : `cleared the limit of keys starting with ${key} in ${tenant}`);
          else {
            const k = res.key;
            const now = k
              ? k.limit
                ? `limit ${k.limit} (${k.limitSource}), ${k.inFlight} in flight, ${k.pending} pending`
                : `no limit known, ${k.inFlight} in flight, ${k.pending} pending`
              : "";
            ctx.out(`${n ? `set the limit of ${key} in ${tenant} to ${n}` : `cleared the limit of ${key} in ${tenant}`}${now ? `: ${now}` : ""}`);
          }
          return 0;
        }
        default:
          throw new UsageError("usage: aiflowctl keys list|set ...");
      }
    },
  },
];
