/**
 * A state-machine definition, checked and planned: what a run keeps (aiflow_machine_run.plan).
 * Every refusal is INVALID_ARGUMENT naming the state, transition or field (RESOURCE_EXHAUSTED over
 * the size caps).
 */
import { toJson } from "@bufbuild/protobuf";
import { DefinitionSchema, type Definition } from "@aiflow/wire/gen/aiflow/machine/v1/machine_pb.js";
import { invalidArgument } from "../../domain/errors.js";
import { optionalText } from "../../domain/input.js";
import { checkCondition, checkName, checkSize, DEFINITION_ID_MAX, reachable, workPlan, type Limits, type WorkPlan } from "../definition-parts.js";

/** What a guard may read. */
export const GUARD_ROOTS = ["event", "context"] as const;
export const EVENT = /^[A-Za-z0-9_.:-]{1,128}$/;

export interface TransitionPlan {
  event: string;
  to: string;
  /** The guard's text ("" is always). */
  guard: string;
  action: WorkPlan | null;
}

export interface StatePlan {
  name: string;
  terminal: boolean;
  transitions: TransitionPlan[];
}

export interface MachinePlan {
  definitionId: string;
  initial: string;
  states: StatePlan[];
}

export function machinePlanOf(def: Definition, limits: Limits, inline: boolean): MachinePlan {
  checkSize(
    toJson(DefinitionSchema, def),
    def.states.reduce((n, s) => n + 1 + s.transitions.length, 0),
    "states and transitions",
    limits,
  );
  const definitionId = optionalText(def.id, "definition.id", DEFINITION_ID_MAX) ?? (inline ? "inline" : null);
  if (definitionId === null) throw invalidArgument("definition.id", "is required");
  if (def.states.length === 0) throw invalidArgument("definition.states", "needs at least one state");
  const names = new Set<string>();
  def.states.forEach((s, i) => {
    checkName(s.name, `states[${i}]`);
    if (names.has(s.name)) throw invalidArgument(`state '${s.name}'`, "is a duplicate name: state names are unique in a definition");
    names.add(s.name);
  });
  const states = def.states.map((s): StatePlan => {
    const where = `state '${s.name}'`;
    if (s.terminal && s.transitions.length > 0) throw invalidArgument(where, "is terminal: reaching it ends the machine, so it has no transitions");
    if (!s.terminal && s.transitions.length === 0)
      throw invalidArgument(where, "has no transitions and is not terminal: a machine resting there could never move or end");
    const transitions = s.transitions.map((t, i) => {
      const at = `${where}.transitions[${i}]`;
      if (!EVENT.test(t.event)) throw invalidArgument(`${at}.event`, `'${t.event.slice(0, 40)}' must be 1-128 of letters, digits and '_.:-'`);
      if (!names.has(t.to)) throw invalidArgument(`${at}.to`, `names '${t.to}', which is not a state of the definition`);
      return {
        event: t.event,
        to: t.to,
        guard: checkCondition(t.guard, GUARD_ROOTS, `${at}.guard`),
        action: t.action ? workPlan(t.action, `${at}.action`, limits) : null,
      };
    });
    return { name: s.name, terminal: s.terminal, transitions };
  });
  const initial = def.initial.trim();
  const byName = new Map(states.map((s) => [s.name, s]));
  if (!byName.has(initial))
    throw invalidArgument(
      "definition.initial",
      initial === "" ? "is required: the state a machine starts in" : `names '${initial}', which is not a state of the definition`,
    );
  if (byName.get(initial)!.terminal) throw invalidArgument("definition.initial", `'${initial}' is terminal: the machine would end as it starts`);
  const seen = reachable(initial, (name) => byName.get(name)!.transitions.map((t) => t.to));
  if (![...seen].some((name) => byName.get(name)!.terminal))
    throw invalidArgument("definition", `no terminal state is reachable from the initial state '${initial}': the machine could never end`);
  return { definitionId, initial, states };
}
