/**
 * The daemon's own engines, by the name every table and message gives them (aiflow_engine_run,
 * aiflow_engine_definition, aiflow_engine_event, a trigger's engine_kind), with the service that
 * starts and drives their runs. A new engine is a folder under src/engines/ that implements the
 * Engine interface (src/engines/engine.ts) and one entry here.
 */
export const ENGINE_SERVICES = { dag: "DagService", graph: "GraphService", statemachine: "MachineService" } as const;

export type EngineKind = keyof typeof ENGINE_SERVICES;

export const ENGINE_KINDS = Object.keys(ENGINE_SERVICES) as readonly EngineKind[];

export const isEngineKind = (kind: string): kind is EngineKind => Object.hasOwn(ENGINE_SERVICES, kind);
