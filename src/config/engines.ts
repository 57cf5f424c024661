/**
 * The engines: DAG definitions' bounds and how much of a run's history is kept.
 */
import { int, type Setting } from "./parsers.js";

export const ENGINES_SETTINGS = {
  dagMaxNodes: {
    flag: "--dag-max-nodes",
    env: ["AIFLOW_DAG_MAX_NODES"],
    default: "10000",
    help: "most nodes a DAG definition may have",
    parse: int(1, 1_000_000),
  },
  dagMaxDefinitionBytes: {
    flag: "--dag-max-definition-bytes",
    env: ["AIFLOW_DAG_MAX_DEFINITION_BYTES"],
    default: "4194304",
    help: "largest DAG definition accepted (its JSON)",
    parse: int(1024),
  },
  dagMaxFanOut: {
    flag: "--dag-max-fan-out",
    env: ["AIFLOW_DAG_MAX_FAN_OUT"],
    default: "100000",
    help: "most iterations one fan-out node may have",
    parse: int(1, 10_000_000),
  },
  runHistoryMax: {
    flag: "--run-history-max",
    env: ["AIFLOW_RUN_HISTORY_MAX"],
    default: "1000",
    help: "entries a graph run's path and a state machine's history keep (the latest); older ones are dropped and counted (path_dropped, history_dropped)",
    parse: int(1, 1_000_000),
  },
} satisfies Record<string, Setting<unknown>>;
