-- Every status change rewrites a work item's index entries, so each index is a cost on the hot
-- path. Partial indexes are only written for rows that match them:
--   * the claim index (the spec's status_priority_idx) only needs pending rows, in dispatch order;
--     it replaces 0002's pending_idx, which indexed the same rows;
--   * the run and parent walks only need rows that have a run or a parent.
DROP INDEX {{schema}}.{{name:work_item_status_priority_idx}};
CREATE INDEX {{name:work_item_status_priority_idx}} ON {{table:work_item}} (priority, createdon, id) WHERE status = 'pending';
DROP INDEX {{schema}}.{{name:work_item_pending_idx}};

DROP INDEX {{schema}}.{{name:work_item_run_idx}};
CREATE INDEX {{name:work_item_run_idx}} ON {{table:work_item}} (run_id) WHERE run_id IS NOT NULL;
DROP INDEX {{schema}}.{{name:work_item_parent_idx}};
CREATE INDEX {{name:work_item_parent_idx}} ON {{table:work_item}} (parent_work_item_id) WHERE parent_work_item_id IS NOT NULL;
