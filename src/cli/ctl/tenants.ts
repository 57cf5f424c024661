/** aiflowctl's fair-share commands: tenants list, set-weight, clear-weight. */
import { ListTenantsResponseSchema, SetTenantWeightResponseSchema, type Tenant } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { UsageError } from "./args.js";
import { printJson, type Command } from "./command.js";
import { table } from "./format.js";

function tenantRows(tenants: readonly Tenant[]): string {
  return table(
    ["TENANT", "WEIGHT", "SOURCE", "PENDING", "DISPATCHED"],
    tenants.map((t) => [t.tenantKey, String(t.weight), t.weightSource, String(t.pending), String(t.dispatched)]),
  );
}

const summary = (t: Tenant | undefined) => (t ? `: weight ${t.weight} (${t.weightSource}), ${t.pending} pending, ${t.dispatched} dispatched` : "");

/** WEIGHT as typed: a number; the daemon checks its range. */
function weightOf(raw: string): number {
  const n = Number(raw);
  if (raw.trim() === "" || !Number.isFinite(n)) throw new UsageError(`WEIGHT must be a number, got '${raw}'`);
  return n;
}

export const tenantCommands: Command[] = [
  {
    name: "tenants",
    usage: [
      "  tenants list [--tenant T]                                         tenants: fair-share weight, its source, pending, dispatched",
      "  tenants set-weight TENANT WEIGHT                                  an operator's weight (0.001-1000); it respaces the tenant's backlog",
      "  tenants clear-weight TENANT                                       drop the operator's weight: the configured one, else 1, applies",
    ],
    flags: [{ name: "tenant", kind: "value", arg: "T", help: "list: only this tenant", default: "every tenant the token may see" }],
    fields: { tenant_key: "TENANT", weight: "WEIGHT" },
    async run(ctx) {
      const [sub, tenant, weight] = ctx.args.positionals;
      switch (sub) {
        case "list": {
          const res = await ctx.ops.listTenants({ tenantKey: ctx.args.get("tenant") ?? "" });
          if (ctx.json) printJson(ctx, ListTenantsResponseSchema, res);
          else ctx.out(res.tenants.length ? tenantRows(res.tenants) : "no tenants");
          return 0;
        }
        case "set-weight": {
          if (tenant === undefined || weight === undefined) throw new UsageError("give the TENANT and the WEIGHT: aiflowctl tenants set-weight TENANT WEIGHT");
          const w = weightOf(weight);
          const res = await ctx.ops.setTenantWeight({ tenantKey: tenant, weight: w });
          if (ctx.json) printJson(ctx, SetTenantWeightResponseSchema, res);
          else ctx.out(`set the weight of ${tenant} to ${w}${summary(res.tenant)}`);
          return 0;
        }
        case "clear-weight": {
          if (tenant === undefined) throw new UsageError("give the TENANT: aiflowctl tenants clear-weight TENANT");
          const res = await ctx.ops.setTenantWeight({ tenantKey: tenant, clear: true });
          if (ctx.json) printJson(ctx, SetTenantWeightResponseSchema, res);
          else ctx.out(`cleared the weight of ${tenant}${summary(res.tenant)}`);
          return 0;
        }
        default:
          throw new UsageError("usage: aiflowctl tenants list|set-weight|clear-weight ...");
      }
    },
  },
];
