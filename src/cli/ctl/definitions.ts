/**
 * aiflowctl's definition commands (role `runs`): definitions list, get, put, one command for the
 * three engines that store definitions, picked with --engine (dag, graph or statemachine, as a
 * trigger's engine_kind names them; dag by default, as for triggers). Each is the engine service's
 * PutDefinition, GetDefinition or ListDefinitions; a definition belongs to its tenant.
 *
 * What must stay true: `get` prints the definition alone, as protobuf JSON, on stdout, so that
 * `definitions get ID > f.json`, an edit and `definitions put f.json` round-trip it; who stored it
 * and when go to stderr (with --json, the whole answer goes to stdout).
 */
import { timestampMs, type Timestamp } from "@bufbuild/protobuf/wkt";
import { create, toJson, type DescMessage } from "@bufbuild/protobuf";
import * as dag from "@aiflow/wire/gen/aiflow/dag/v1/dag_pb.js";
import * as graph from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import * as machine from "@aiflow/wire/gen/aiflow/machine/v1/machine_pb.js";
import { UsageError, type Parsed } from "./args.js";
import { printJson, wholeFlag, type Command, type Ctx } from "./command.js";
import { table } from "./format.js";
import { messageFromFile } from "./message-file.js";

const USAGE = {
  list: "aiflowctl definitions list --tenant T [--engine E] [--limit N]",
  get: "aiflowctl definitions get ID --tenant T [--engine E]",
  put: "aiflowctl definitions put FILE --tenant T [--engine E]",
};
const PAGE_MAX = 500;

type Engine = "dag" | "graph" | "statemachine";
interface StoredWire {
  definitionId: string;
  createdBy: string;
  createdOn?: Timestamp;
  updatedBy: string;
  updatedOn?: Timestamp;
}
/** What the three services' definition calls have in common, so each command is written once. */
interface Calls {
  definition: DescMessage;
  get: DescMessage;
  list: DescMessage;
  put: DescMessage;
  putDefinition(tenantKey: string, definition: unknown): Promise<{ definitionId: string; created: boolean }>;
  getDefinition(tenantKey: string, definitionId: string): Promise<{ definition?: unknown; stored?: StoredWire }>;
  listDefinitions(tenantKey: string, pageSize: number, pageToken: string): Promise<{ definitions: StoredWire[]; nextPageToken: string }>;
}

function callsOf(ctx: Ctx, engine: Engine): Calls {
  // Each service's generated client and schemas; the casts only join three identical shapes.
  const c = { dag: [ctx.dag, dag], graph: [ctx.graph, graph], statemachine: [ctx.machine, machine] }[engine] as unknown as [
    {
      putDefinition(r: object): Promise<{ definitionId: string; created: boolean }>;
      getDefinition(r: object): Promise<{ definition?: unknown; stored?: StoredWire }>;
      listDefinitions(r: object): Promise<{ definitions: StoredWire[]; nextPageToken: string }>;
    },
    typeof dag,
  ];
  const [client, s] = c;
  return {
    definition: s.DefinitionSchema,
    get: s.GetDefinitionResponseSchema,
    list: s.ListDefinitionsResponseSchema,
    put: s.PutDefinitionResponseSchema,
    putDefinition: (tenantKey, definition) => client.putDefinition({ tenantKey, definition }),
    getDefinition: (tenantKey, definitionId) => client.getDefinition({ tenantKey, definitionId }),
    listDefinitions: (tenantKey, pageSize, pageToken) => client.listDefinitions({ tenantKey, pageSize, pageToken }),
  };
}

function engineOf(args: Parsed): Engine {
  const e = args.get("engine") ?? "dag";
  if (e === "dag" || e === "graph" || e === "statemachine") return e;
  if (e === "machine") return "statemachine";
  throw new UsageError(`--engine: '${e}' is not an engine that stores definitions: give dag, graph or statemachine`);
}

function tenantOf(args: Parsed): string {
  const t = args.get("tenant");
  if (!t) throw new UsageError("give the tenant: --tenant T");
  return t;
}

const iso = (ts: Timestamp | undefined) => (ts ? new Date(timestampMs(ts)).toISOString() : "-");

