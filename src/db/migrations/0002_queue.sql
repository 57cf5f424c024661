-- Work queue additions beyond the entity reference's columns (all nullable, so the table contract holds):
--   lease_token      the fencing token of the current dispatch; a new one on every dispatch, cleared on
--                    release. Complete/Fail/ExtendLease must present it.
--   result           what a completion reported, for the producer to read back (JSON).
--   idempotency_key  the producer's key: the same (tenant, key) enqueued twice yields the first item.
ALTER TABLE {{table:work_item}}
  ADD COLUMN lease_token text,
  ADD COLUMN result jsonb,
  ADD COLUMN idempotency_key text;

CREATE UNIQUE INDEX {{name:work_item_idempotency_uq}} ON {{table:work_item}} (tenant_key, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- The claim scans pending items in dispatch order; a partial index keeps that scan to pending rows only.
CREATE INDEX {{name:work_item_pending_idx}} ON {{table:work_item}} (priority, createdon, id) WHERE status = 'pending';
-- Items whose backoff or not-before passes wake waiting claims; this finds them.
CREATE INDEX {{name:work_item_due_idx}} ON {{table:work_item}} (next_attempt_at) WHERE status = 'pending';
-- An agent's dispatched items (release when it goes inactive, drain progress).
CREATE INDEX {{name:work_item_agent_idx}} ON {{table:work_item}} (agent_id) WHERE status = 'dispatched';
