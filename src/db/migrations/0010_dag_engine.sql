-- The DAG engine's tables (lib-guppi in the entity reference): aiflow_run, aiflow_task and
-- aiflow_checkpoint as the reference defines them, and two of the engine's own: stored definitions
-- and the run events an advance consumes.

CREATE TABLE {{table:run}} (
  id           text PRIMARY KEY,
  definitionid text NOT NULL,
  runtype      text NOT NULL,
  -- The run's shared data: the starting context, and each finished node's result under its name.
  context      jsonb,
  -- tenantKey, the plan (the definition as started), per-node state (the task list), affinityKey,
  -- idempotencyKey, and events signalled before their wait node was reached (pendingEvents).
  metadata     jsonb,
  -- [{state, at (epoch ns), by, reason?}]: the last entry is the current state.
  states       jsonb,
  starttime    bigint,
  endtime      bigint,
  duration     bigint,
  createdby    text NOT NULL,
  createdon    timestamptz NOT NULL,
  updatedby    text,
  updatedon    timestamptz,
  deletedby    text,
  deletedon    timestamptz
);
CREATE INDEX {{name:run_owner_recent_idx}} ON {{table:run}} (createdby, createdon);
CREATE INDEX {{name:run_definition_idx}} ON {{table:run}} (definitionid);
-- StartRun's idempotency key: one run per (caller, tenant, key); the unique index settles a race.
CREATE UNIQUE INDEX {{name:run_idempotency_uq}} ON {{table:run}} (createdby, (metadata ->> 'tenantKey'), (metadata ->> 'idempotencyKey'))
  WHERE metadata ? 'idempotencyKey';

CREATE TABLE {{table:task}} (
  id           text PRIMARY KEY,
  -- The node name; an iteration of a fan-out node is <node>[<index>].
  name         text NOT NULL,
  definitionid text NOT NULL,
  runid        text NOT NULL,
  -- The agent NAME that ran it (never its ULID).
  workerid     text,
  -- Its result (or the signal's payload, for a wait node).
  context      jsonb,
  -- node, iteration, attempt, workItemId, kind, error.
  metadata     jsonb,
  -- [{state, at (epoch ns), agent?, error?}]: the last entry is the current state.
  states       jsonb,
  starttime    bigint,
  endtime      bigint,
  duration     bigint,
  resumedata   jsonb,
  createdby    text NOT NULL,
  createdon    timestamptz NOT NULL,
  updatedby    text,
  updatedon    timestamptz,
  deletedby    text,
  deletedon    timestamptz
);
CREATE INDEX {{name:task_run_node_idx}} ON {{table:task}} (runid, name);
CREATE INDEX {{name:task_definition_idx}} ON {{table:task}} (definitionid);

CREATE TABLE {{table:checkpoint}} (
  id            text PRIMARY KEY,
  run_id        text NOT NULL,
  node_name     text NOT NULL,
  definition_id text,
  iterator_type text,
  -- The indices of the finished iterations, as ranges ("0-41,43-99").
  cursor        text,
  idx           bigint,
  total         bigint,
  done          boolean,
  updated_at    bigint,
  createdby     text NOT NULL,
  createdon     timestamptz NOT NULL,
  updatedby     text,
  updatedon     timestamptz,
  deletedby     text,
  deletedon     timestamptz,
  CONSTRAINT {{name:checkpoint_run_node_uq}} UNIQUE (run_id, node_name)
);

CREATE TABLE {{table:dag_definition}} (
  id            text PRIMARY KEY,
  tenant_key    text NOT NULL,
  definition_id text NOT NULL,
  -- The definition as protobuf JSON.
  body          jsonb NOT NULL,
  createdby     text NOT NULL,
  createdon     timestamptz NOT NULL,
  updatedby     text,
  updatedon     timestamptz,
  deletedby     text,
  deletedon     timestamptz,
  CONSTRAINT {{name:dag_definition_tenant_id_uq}} UNIQUE (tenant_key, definition_id)
);

-- What an advance of a run consumes: a node's work item ended (written by the trigger below, in
-- the transaction that ended it), or a node's timeout came due. An advance deletes the events it
-- applied in the transaction that applies them, so an event is applied exactly once: a daemon
-- that dies before committing leaves the events for the next advance, and one that commits has
-- removed them.
CREATE TABLE {{table:dag_event}} (
  id            bigserial PRIMARY KEY,
  run_id        text NOT NULL,
  task_id       text NOT NULL,
  -- 'item' (its work item ended) or 'timeout'.
  kind          text NOT NULL,
  work_item_id  text,
  status        text,
  agent         text,
  result        jsonb,
  error         text,
  dispatched_at bigint,
  ended_at      bigint,
  -- Epoch ns the event may be applied from; null: at once.
  due_at        bigint
);
CREATE INDEX {{name:dag_event_due_idx}} ON {{table:dag_event}} ((COALESCE(due_at, 0)), run_id);
CREATE INDEX {{name:dag_event_run_idx}} ON {{table:dag_event}} (run_id);

-- A node's work item reaching completed, failed (for good) or cancelled records an event for its
-- run in the same transaction, and tells the daemons (NOTIFY, sent at commit; one per run per
-- transaction). Only items whose task row exists are the engine's: a producer's own run_id and
-- task_id name no aiflow_task row.
CREATE FUNCTION {{schema}}.{{name:dag_item_ended}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO {{table:dag_event}} (run_id, task_id, kind, work_item_id, status, agent, result, error, dispatched_at, ended_at)
  SELECT NEW.run_id, NEW.task_id, 'item', NEW.id, NEW.status, NEW.agent_id, NEW.result, NEW.error, NEW.dispatched_at, NEW.completed_at
    FROM {{table:task}} t WHERE t.id = NEW.task_id AND t.runid = NEW.run_id;
  IF FOUND THEN
    PERFORM pg_notify({{channel:dag}}, 'e' || NEW.run_id);
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER {{name:work_item_dag_ended}} AFTER UPDATE OF status ON {{table:work_item}} FOR EACH ROW
  WHEN (NEW.task_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.status IN ('completed', 'failed', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION {{schema}}.{{name:dag_item_ended}}();