async function list(ctx: Ctx, calls: Calls, tenantKey: string): Promise<number> {
  const limit = wholeFlag(ctx.args, "limit", 100);
  if (limit < 1) throw new UsageError("--limit must be at least 1");
  const found: StoredWire[] = [];
  let pageToken = ctx.args.get("page-token") ?? "";
  // Each page asks for no more than is still wanted, so the last token is exactly where --limit stopped.
  do {
    const res = await calls.listDefinitions(tenantKey, Math.min(PAGE_MAX, limit - found.length), pageToken);
    found.push(...res.definitions);
    pageToken = res.nextPageToken;
  } while (pageToken && found.length < limit);
  if (ctx.json) printJson(ctx, calls.list, create(calls.list, { definitions: found, nextPageToken: pageToken } as never) as never);
  else {
    const rows = found.map((d) => [d.definitionId, iso(d.updatedOn), d.updatedBy || "-", d.createdBy || "-"]);
    ctx.out(
      (rows.length ? table(["DEFINITION", "UPDATED", "UPDATED BY", "CREATED BY"], rows) : "no definitions") +
        (pageToken ? `\nmore: --page-token ${pageToken} (or a larger --limit)` : ""),
    );
  }
  return 0;
}

export const definitionCommands: Command[] = [
  {
    name: "definitions",
    usage: [
      "  definitions list --tenant T [--engine E] [--limit N]              the tenant's stored definitions of engine E, by id",
      "  definitions get ID --tenant T [--engine E]                        one stored definition as protobuf JSON (who stored it: stderr)",
      "  definitions put FILE --tenant T [--engine E]                      store a definition under its id, replacing one stored before",
      "                                                                    (FILE: protobuf JSON, - for stdin); triggers and StartRun name it",
    ],
    flags: [
      { name: "tenant", kind: "value", arg: "T", help: "the definitions' tenant (required)" },
      { name: "engine", kind: "value", arg: "E", help: "the engine: dag, graph or statemachine (or machine)", default: "dag" },
      { name: "limit", kind: "value", arg: "N", help: "list: at most N definitions, read page by page", default: "100" },
      { name: "page-token", kind: "value", arg: "TOKEN", help: "list: start after the definitions that printed it" },
    ],
    role: "runs",
    fields: { tenant_key: "--tenant", definition_id: "ID", page_size: "--limit", page_token: "--page-token" },
    async run(ctx) {
      const sub = ctx.args.positionals[0];
      if (!sub || !Object.keys(USAGE).includes(sub))
        throw new UsageError(`${sub ? `unknown definitions subcommand '${sub}'` : "give the subcommand"}: list, get or put (see aiflowctl definitions --help)`);
      const engine = engineOf(ctx.args);
      const tenantKey = tenantOf(ctx.args);
      const calls = callsOf(ctx, engine);
      switch (sub) {
        case "list":
          return list(ctx, calls, tenantKey);
        case "get": {
          const id = ctx.args.positionals[1];
          if (!id) throw new UsageError(`give the definition ID: ${USAGE.get}`);
          const res = await calls.getDefinition(tenantKey, id);
          if (ctx.json) printJson(ctx, calls.get, res as never);
          else {
            const s = res.stored;
            ctx.out(JSON.stringify(toJson(calls.definition, res.definition as never), null, 2));
            if (s)
              process.stderr.write(
                `${engine} definition ${s.definitionId}: stored by ${s.createdBy} at ${iso(s.createdOn)}, last by ${s.updatedBy} at ${iso(s.updatedOn)}\n`,
              );
          }
          return 0;
        }
        default: {
          const file = ctx.args.positionals[1];
          if (!file) throw new UsageError(`give the definition FILE (or - for stdin): ${USAGE.put}`);
          const definition = await messageFromFile(file, calls.definition);
          const res = await calls.putDefinition(tenantKey, definition);
          if (ctx.json) printJson(ctx, calls.put, res as never);
          else ctx.out(`${res.created ? "stored" : "replaced"} ${engine} definition ${res.definitionId}`);
          return 0;
        }
      }
    },
  },
];
