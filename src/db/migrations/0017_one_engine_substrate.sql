-- One substrate for the daemon's three engines (src/engines/substrate.ts): the DAG engine's own
-- event table, definitions table and item-ended trigger (migration 0010) fold into the ones the
-- graph and state-machine engines share (migration 0012), and every engine's notifications take
-- one convention on one channel: the bare run id (an event to apply) and r<run id> (a save, for
-- watchers). Rows move in this transaction, so no event and no definition is lost or doubled.

-- The events: what the DAG's timeouts need joins the shared table (a timeout names an attempt and
-- comes due later; it has no work item and no status).
ALTER TABLE {{table:engine_event}}
  -- The DAG's attempt (aiflow_task.id) the event ends; null for graph and machine events.
  ADD COLUMN task_id text,
  -- 'item' (its work item ended) or 'timeout' (an attempt's deadline came due).
  ADD COLUMN kind text NOT NULL DEFAULT 'item',
  ADD COLUMN dispatched_at bigint,
  ADD COLUMN ended_at bigint,
  -- Epoch ns the event may be applied from; null: at once.
  ADD COLUMN due_at bigint,
  ALTER COLUMN work_item_id DROP NOT NULL,
  ALTER COLUMN status DROP NOT NULL;

INSERT INTO {{table:engine_event}} (engine_kind, run_id, task_id, kind, work_item_id, status, agent, result, error, dispatched_at, ended_at, due_at)
SELECT 'dag', run_id, task_id, kind, work_item_id, status, agent, result, error, dispatched_at, ended_at, due_at
  FROM {{table:dag_event}} ORDER BY id;

-- An advance looks for runs of one engine with events due now; most are due at once (null).
CREATE INDEX {{name:engine_event_due_idx}} ON {{table:engine_event}} (engine_kind, (COALESCE(due_at, 0)), run_id);

-- The definitions: a DAG definition is one more engine kind.
INSERT INTO {{table:engine_definition}} (id, tenant_key, engine_kind, definition_id, body, createdby, createdon, updatedby, updatedon, deletedby, deletedon)
SELECT id, tenant_key, 'dag', definition_id, body, createdby, createdon, updatedby, updatedon, deletedby, deletedon
  FROM {{table:dag_definition}};

-- One item-ended trigger: a work item of a run reaching completed, failed (for good) or cancelled
-- records an event for the run that waits on it, in the transaction that ended it, and tells the
-- daemons (NOTIFY, sent at commit; one per run per transaction). Whose the item is follows from its
-- task_id: graph:<step> and machine:<transition> are those engines' (and only the item the run waits
-- on counts); any other task_id is a DAG attempt's when its aiflow_task row exists (a producer's own
-- run_id and task_id name no such row, and record nothing).
CREATE FUNCTION {{schema}}.{{name:engine_item_ended}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.task_id LIKE 'graph:%' THEN
    INSERT INTO {{table:engine_event}} (engine_kind, run_id, work_item_id, status, agent, result, error)
    SELECT 'graph', NEW.run_id, NEW.id, NEW.status, NEW.agent_id, NEW.result, NEW.error
      FROM {{table:graph_run}} g WHERE g.run_id = NEW.run_id AND g.work_item_id = NEW.id;
  ELSIF NEW.task_id LIKE 'machine:%' THEN
    INSERT INTO {{table:engine_event}} (engine_kind, run_id, work_item_id, status, agent, result, error)
    SELECT 'statemachine', NEW.run_id, NEW.id, NEW.status, NEW.agent_id, NEW.result, NEW.error
      FROM {{table:machine_run}} m WHERE m.run_id = NEW.run_id AND m.work_item_id = NEW.id;
  ELSE
    INSERT INTO {{table:engine_event}} (engine_kind, run_id, task_id, work_item_id, status, agent, result, error, dispatched_at, ended_at)
    SELECT 'dag', NEW.run_id, NEW.task_id, NEW.id, NEW.status, NEW.agent_id, NEW.result, NEW.error, NEW.dispatched_at, NEW.completed_at
      FROM {{table:task}} t WHERE t.id = NEW.task_id AND t.runid = NEW.run_id;
  END IF;
  IF FOUND THEN
    PERFORM pg_notify({{channel:engines}}, NEW.run_id);
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER {{name:work_item_engine_ended}} AFTER UPDATE OF status ON {{table:work_item}} FOR EACH ROW
  WHEN (NEW.task_id IS NOT NULL AND NEW.run_id IS NOT NULL AND NEW.status IN ('completed', 'failed', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION {{schema}}.{{name:engine_item_ended}}();

DROP TRIGGER {{name:work_item_dag_ended}} ON {{table:work_item}};
DROP TRIGGER {{name:work_item_native_ended}} ON {{table:work_item}};
DROP FUNCTION {{schema}}.{{name:dag_item_ended}}();
DROP FUNCTION {{schema}}.{{name:native_item_ended}}();
DROP TABLE {{table:dag_event}};
DROP TABLE {{table:dag_definition}};
