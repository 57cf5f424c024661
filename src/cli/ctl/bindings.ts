/** aiflowctl's affinity-binding commands: bindings list, unbind, rebind. */
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { ListBindingsResponseSchema, RebindResponseSchema, UnbindResponseSchema, type Binding } from "@aiflow/wire/gen/aiflow/cluster/v1/ops_pb.js";
import { UsageError } from "./args.js";
import { pageOf, printJson, type Command } from "./command.js";
import { table } from "./format.js";

function bindingRows(bindings: readonly Binding[]): string {
  const when = (b: Binding) => new Date(timestampMs(b.updatedOn ?? b.createdOn!)).toISOString();
  return table(
    ["TENANT", "KEY", "AGENT", "SINCE"],
    bindings.map((b) => [b.tenantKey, b.affinityKey, b.agentId, when(b)]),
  );
}

export const bindingCommands: Command[] = [
  {
    name: "bindings",
    usage: [
      "  bindings list [--tenant T] [--key-prefix P] [--agent A] [--limit N]  affinity keys and the agents they pin a tenant's work to",
      "  bindings unbind KEY [--tenant T]                                  free a key: its next item binds it anew",
      "  bindings rebind KEY AGENT [--tenant T]                            pin a key to another (active) agent of its tenant",
    ],
    flags: [
      {
        name: "tenant",
        kind: "value",
        arg: "T",
        help: "the bindings' tenant (a key is bound per tenant); unbind and rebind need it when the key is bound in several",
        default: "every tenant the token may see",
      },
      { name: "key-prefix", kind: "value", arg: "P", help: "list: only keys starting with P" },
      { name: "agent", kind: "value", arg: "A", help: "list: only keys bound to this agent" },
      { name: "limit", kind: "value", arg: "N", help: "list: bindings per page (at most 1000)", default: "100" },
      { name: "page-token", kind: "value", arg: "TOKEN", help: "list: the page after the one that printed it" },
    ],
    exits: ["1 also when unbind or rebind is refused because items of the key are in flight elsewhere"],
    fields: { tenant_key: "--tenant", key_prefix: "--key-prefix", agent_id: "AGENT", affinity_key: "KEY", page_token: "--page-token" },
    async run(ctx) {
      const [sub, key, agent] = ctx.args.positionals;
      switch (sub) {
        case "list": {
          const res = await ctx.ops.listBindings({
            tenantKey: ctx.args.get("tenant") ?? "",
            keyPrefix: ctx.args.get("key-prefix") ?? "",
            agentId: ctx.args.get("agent") ?? "",
            ...pageOf(ctx.args),
          });
          if (ctx.json) printJson(ctx, ListBindingsResponseSchema, res);
          else
            ctx.out((res.bindings.length ? bindingRows(res.bindings) : "no bindings") + (res.nextPageToken ? `\nmore: --page-token ${res.nextPageToken}` : ""));
          return 0;
        }
        case "unbind": {
          if (!key) throw new UsageError("give the KEY: aiflowctl bindings unbind KEY");
          const res = await ctx.ops.unbind({ affinityKey: key, tenantKey: ctx.args.get("tenant") ?? "" });
          if (ctx.json) printJson(ctx, UnbindResponseSchema, res);
          else ctx.out(`unbound ${key}`);
          return 0;
        }
        case "rebind": {
          if (!key || !agent) throw new UsageError("give the KEY and the AGENT: aiflowctl bindings rebind KEY AGENT");
          const res = await ctx.ops.rebind({ affinityKey: key, agentId: agent, tenantKey: ctx.args.get("tenant") ?? "" });
          if (ctx.json) printJson(ctx, RebindResponseSchema, res);
          else ctx.out(`${key} is bound to ${res.binding?.agentId ?? agent}`);
          return 0;
        }
        default:
          throw new UsageError("usage: aiflowctl bindings list|unbind|rebind ...");
      }
    },
  },
];
