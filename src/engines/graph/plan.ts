/**
 * A graph definition, checked and planned: what a run keeps (aiflow_graph_run.plan) and walks.
 * Every refusal is INVALID_ARGUMENT naming the node, edge or field (RESOURCE_EXHAUSTED over the
 * size caps).
 */
import { toJson } from "@bufbuild/protobuf";
import { DefinitionSchema, NodeKind, type Definition } from "@aiflow/wire/gen/aiflow/graph/v1/graph_pb.js";
import { invalidArgument } from "../../domain/errors.js";
import { optionalText } from "../../domain/input.js";
import { checkCondition, checkName, checkSize, DEFINITION_ID_MAX, reachable, workPlan, type Limits, type WorkPlan } from "../definition-parts.js";

/** What an edge's condition may read. */
export const EDGE_ROOTS = ["result", "state", "steps", "visits"] as const;
export const MAX_STEPS = 100_000;
const DEFAULT_MAX_STEPS = 1_000;

export interface GraphNodePlan {
  name: string;
  kind: "task" | "end";
  /** Null for an end node. */
  work: WorkPlan | null;
  /** 0: no bound but the run's max steps. */
  maxVisits: number;
}

export interface EdgePlan {
  from: string;
  to: string;
  /** The condition's text ("" is always). */
  when: string;
}

export interface GraphPlan {
  definitionId: string;
  start: string;
  maxSteps: number;
  nodes: GraphNodePlan[];
  edges: EdgePlan[];
}

export function graphPlanOf(def: Definition, limits: Limits, inline: boolean): GraphPlan {
  checkSize(toJson(DefinitionSchema, def), def.nodes.length + def.edges.length, "nodes and edges", limits);
  const definitionId = optionalText(def.id, "definition.id", DEFINITION_ID_MAX) ?? (inline ? "inline" : null);
  if (definitionId === null) throw invalidArgument("definition.id", "is required");
  if (def.nodes.length === 0) throw invalidArgument("definition.nodes", "needs at least one node");
  const nodes = new Map<string, GraphNodePlan>();
  def.nodes.forEach((n, i) => {
    const where = `node '${n.name}'`;
    checkName(n.name, `nodes[${i}]`);
    if (nodes.has(n.name)) throw invalidArgument(where, "is a duplicate name: node names are unique in a definition");
    if (n.maxVisits < 0n || n.maxVisits > BigInt(MAX_STEPS)) throw invalidArgument(`${where}.max_visits`, `${n.maxVisits} is outside 0..${MAX_STEPS}`);
    if (n.kind === NodeKind.END) {
      if (n.engineKind !== "" || n.payloadJson !== "")
        throw invalidArgument(where, "is an end node: it runs nothing, so it has no engine_kind or payload_json");
      nodes.set(n.name, { name: n.name, kind: "end", work: null, maxVisits: 0 });
    } else if (n.kind === NodeKind.TASK || n.kind === NodeKind.UNSPECIFIED) {
      nodes.set(n.name, { name: n.name, kind: "task", work: workPlan(n, where, limits), maxVisits: Number(n.maxVisits) });
    } else throw invalidArgument(`${where}.kind`, `unknown value ${n.kind}`);
  });
  const edges = def.edges.map((e, i) => {
    const where = `edge ${i} ('${e.from}' -> '${e.to}')`;
    for (const [end, name] of [
      ["from", e.from],
      ["to", e.to],
    ] as const)
      if (!nodes.has(name)) throw invalidArgument(`${where}.${end}`, `names '${name}', which is not a node of the definition`);
    if (nodes.get(e.from)!.kind === "end") throw invalidArgument(where, `leaves end node '${e.from}': reaching an end node completes the run`);
    return { from: e.from, to: e.to, when: checkCondition(e.when, EDGE_ROOTS, `${where}.when`) };
  });
  for (const n of nodes.values())
    if (n.kind === "task" && !edges.some((e) => e.from === n.name))
      throw invalidArgument(`node '${n.name}'`, "has no edges: a run reaching it could not go on (give it an edge, or make it an end node)");
  const start = def.start.trim();
  if (!nodes.has(start))
    throw invalidArgument(
      "definition.start",
      start === "" ? "is required: the node a run starts at" : `names '${start}', which is not a node of the definition`,
    );
  if (nodes.get(start)!.kind === "end") throw invalidArgument("definition.start", `'${start}' is an end node: the run would end as it starts`);
  const seen = reachable(start, (name) => edges.filter((e) => e.from === name).map((e) => e.to));
  if (![...seen].some((name) => nodes.get(name)!.kind === "end"))
    throw invalidArgument("definition", `no end node is reachable from the start '${start}': every run would end at a bound`);
  const maxSteps = def.maxSteps === 0n ? DEFAULT_MAX_STEPS : Number(def.maxSteps);
  if (maxSteps < 1 || maxSteps > MAX_STEPS) throw invalidArgument("definition.max_steps", `${def.maxSteps} is outside 1..${MAX_STEPS}`);
  return { definitionId, start, maxSteps, nodes: [...nodes.values()], edges };
}
