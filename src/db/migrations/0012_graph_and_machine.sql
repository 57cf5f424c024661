-- The graph and state-machine engines' tables (lib-guppi in the entity reference): aiflow_graph_run
-- and aiflow_machine_run with the reference's columns, each followed by the engine's own (its
-- tenant, the definition as the run started, the current step's work item); both engines' stored
-- definitions; and the events an advance consumes. Neither run table is audited or carries an
-- access block: callers reach them through GraphService and MachineService.

CREATE TABLE {{table:graph_run}} (
  id            text PRIMARY KEY,
  run_id        text NOT NULL,
  definition_id text NOT NULL,
  -- The current node.
  task          text,
  steps         bigint,
  -- JSON text: the nodes walked, in order.
  path          text,
  -- JSON text: {node: times run}.
  run_counts    text,
  -- JSON text: the run's data, each node's latest result under its name.
  state         text,
  status        text,
  reason        text,
  error         text,
  -- The engine's own.
  tenant_key    text NOT NULL,
  plan          jsonb NOT NULL,
  work_item_id  text,
  createdby     text NOT NULL,
  createdon     timestamptz NOT NULL,
  updatedby     text,
  updatedon     timestamptz,
  deletedby     text,
  deletedon     timestamptz,
  CONSTRAINT {{name:graph_run_runid_uq}} UNIQUE (run_id)
);
CREATE INDEX {{name:graph_run_owner_recent_idx}} ON {{table:graph_run}} (createdby, tenant_key, createdon DESC, id DESC);

CREATE TABLE {{table:machine_run}} (
  id            text PRIMARY KEY,
  run_id        text NOT NULL,
  definition_id text NOT NULL,
  state         text,
  -- JSON text: the machine's data.
  context       text,
  -- JSON text: the states visited, in order.
  history       text,
  live          boolean,
  suspended     boolean,
  failure       text,
  reason        text,
  -- The engine's own: and while suspended, the transition under way ({event, to}).
  tenant_key    text NOT NULL,
  plan          jsonb NOT NULL,
  work_item_id  text,
  pending       jsonb,
  createdby     text NOT NULL,
  createdon     timestamptz NOT NULL,
  updatedby     text,
  updatedon     timestamptz,
  deletedby     text,
  deletedon     timestamptz,
  CONSTRAINT {{name:machine_run_runid_uq}} UNIQUE (run_id)
);
CREATE INDEX {{name:machine_run_owner_recent_idx}} ON {{table:machine_run}} (createdby, tenant_key, createdon DESC, id DESC);

-- Definitions stored by GraphService and MachineService (engine_kind graph or statemachine).
CREATE TABLE {{table:engine_definition}} (
  id            text PRIMARY KEY,
  tenant_key    text NOT NULL,
  engine_kind   text NOT NULL,
  definition_id text NOT NULL,
  -- The definition as protobuf JSON.
  body          jsonb NOT NULL,
  createdby     text NOT NULL,
  createdon     timestamptz NOT NULL,
  updatedby     text,
  updatedon     timestamptz,
  deletedby     text,
  deletedon     timestamptz,
  CONSTRAINT {{name:engine_definition_uq}} UNIQUE (tenant_key, engine_kind, definition_id)
);

-- A graph step's or a machine action's work item ended: written by the trigger below in the
-- transaction that ended it, deleted by the advance that applies it in the transaction that
-- applies it. So an outcome is applied exactly once, across daemons and crashes.
CREATE TABLE {{table:engine_event}} (
  id            bigserial PRIMARY KEY,
  engine_kind   text NOT NULL,
  run_id        text NOT NULL,
  work_item_id  text NOT NULL,
  status        text NOT NULL,
  agent         text,
  result        jsonb,
  error         text
);
CREATE INDEX {{name:engine_event_run_idx}} ON {{table:engine_event}} (engine_kind, run_id, id);

-- Items of these engines carry task_id graph:<step> or machine:<transition>; only the item a run
-- is waiting on (its work_item_id) records an event.
CREATE FUNCTION {{schema}}.{{name:native_item_ended}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.task_id LIKE 'graph:%' THEN
    INSERT INTO {{table:engine_event}} (engine_kind, run_id, work_item_id, status, agent, result, error)
    SELECT 'graph', NEW.run_id, NEW.id, NEW.status, NEW.agent_id, NEW.result, NEW.error
      FROM {{table:graph_run}} g WHERE g.run_id = NEW.run_id AND g.work_item_id = NEW.id;
  ELSE
    INSERT INTO {{table:engine_event}} (engine_kind, run_id, work_item_id, status, agent, result, error)
    SELECT 'statemachine', NEW.run_id, NEW.id, NEW.status, NEW.agent_id, NEW.result, NEW.error
      FROM {{table:machine_run}} m WHERE m.run_id = NEW.run_id AND m.work_item_id = NEW.id;
  END IF;
  IF FOUND THEN
    PERFORM pg_notify({{channel:engines}}, NEW.run_id);
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER {{name:work_item_native_ended}} AFTER UPDATE OF status ON {{table:work_item}} FOR EACH ROW
  WHEN ((NEW.task_id LIKE 'graph:%' OR NEW.task_id LIKE 'machine:%') AND NEW.run_id IS NOT NULL
        AND NEW.status IN ('completed', 'failed', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION {{schema}}.{{name:native_item_ended}}();
