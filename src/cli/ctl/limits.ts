/** aiflowctl's rate-limit commands: limits list, set, clear. */
import { durationFromMs, timestampMs, type Duration } from "@bufbuild/protobuf/wkt";
import { ListRateLimitsResponseSchema, SetRateLimitResponseSchema, type RateLimitKey, type RateLimitRule } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { parseDuration } from "../../config.js";
import { UsageError } from "./args.js";
import { pageOf, printJson, wholeFlag, type Command } from "./command.js";
import { table } from "./format.js";

/** An interval as COUNT/INTERVAL takes it back: whole days, hours, minutes or seconds when it is one, else milliseconds. */
export function intervalText(d: Duration | undefined): string {
  if (!d) return "-";
  const ns = d.seconds * 1_000_000_000n + BigInt(d.nanos);
  if (ns % 1_000_000_000n === 0n) {
    const s = ns / 1_000_000_000n;
    for (const [unit, n] of [
      ["d", 86_400n],
      ["h", 3_600n],
      ["m", 60n],
    ] as const)
      if (s % n === 0n) return `${s / n}${unit}`;
    return `${s}s`;
  }
  return `${Number(ns) / 1e6}ms`;
}

const limitText = (r: RateLimitRule) => `${r.count}/${intervalText(r.interval)}`;
const sourceText = (r: RateLimitRule | undefined) => (r ? (r.prefix ? `prefix ${r.key}` : "key") : "-");

function ruleRows(rules: readonly RateLimitRule[]): string {
  return table(
    ["TENANT", "KEY", "ON", "LIMIT", "BURST"],
    rules.map((r) => [r.tenantKey, r.key, r.prefix ? "prefix" : "key", limitText(r), String(r.burst)]),
  );
}

function keyRows(keys: readonly RateLimitKey[]): string {
  return table(
    ["TENANT", "KEY", "LIMIT", "SOURCE", "NEXT SLOT"],
    keys.map((k) => [
      k.tenantKey,
      k.key,
      k.limit ? limitText(k.limit) : "-",
      sourceText(k.limit),
      k.nextSlotAt ? new Date(timestampMs(k.nextSlotAt)).toISOString() : "-",
    ]),
  );
}

/** COUNT/INTERVAL as typed (50/1s, 600/1m, 10/s): a whole count and a duration; the daemon checks their ranges. */
export function rateOf(raw: string): { count: number; interval: Duration } {
  const slash = raw.indexOf("/");
  const countText = slash > 0 ? raw.slice(0, slash).trim() : "";
  const count = Number(countText);
  if (slash <= 0 || countText === "" || !Number.isSafeInteger(count) || count < 0)
    throw new UsageError(`COUNT/INTERVAL must be a whole count, a slash and a duration (50/1s, 600/1m), got '${raw}'`);
  const per = raw.slice(slash + 1).trim();
  let ms: number;
  try {
    ms = parseDuration(/^(ms|s|m|h|d)$/.test(per) ? `1${per}` : per, "COUNT/INTERVAL");
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  return { count, interval: durationFromMs(ms) };
}

export const limitCommands: Command[] = [
  {
    name: "limits",
    usage: [
      "  limits list [--tenant T] [--key-prefix P] [--limit N]             rate limits on keys and prefixes, and the keys' next slots",
      "  limits set TENANT KEY COUNT/INTERVAL [--burst N] [--prefix]       an operator's rate limit on a key (or key prefix): 50/1s",
      "  limits clear TENANT KEY [--prefix]                                remove it: the key's prefix's limit, or none, applies",
    ],
    flags: [
      { name: "tenant", kind: "value", arg: "T", help: "list: only this tenant's", default: "every tenant the token may see" },
      { name: "key-prefix", kind: "value", arg: "P", help: "list: only rules and keys starting with P" },
      { name: "burst", kind: "value", arg: "N", help: "set: dispatches that may go at once (at most COUNT + N - 1 in any INTERVAL)", default: "1" },
      { name: "prefix", kind: "bool", help: "set, clear: KEY is a prefix; the limit holds each key starting with it that has none of its own" },
      { name: "limit", kind: "value", arg: "N", help: "list: keys per page (at most 1000)", default: "100" },
      { name: "page-token", kind: "value", arg: "TOKEN", help: "list: the page after the one that printed it" },
    ],
    fields: {
      tenant_key: "TENANT",
      key_prefix: "--key-prefix",
      key: "KEY",
      count: "COUNT/INTERVAL",
      interval: "COUNT/INTERVAL",
      burst: "--burst",
      page_token: "--page-token",
    },
    async run(ctx) {
      const [sub, tenant, key, rate] = ctx.args.positionals;
      const prefix = ctx.args.has("prefix");
      switch (sub) {
        case "list": {
          const res = await ctx.ops.listRateLimits({
            tenantKey: ctx.args.get("tenant") ?? "",
            keyPrefix: ctx.args.get("key-prefix") ?? "",
            ...pageOf(ctx.args),
          });
          if (ctx.json) printJson(ctx, ListRateLimitsResponseSchema, res);
          else
            ctx.out(
              (res.rules.length ? ruleRows(res.rules) : "no rate limits") +
                (res.keys.length ? `\n\nkeys:\n${keyRows(res.keys)}` : "") +
                (res.nextPageToken ? `\nmore: --page-token ${res.nextPageToken}` : ""),
            );
          return 0;
        }
        case "set": {
          if (tenant === undefined || key === undefined || rate === undefined)
            throw new UsageError("give the TENANT, the KEY and the COUNT/INTERVAL: aiflowctl limits set TENANT KEY COUNT/INTERVAL [--burst N] [--prefix]");
          const { count, interval } = rateOf(rate);
          const burst = wholeFlag(ctx.args, "burst", 1);
          const res = await ctx.ops.setRateLimit({ tenantKey: tenant, key, prefix, count, interval, burst });
          if (ctx.json) printJson(ctx, SetRateLimitResponseSchema, res);
          else {
            const r = res.rule;
            const what = prefix ? `keys starting with ${key} in ${tenant}` : `${key} in ${tenant}`;
            ctx.out(`${what}: at most ${r ? limitText(r) : rate}${prefix ? " each" : ""}, ${r?.burst ?? burst} at once`);
          }
          return 0;
        }
        case "clear": {
          if (tenant === undefined || key === undefined) throw new UsageError("give the TENANT and the KEY: aiflowctl limits clear TENANT KEY [--prefix]");
          const res = await ctx.ops.setRateLimit({ tenantKey: tenant, key, prefix, clear: true });
          if (ctx.json) printJson(ctx, SetRateLimitResponseSchema, res);
          else if (prefix) ctx.out(`cleared the rate limit of keys starting with ${key} in ${tenant}`);
          else {
            const now = res.key?.limit;
            ctx.out(`cleared the rate limit of ${key} in ${tenant}: ${now ? `${limitText(now)} (prefix ${now.key}) applies` : "it is not limited"}`);
          }
          return 0;
        }
        default:
          throw new UsageError("usage: aiflowctl limits list|set|clear ...");
      }
    },
  },
];
